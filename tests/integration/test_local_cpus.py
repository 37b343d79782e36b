"""gpu-local on the stand-in's example layouts: each server runs on the CPUs next to its GPUs
(``pin_cpus``, via taskset), and an NVLink profile gets linked GPUs or a sentence.

The hub reads the stand-in's cube-mesh layout: NUMA node 0 (GPUs 0-3) with
CPU 0, node 1 (GPUs 4-7) with CPU 1, so that it runs on this 2-CPU machine.
The kernel's view of the server process (/proc/PID/status Cpus_allowed_list)
must be its GPUs' CPU; where the layout names CPUs this machine lacks, the
server runs unpinned and the hub's log says why.
"""

from __future__ import annotations

import os

import pytest

import fakenvml
from hub import Hub

pytestmark = pytest.mark.integration

PROFILES = [
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"],
     "gpu_counts": [1, 2, 4], "default_gpus": 1, "default": True},
    {"slug": "linked", "display_name": "NVLink pair", "gpu_counts": [2], "default_gpus": 2, "interconnect": "nvlink"},
]
FOUR = {"profile": "gpu", "gpus": 4, "gpu_model": "any"}


def cpus_allowed(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("Cpus_allowed_list:"))


def running_hub(tmp_path, libdir, numa_cpus, layout="cube-mesh-8") -> Hub:
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, fakenvml.layout(layout, numa_cpus=numa_cpus))
    hub = Hub(tmp_path / "hub", fakenvml.env(libdir, config_path), PROFILES)
    hub.start()
    return hub


def server_pid(hub: Hub, name: str) -> int:
    r = hub.spawn(name, FOUR)
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()}"
    hub.wait_ready(name)
    hub.server_env(name)  # records the pid for cleanup
    return hub.user(name)["servers"][""]["state"]["pid"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs CPUs 0 and 1 (the layout's two NUMA nodes)")
def test_servers_run_on_their_gpus_numa_cpus(tmp_path, fakenvml_libdir):
    hub = running_hub(tmp_path, fakenvml_libdir, ("0", "1"))
    try:
        hub.add_users("alice", "bob")
        assert cpus_allowed(server_pid(hub, "alice")) == "0"  # GPUs 0-3: NUMA node 0
        assert cpus_allowed(server_pid(hub, "bob")) == "1"  # GPUs 4-7: NUMA node 1
        log = hub.log_path.read_text(errors="replace")
        assert "CPUs 0, next to the GPUs" in log and "CPUs 1, next to the GPUs" in log
    finally:
        hub.close()


def test_cpus_the_machine_lacks_leave_the_server_unpinned(tmp_path, fakenvml_libdir):
    hub = running_hub(tmp_path, fakenvml_libdir, ("1000-1003", "1004-1007"))
    try:
        hub.add_users("carol")
        mine = cpus_allowed(os.getpid())
        assert cpus_allowed(server_pid(hub, "carol")) == mine
        assert "the GPUs' NUMA-local CPUs 1000-1003 do not exist here" in hub.log_path.read_text(errors="replace")
    finally:
        hub.close()


def test_nvlink_profile_on_a_pcie_host_is_refused_with_a_sentence(tmp_path, fakenvml_libdir):
    hub = running_hub(tmp_path, fakenvml_libdir, ("0", "1"), layout="pcie-2socket-8")
    try:
        hub.add_users("dave")
        r = hub.spawn("dave", {"profile": "linked", "gpus": 2, "gpu_model": "any"})
        assert r.status_code == 409, r.text
        assert r.json()["message"] == (
            "2 GPUs joined by NVLink were requested, but no machine here has 2 GPUs joined by NVLink. "
            "Pick a profile without the NVLink requirement."
        )
        assert hub.user("dave")["servers"] == {}
    finally:
        hub.close()
