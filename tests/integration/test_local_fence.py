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

The same cgroups end a server: a process a notebook hid (double fork, a session
of its own, an empty environment) is killed when the server stops, before its GPU
goes to the next user. One the kernel will not let die (here: held in a frozen
freezer cgroup, as a process stuck in a driver call) keeps the GPU out of service,
shown on /hub/api/gpus and /hub/gpus with the reason, and the server is refused a
new start; once it is gone the GPU goes back into service.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import pytest
import requests

import devcgroup
import fakenvml
from gpuspawner.backends.local.fence import DEVICES_MOUNT, detect
from gpuspawner.simulation import simulated_config
from hub import Hub, login, pid_alive
from kernels import execute, start_kernel
from needs import missing
from ops_hub import OpsHub

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
        node.chmod(0o666)  # every user may open it as far as permissions go: the fence decides
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


# In a notebook: start devcgroup.ESCAPER on the GPU node, wait for its first look, print "pid what-it-got".
HIDE = """
import os, subprocess, sys, time
status = os.path.abspath("hidden-{tag}.status")
subprocess.run([sys.executable, "-c", {escaper!r}, {node!r}, status], check=True, capture_output=True)
for _ in range(200):
    if os.path.exists(status):
        break
    time.sleep(0.05)
print(open(status).read())
"""


def hide_a_process(hub: Hub, user: str, node: str) -> tuple[int, str]:
    """A notebook of ``user`` starts a process that hides from all but its cgroup: (its pid, what opening
    ``node`` gave it)."""
    server_url = f"{hub.url}/user/{user}/"
    kernel = start_kernel(server_url, hub.token)
    printed = execute(server_url, hub.token, kernel, HIDE.format(tag=user, escaper=devcgroup.ESCAPER, node=node))
    pid, got = printed.split()
    return int(pid), got


def holder_of(hub: OpsHub, uuid: str) -> dict | None:
    return next(g["holder"] for g in hub.overview().json()["gpus"] if g["uuid"] == uuid)


def test_a_stopped_server_leaves_nothing_behind_and_its_gpu_waits_for_that(tmp_path, fakenvml_libdir, fenced_host):
    config = simulated_config(a100=1, t4=0)
    [node] = devcgroup.gpu_nodes(tmp_path / "dev", [0])
    config["devices"][0].update(minor_number=0, device_node=str(node))
    gpu = config["devices"][0]["uuid"]
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, devices=config,
                 mixin={"fence_end_timeout": 2.0, "fence_retry_interval": 0.5})
    one = {"profile": "gpu", "gpus": 1, "gpu_model": "any"}
    hub.start()
    hidden: list[int] = []
    try:
        hub.add_users("ada", "bob", "cyd")
        assert hub.spawn("ada", one).status_code in (201, 202)
        hub.wait_ready("ada")
        pid, got = hide_a_process(hub, "ada", str(node))
        hidden.append(pid)
        assert got == "ENXIO"  # its own GPU: the kernel lets it through (no driver behind the node)
        assert hub.spawn("bob", one).status_code == 409  # the only GPU is ada's

        hub.stop_server("ada")
        assert not pid_alive(pid), "ada's hidden process outlived her server"
        assert hub.spawn("bob", one).status_code in (201, 202)  # the GPU goes on only now
        hub.wait_ready("bob")
        assert hub.server_env("bob")["CUDA_VISIBLE_DEVICES"] == gpu

        # a process of bob's that the kernel will not let die (as one stuck in a driver call)
        stuck, got = hide_a_process(hub, "bob", str(node))
        hidden.append(stuck)
        with devcgroup.frozen(stuck) as frozen:
            hub.stop_server("bob")  # after fence_end_timeout: JupyterHub has no "could not stop"
            assert pid_alive(stuck)
            holder = holder_of(hub, gpu)
            assert holder is not None and holder["state"] == "out of service", holder
            assert (holder["user"], holder["server"], holder["kind"]) == ("bob", "", "server")
            assert f"pid {stuck} " in holder["problem"] and "uninterruptible sleep" in holder["problem"]
            page = login(hub, "boss").get(hub.url + "/hub/gpus")  # the admin's page
            assert page.status_code == 200 and "out of service" in page.text and f"pid {stuck} " in page.text
            refused = hub.spawn("cyd", one)
            assert refused.status_code == 409 and "0 of 1 free" in refused.json()["message"], refused.text
            again = hub.spawn("bob", one)
            assert again.status_code == 409, again.text
            assert "cannot start yet" in again.json()["message"] and f"pid {stuck} " in again.json()["message"]
            assert hub.user("bob")["servers"] == {}

            devcgroup.thaw(frozen)  # it comes back from the kernel to its SIGKILL; the hub's retry sees it gone
            deadline = time.monotonic() + 30
            while holder_of(hub, gpu) is not None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert holder_of(hub, gpu) is None, hub.log()
        assert not pid_alive(stuck)
        assert hub.spawn("cyd", one).status_code in (201, 202)
        hub.wait_ready("cyd")
        assert hub.server_env("cyd")["CUDA_VISIBLE_DEVICES"] == gpu
    finally:
        for pid in hidden:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        hub.close()


def test_advisory_host_is_said_plainly(tmp_path):
    isolation = detect(mount=tmp_path / "no-devices-controller", systemd_dir=tmp_path / "no-systemd")
    assert not isolation.enforced
    assert isolation.note.startswith("GPU isolation: advisory only on this host")
    assert "CUDA_VISIBLE_DEVICES" in isolation.note


def test_fence_denies_every_gpu_but_its_own():
    from gpuspawner.backends.local.fence import deny_rules

    rules = deny_rules([3, 7])
    assert "c 195:3 rwm" not in rules and "c 195:7 rwm" not in rules
    assert "c 195:0 rwm" in rules and "c 195:253 rwm" in rules
    assert not any(r.startswith(("c 195:254", "c 195:255")) for r in rules)  # nvidia-modeset, nvidiactl
