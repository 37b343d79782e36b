"""A real JupyterHub running gpu-slurm on the session's private Slurm cluster: its config and helpers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from hub import BASE_HUB_CONFIG, Hub

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2, 4],
     "default_gpus": 1, "default": True, "slurm": {"time": "30"}},
    {"slug": "h100", "display_name": "H100", "gpu_models": ["h100"], "gpu_counts": [1]},
]
ONE_A100 = {"profile": "gpu", "gpus": 1, "gpu_model": "a100"}

SLURM_HUB_CONFIG = BASE_HUB_CONFIG + """
c.JupyterHub.spawner_class = "gpuspawner.backends.slurm.spawner.GPUSlurmSpawner"
c.GPUSlurmSpawner.exec_prefix = ""  # the hub runs as root here; jobs run as root too
c.GPUSlurmSpawner.home_dir_template = settings["dir"] + "/users/{username}"
c.GPUSlurmSpawner.startup_poll_interval = 0.5
c.Spawner.cmd = ["jupyterhub-singleuser"]
c.Spawner.args = ["--allow-root"]
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 60
# sbatch, squeue and scancel run with the server's environment: the private cluster's SLURM_CONF goes with it
# (and the stand-in NVML's library and device file, for the servers' GPU monitor)
c.Spawner.env_keep = ["PATH", "PYTHONPATH", "LANG", "SLURM_CONF", "LD_LIBRARY_PATH", "FAKENVML_CONFIG"]
c.GPUSpawnerMixin.gpu_inventory_ttl = 0.5
c.GPUSpawnerMixin.gpu_profiles = settings["profiles"]
c.GPUSpawnerMixin.gpu_quota_per_user = 4
c.JupyterHub.allow_named_servers = True
"""

#: the GPU overview and notebook jobs (gpuspawner.hub.setup.configure), read with the tests' token, and
#: the hub's reconciliation with Slurm every 2 seconds
OVERVIEW_CONFIG = """
from gpuspawner.hub.setup import configure
configure(c)
c.JupyterHub.load_roles[0]["scopes"].append("custom:gpus:read")
c.GPUSpawnerMixin.gpu_reconcile_interval = 2
"""


@contextmanager
def running_hub(directory: Path, cluster, gpus: dict, extra_config: str = "",
                profiles: list[dict] | None = None) -> Iterator[Hub]:
    """A started hub on ``cluster`` (config: SLURM_HUB_CONFIG + ``extra_config``), stopped by pid
    afterwards, with every job left on the cluster cancelled."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "jupyterhub_config.py"
    config.write_text(SLURM_HUB_CONFIG + extra_config)
    hub = Hub(directory, {**gpus["env"], "SLURM_CONF": str(cluster.conf)}, profiles or PROFILES,
              config_file=config)
    hub.start()
    try:
        yield hub
    finally:
        hub.close()
        cluster.cancel_all()


def add_user(hub: Hub, name: str) -> None:
    hub.add_users(name)
    (hub.dir / "users" / name).mkdir(parents=True, exist_ok=True)


def job_id(hub: Hub, name: str) -> str:
    return str(hub.user(name)["servers"][""]["state"]["job_id"])


def job_gpus(cluster, job: str) -> list[int]:
    """The node's GPUs (gres.conf order) Slurm allocated to ``job``: ``GRES=gpu:a100:1(IDX:1)``."""
    detail = cluster.run("scontrol", "show", "job", "-d", job).stdout
    found = re.search(r"GRES=\S*\(IDX:([0-9,-]+)\)", detail)
    assert found, detail
    indexes = []
    for part in found.group(1).split(","):
        first, _, last = part.partition("-")
        indexes += range(int(first), int(last or first) + 1)
    return indexes


def charged(hub: Hub) -> dict[str, int]:
    """owner -> the GPUs the hub charges it (``/hub/api/gpus``: the cluster's charges)."""
    r = hub.api("GET", "/gpus")
    assert r.ok, r.text
    return {entry["owner"]: entry["gpus"] for entry in r.json()["cluster"]}


def monitor_uuids(hub: Hub, name: str) -> list[str]:
    """The GPUs the GPU monitor of ``name``'s server lists (its ``api/gpus``)."""
    r = requests.get(f"{hub.url}/user/{name}/api/gpus", headers={"Authorization": f"token {hub.token}"},
                     timeout=60)
    assert r.ok, r.text
    return [gpu["uuid"] for gpu in r.json()["gpus"]]
