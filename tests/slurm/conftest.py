"""One private Slurm cluster (slurmctld, slurmd, munged) per test session, stopped by pid."""

from __future__ import annotations

import pytest

import fakenvml
from gpuspawner.backends.local.fence import DEVICES_MOUNT
from gpuspawner.backends.slurm.dev import SlurmCluster, cannot_start, devices_constrainable
from hub import passable
from needs import missing


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-node cluster with GPUs ``gpu:a100:2,gpu:t4:2`` on device files ``c 195 0..3``,
    each job confined to its GPUs' device files (``ConstrainDevices=yes``, cgroup v1)."""
    why = cannot_start()
    if why:
        missing(why)
    if not devices_constrainable():
        missing(f"Slurm's ConstrainDevices needs the cgroup v1 devices controller at {DEVICES_MOUNT}")
    # users' own Slurm commands (accounts submitting their jobs) read its slurm.conf and reach its munged
    cluster = SlurmCluster(passable(tmp_path_factory.mktemp("slurm")), {"a100": 2, "t4": 2}, constrain_devices=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

#: the name NVML gives each GRES type's GPUs
NVML_NAMES = {"a100": "NVIDIA A100-SXM4-80GB", "t4": "Tesla T4"}


@pytest.fixture(scope="session")
def slurm_gpus(slurm_cluster, fakenvml_libdir, tmp_path_factory) -> dict:
    """The stand-in NVML's view of the cluster's node: its GPUs in gres.conf's order, each on its
    device file (minor number = position), so NVML's index N is Slurm's GPU N and a job's device
    cgroup refuses the other GPUs' handles. ``{"env": ..., "uuids": [...]}``."""
    devices = [fakenvml.make_device(minor, NVML_NAMES[model], minor_number=minor, device_node=str(node))
               for minor, (model, node) in enumerate(zip(slurm_cluster.models(), slurm_cluster.device_nodes(),
                                                         strict=True))]
    path = tmp_path_factory.mktemp("slurm-nvml") / "gpus.json"
    fakenvml.write_config(path, {"devices": devices})
    return {"env": fakenvml.env(fakenvml_libdir, path), "uuids": [d["uuid"] for d in devices]}
