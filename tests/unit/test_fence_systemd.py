"""The systemd scope fence: the systemd-run words gpu-local puts before a server, and when detect() picks them."""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
from types import SimpleNamespace

import pytest
from tornado.web import HTTPError

from gpuspawner.backends.local.caches import LocalCaches
from gpuspawner.backends.local.fence import Isolation, detect
from gpuspawner.backends.local.fence_starts import StartRecord
from gpuspawner.backends.local.fence_systemd import ScopeFence, device_allow, mig_nodes, scope_command, unit_name
from gpuspawner.backends.local.processes import MarkedStarts, StartFence
from gpuspawner.backends.local.spawner import _InFence, _LocalGPUs
from gpuspawner.gpu import GPU


def allowed(cmd: list[str]) -> list[str]:
    return [word.removeprefix("DeviceAllow=") for word in cmd if word.startswith("DeviceAllow=")]


def test_scope_command_allows_only_the_own_gpu_node():
    cmd = scope_command("hub1", "abc", [1], user="alice", group=1000)
    assert cmd[:2] == ["systemd-run", "--scope"] and cmd[-1] == "--"
    assert "--unit=gpuspawner-hub1-abc.scope" in cmd
    assert "--uid=alice" in cmd and "--gid=1000" in cmd
    assert cmd[cmd.index("DevicePolicy=closed") - 1] == "-p"
    nodes = allowed(cmd)
    assert "/dev/nvidia1 rw" in nodes
    assert not any(n.startswith(("/dev/nvidia0 ", "/dev/nvidia2 ")) for n in nodes)
    for shared in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"):
        assert f"{shared} rw" in nodes
    assert {"/dev/ptmx rw", "char-pts rw"} <= set(nodes)  # Jupyter's terminals
    assert all(cmd[i - 1] == "-p" for i, w in enumerate(cmd) if w.startswith("DeviceAllow="))


def test_scope_command_without_a_user_runs_as_the_hub():
    cmd = scope_command("hub1", "abc", [0, 2])
    assert not any(w.startswith(("--uid", "--gid")) for w in cmd)
    assert {"/dev/nvidia0 rw", "/dev/nvidia2 rw"} <= set(allowed(cmd))


def test_unit_names_are_valid_and_per_start():
    assert unit_name("my hub/1", "s1") == "gpuspawner-my_hub_1-s1.scope"
    assert unit_name("h", "s1") != unit_name("h", "s2")


def test_mig_capability_nodes_come_from_the_driver_listing(tmp_path):
    caps = tmp_path / "capabilities"
    for rel, minor in (("gpu1/mig/gi3/access", 30), ("gpu1/mig/gi3/ci0/access", 31), ("gpu0/mig/gi1/access", 12)):
        (caps / rel).parent.mkdir(parents=True, exist_ok=True)
        (caps / rel).write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (caps / "mig").mkdir()
    (caps / "mig" / "config").write_text("DeviceFileMinor: 1\n")  # the admin's: never given out
    assert mig_nodes(1, caps) == ["/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"]
    assert mig_nodes(2, caps) == []
    nodes = device_allow([1], caps)
    assert "/dev/nvidia-caps/nvidia-cap31 rw" in nodes
    assert not any(n.startswith(("/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap1 ")) for n in nodes)


def test_detect_prefers_cgroup_v1_then_systemd(tmp_path):
    devices = tmp_path / "devices"
    devices.mkdir()
    (devices / "devices.deny").write_text("")
    systemd = tmp_path / "run-systemd-system"
    systemd.mkdir()
    assert detect(devices, systemd, "sh", root=True).mechanism == "cgroup-v1"
    isolation = detect(tmp_path / "none", systemd, "sh", root=True)
    assert isolation.mechanism == "systemd" and isolation.enforced
    assert "systemd scope" in isolation.note and "DevicePolicy=closed" in isolation.note


def test_detect_says_why_systemd_cannot_fence(tmp_path):
    systemd = tmp_path / "run-systemd-system"
    systemd.mkdir()
    no_v1 = tmp_path / "none"
    not_installed = detect(no_v1, systemd, None, root=True)
    assert not not_installed.enforced and "systemd-run is not installed" in not_installed.note
    assert "systemd-run is not installed" in detect(no_v1, systemd, "no-such-systemd-run", root=True).note
    not_root = detect(no_v1, systemd, "sh", root=False)
    assert not not_root.enforced and "not root" in not_root.note
    no_systemd = detect(no_v1, tmp_path / "absent", "sh", root=True)
    assert no_systemd.note.startswith("GPU isolation: advisory only on this host")


class _Recorder:
    """Stands for JupyterHub's LocalProcessSpawner: records the command it would build."""

    def __init__(self, shell_cmd=()):
        self.cmd = ["jupyterhub-singleuser"]
        self.shell_cmd = list(shell_cmd)

    async def start(self):
        self.seen = (list(self.shell_cmd), list(self.cmd))


class _Scoped(_InFence, _Recorder):
    pin_cpus = True
    gpu_allocation = ()  # no GPU: no CPU pinning words
    cpu_limit = None
    log = logging.getLogger("test")
    _log_name = "test"

    def _create_fence(self):
        self._scope_prefix = ["systemd-run", "--scope", "--"]

    async def server_account_problem(self):
        return None

    def gpu_event(self, message, progress):
        self.events = [*getattr(self, "events", []), message]


def test_the_scope_words_go_before_the_command_and_any_shell():
    spawner = _Scoped()
    asyncio.run(spawner.start())
    assert spawner.seen == ([], ["systemd-run", "--scope", "--", "jupyterhub-singleuser"])
    assert spawner.cmd == ["jupyterhub-singleuser"]  # the configured command is left as it was
    shell = _Scoped(["bash", "-l", "-c"])
    asyncio.run(shell.start())
    assert shell.seen == (["systemd-run", "--scope", "--", "bash", "-l", "-c"], ["jupyterhub-singleuser"])
    assert shell.shell_cmd == ["bash", "-l", "-c"]


def test_cpu_pinning_words_go_after_the_scope_words():
    cpu = min(os.sched_getaffinity(0))
    spawner = _Scoped(["bash", "-l", "-c"])
    spawner.gpu_allocation = (GPU("h", 0, "GPU-0", "Tesla T4", cpus=(cpu,), numa_node=0),)
    asyncio.run(spawner.start())
    taskset = shutil.which("taskset")
    assert spawner.seen == (
        ["systemd-run", "--scope", "--", taskset, "-c", str(cpu), "bash", "-l", "-c"], ["jupyterhub-singleuser"]
    )
    assert spawner.events == [f"CPUs {cpu}, next to the GPUs"]
    assert spawner.shell_cmd == ["bash", "-l", "-c"]


class _Start:
    """The parts of a gpu-local spawner that ``_create_fence`` reads, on a host whose isolation is given."""

    def __init__(self, isolation: Isolation, gpu_isolation="auto", minors=(1,), switches_user=True, records=None):
        self.hub_state = SimpleNamespace(cache={LocalCaches: LocalCaches(local_isolation=isolation)}.__getitem__)
        self.gpu_isolation = gpu_isolation
        self.gpu_allocation = [SimpleNamespace(uuid=f"GPU-{m}", minor_number=m) for m in minors]
        self.user = SimpleNamespace(name="root")
        self.gpu_hub_id, self.gpu_spawn_id = "hub9", "s9"
        self.gpu_owner = "root/"
        self._switches_user = switches_user
        self.log = logging.getLogger("test")
        self.scopes = ScopeFence("hub9", records=records) if records else None

    _isolation = _LocalGPUs._isolation

    def _fences(self):
        return StartFence(self.scopes, MarkedStarts("hub9"))

    def _system_user(self):
        return pwd.getpwnam(self.user.name)


SYSTEMD = Isolation("systemd", "GPU isolation: enforced by the kernel (a systemd scope per server)")


def test_a_start_on_a_systemd_host_gets_its_scope_words(tmp_path):
    start = _Start(SYSTEMD, records=tmp_path)
    _LocalGPUs._create_fence(start)
    assert start.scopes.record("s9") == StartRecord("root/", ("GPU-1",))  # whose it is, before it runs
    assert start._fence_path is None
    words = start._scope_prefix
    assert words[0] == shutil.which("systemd-run")  # found on the hub's PATH, not the server's
    assert "--uid=root" in words and "--gid=0" in words and "--unit=gpuspawner-hub9-s9.scope" in words
    assert "DeviceAllow=/dev/nvidia1 rw" in words and "DeviceAllow=/dev/nvidia0 rw" not in words
    as_hub = _Start(SYSTEMD, switches_user=False, records=tmp_path)  # gpu-local-simple: runs as the hub
    _LocalGPUs._create_fence(as_hub)
    assert not any(w.startswith(("--uid", "--gid")) for w in as_hub._scope_prefix)


def test_no_scope_where_isolation_is_off_or_advisory_and_required_refuses():
    off = _Start(SYSTEMD, gpu_isolation="off")
    _LocalGPUs._create_fence(off)
    assert off._scope_prefix is None and off._fence_path is None
    advisory = Isolation("advisory", "GPU isolation: advisory only on this host: no systemd")
    required = _Start(advisory, gpu_isolation="required")
    with pytest.raises(HTTPError) as refused:
        _LocalGPUs._create_fence(required)
    assert refused.value.status_code == 503
    assert "must enforce GPU isolation but cannot: GPU isolation: advisory only" in refused.value.jupyterhub_message
