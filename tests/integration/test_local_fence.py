"""gpu-local enforces its placement with the kernel's device controller.

A real hub (as root, on this machine's cgroup v1 ``devices`` controller)
starts a server holding one of two simulated GPUs whose device nodes the test
makes with mknod. From a kernel in that server, as a notebook would, the
server's own GPU node opens as far as the fence is concerned (ENXIO: no
driver behind it) and the other GPU's node is refused by the kernel (EPERM),
even after the notebook clears CUDA_VISIBLE_DEVICES. NVML (the real nvidia-ml-py
on the stand-in, whose GPUs name those nodes) in that kernel still counts both
GPUs but gives a handle only for the server's own; the server's GPU monitor
lists only that one. The fence outlives a hub SIGKILL for the adopted server
and goes away when the server stops.
"""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest
import requests

import fakenvml
from gpuspawner.fence import DEVICES_MOUNT, detect
from gpuspawner.simulation import simulated_config
from hub import Hub
from kernels import execute, start_kernel
from needs import missing

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "One GPU", "gpu_models": ["any"], "gpu_counts": [1],
             "default_gpus": 1, "default": True}]

PROBE = """
import errno, os
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
for node in {nodes!r}:
    try:
        os.close(os.open(node, os.O_RDWR))
        print(node, "opened")
    except OSError as e:
        print(node, errno.errorcode[e.errno])
"""

# NVML as a notebook would use it, every GPU by index and by UUID: the UUID, or the error's name.
NVML_PROBE = """
import json, os
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
import pynvml

def uuid_of(get, key):
    try:
        return pynvml.nvmlDeviceGetUUID(get(key))
    except pynvml.NVMLError as e:
        return type(e).__name__

pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
print(json.dumps({{
    "count": count,
    "by_index": [uuid_of(pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)],
    "by_uuid": {{u: uuid_of(pynvml.nvmlDeviceGetHandleByUUID, u) for u in {uuids!r}}},
}}))
pynvml.nvmlShutdown()
"""


@pytest.fixture
def fenced_host():
    if os.geteuid() != 0:
        missing("device cgroups need root (the hub creates them)")
    if not detect().enforced:
        missing(f"no writable cgroup v1 devices controller at {DEVICES_MOUNT}: {detect().note}")


def test_a_server_can_open_only_its_own_gpu_node(tmp_path, fakenvml_libdir, fenced_host):
    config = simulated_config(a100=2, t4=0)
    dev = tmp_path / "dev"
    dev.mkdir()
    nodes = {}
    for minor, device in enumerate(config["devices"]):
        device["minor_number"] = minor
        node = dev / f"nvidia{minor}"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(195, device["minor_number"]))
        nodes[device["uuid"]] = device["device_node"] = str(node)  # the stand-in opens it for a handle
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, config)
    hub_id = "fence-" + os.urandom(4).hex()
    hub = Hub(tmp_path / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES,
              extra_config=f"c.GPUSpawnerMixin.gpu_hub_id = {hub_id!r}\n")
    fences = DEVICES_MOUNT / "gpuspawner" / hub_id
    hub.start()
    try:
        hub.add_users("ada")
        r = hub.spawn("ada", {"profile": "gpu", "gpus": 1, "gpu_model": "any"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("ada")
        env = hub.server_env("ada")
        mine = env["CUDA_VISIBLE_DEVICES"]
        other = next(u for u in nodes if u != mine)
        server_url = hub.url + "/user/ada/"
        auth = {"Authorization": f"token {hub.token}"}
        kernel = start_kernel(server_url, hub.token)

        def probe() -> dict[str, str]:
            printed = execute(server_url, hub.token, kernel, PROBE.format(nodes=[nodes[mine], nodes[other]]))
            return dict(line.split() for line in printed.strip().splitlines())

        seen = probe()
        assert seen == {nodes[mine]: "ENXIO", nodes[other]: "EPERM"}, seen

        # NVML counts both GPUs, as on a real host, but the other one's handle is refused.
        code = NVML_PROBE.format(uuids=list(nodes))
        nvml_seen = json.loads(execute(server_url, hub.token, kernel, code))
        denied = "NVMLError_NoPermission"
        assert nvml_seen == {
            "count": 2,
            "by_index": [u if u == mine else denied for u in nodes],
            "by_uuid": {mine: mine, other: denied},
        }, nvml_seen
        # The server's GPU monitor lists its own GPU only, and nothing of the other.
        sample = requests.get(server_url + "api/gpus", headers=auth, timeout=60).json()
        assert [(g["uuid"], g["na"]) for g in sample["gpus"]] == [(mine, {})], sample
        metrics = requests.get(server_url + "api/gpus/metrics", headers=auth, timeout=60).text
        assert mine in metrics and other not in json.dumps(sample) + metrics
        assert [p.name for p in fences.iterdir() if p.is_dir()] == [env["GPUSPAWNER_SPAWN"]]

        # the hub dies and comes back: the adopted server is still fenced
        hub.proc.send_signal(signal.SIGKILL)
        hub.proc.wait()
        hub._stop_proxy()
        hub.start()
        hub.wait_ready("ada")
        assert probe() == seen
        assert json.loads(execute(server_url, hub.token, kernel, code)) == nvml_seen

        hub.stop_server("ada")
        assert not (fences / env["GPUSPAWNER_SPAWN"]).exists(), "the stopped server's cgroup is gone"
        assert not fences.exists(), "and the hub's cgroup folder, now that it has no server"
    finally:
        hub.close()
        if fences.is_dir():
            for leftover in fences.iterdir():  # (the cgroup's own control files are listed too)
                if leftover.is_dir():
                    leftover.rmdir()
            fences.rmdir()


def test_advisory_host_is_said_plainly(tmp_path):
    isolation = detect(mount=tmp_path / "no-devices-controller", systemd_dir=tmp_path / "no-systemd")
    assert not isolation.enforced
    assert isolation.note.startswith("GPU isolation: advisory only on this host")
    assert "CUDA_VISIBLE_DEVICES" in isolation.note


def test_fence_denies_every_gpu_but_its_own():
    from gpuspawner.fence import deny_rules

    rules = deny_rules([3, 7])
    assert "c 195:3 rwm" not in rules and "c 195:7 rwm" not in rules
    assert "c 195:0 rwm" in rules and "c 195:253 rwm" in rules
    assert not any(r.startswith(("c 195:254", "c 195:255")) for r in rules)  # nvidia-modeset, nvidiactl
