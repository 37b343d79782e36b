"""gpu-docker pins each container to the CPUs next to its GPUs (``pin_cpus``).

The hub reads the stand-in's cube-mesh layout, whose NUMA node 0 (GPUs 0-3)
has CPU 0 and node 1 (GPUs 4-7) CPU 1, so that it runs on this 2-CPU machine.
What the engine recorded (``docker inspect``: HostConfig.CpusetCpus/CpusetMems)
and what the kernel enforces inside (the cpuset cgroup, /proc/1/status) must
both name the GPUs' CPU.
"""

from __future__ import annotations

import pytest

import fakenvml
from engine import visible_devices

pytestmark = pytest.mark.docker

FOUR = {"profile": "gpu", "gpus": 4, "gpu_model": "any"}
CPU_ONLY = {"profile": "cpu"}


def start(hub, name: str, options) -> object:
    r = hub.spawn(name, options)
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()}"
    hub.wait_ready(name, timeout=300)
    container = hub.container(name)
    container.reload()
    return container


def inside(container, command: str) -> str:
    result = container.exec_run(["sh", "-c", command])
    assert result.exit_code == 0, result.output.decode()
    return result.output.decode().strip()


def cpuset_inside(container) -> str:
    """The container's effective cpuset from its cgroup (v2 or v1 spelling)."""
    return inside(container, "cat /sys/fs/cgroup/cpuset.cpus.effective 2>/dev/null"
                             " || cat /sys/fs/cgroup/cpuset/cpuset.effective_cpus")


def test_containers_run_on_their_gpus_numa_cpus(docker_hub):
    hub = docker_hub(config=fakenvml.layout("cube-mesh-8", numa_cpus=("0", "1")))
    uuids = [d["uuid"] for d in hub.gpus]
    hub.add_users("alice", "bob", "carol")

    alice = start(hub, "alice", FOUR)
    bob = start(hub, "bob", FOUR)
    assert set(visible_devices(alice).split(",")) == set(uuids[:4])  # one all-to-all NVLink quad each
    assert set(visible_devices(bob).split(",")) == set(uuids[4:])

    assert alice.attrs["HostConfig"]["CpusetCpus"] == "0"
    assert alice.attrs["HostConfig"]["CpusetMems"] == "0"
    assert bob.attrs["HostConfig"]["CpusetCpus"] == "1"
    assert bob.attrs["HostConfig"]["CpusetMems"] == ""  # node 1 does not exist on this machine: left unset
    for container, cpu in ((alice, "0"), (bob, "1")):
        assert cpuset_inside(container) == cpu
        assert inside(container, "grep Cpus_allowed_list /proc/1/status").split()[-1] == cpu

    carol = start(hub, "carol", CPU_ONLY)  # no GPU: not pinned
    assert carol.attrs["HostConfig"]["CpusetCpus"] == ""
    log = hub.log_path.read_text(errors="replace")
    assert "CPUs 0, next to the GPUs" in log and "CPUs 1, next to the GPUs" in log
