"""DeviceFence on this machine's cgroup v1 devices and freezer controllers (as root): what a start's
cgroup lets open, and that ending a start leaves none of its processes, however they hid."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import devcgroup
from gpuspawner.backends.local.fence import DeviceFence, deny_rules
from gpuspawner.backends.local.fence_starts import StartRecord, cgroup_pids
from gpuspawner.backends.local.fence_systemd import kill_cgroup
from gpuspawner.backends.local.processes import alive, describe_processes, end_start, find_servers

OPEN_BOTH = """
import os, sys
def attempt(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return "opened"
    except OSError as e:
        return e.strerror
sys.stdin.readline()  # wait until moved into the cgroup
print(attempt(sys.argv[1]) + "|" + attempt(sys.argv[2]))
"""


def test_deny_rules_leave_only_the_own_gpu_nodes_open():
    rules = deny_rules([1, 3])
    assert "c 195:1 rwm" not in rules and "c 195:3 rwm" not in rules
    assert {"c 195:0 rwm", "c 195:2 rwm", "c 195:253 rwm"} <= set(rules)
    assert "c 195:255 rwm" not in rules and "c 195:254 rwm" not in rules  # nvidiactl, nvidia-modeset


def test_a_start_cgroup_refuses_other_gpus_and_goes_with_the_last_start(tmp_path):
    devcgroup.require()
    own, other = devcgroup.gpu_nodes(tmp_path / "dev", [0, 1])
    fence = DeviceFence(f"unit-{os.getpid()}-{os.urandom(3).hex()}")
    opener = None
    try:
        first, _freezer = fence.create("s1", [0])
        fence.create("s2", [1])
        assert fence.starts() == ["s1", "s2"]
        opener = subprocess.Popen([sys.executable, "-c", OPEN_BOTH, str(own), str(other)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        devcgroup.join(first, opener.pid)
        assert fence.remove("s1") is False  # a process is still in it: kept
        out, _ = opener.communicate("go\n", timeout=60)
        # its own node opens as far as a node without a driver does; the other GPU's is refused
        assert out.strip() == "No such device or address|Operation not permitted"
        assert fence.remove("s1") is True
        assert fence.starts() == ["s2"] and fence.root.is_dir()
        assert fence.remove("s2") is True
        assert not fence.root.exists()  # the hub's folder goes with its last start
        assert fence.remove("s2") is True  # removing again is harmless
    finally:
        if opener and opener.poll() is None:
            opener.kill()
            opener.wait()
        for spawn in fence.starts():
            fence.remove(spawn)


@pytest.fixture
def fence(tmp_path):
    devcgroup.require()
    fence = DeviceFence(f"unit-{os.getpid()}-{os.urandom(3).hex()}", records=tmp_path / "records")
    yield fence
    for spawn in fence.starts():
        for pid in fence.pids(spawn):
            os.kill(pid, 9)
        asyncio.run(end_start(fence, spawn, 10))
        fence.remove(spawn)


def start_escaper(groups: list[Path], *args: str) -> int:
    """Run devcgroup.ESCAPER in ``groups`` (joined before it runs, as a server joins): its hidden grandchild's pid."""
    out = subprocess.run([sys.executable, "-c", devcgroup.ESCAPER, *args], capture_output=True, text=True,
                         timeout=30, preexec_fn=lambda: DeviceFence.join(groups), check=True)
    return int(out.stdout)


def test_ending_a_start_kills_a_process_that_left_its_session_and_environment(fence):
    groups = fence.create("s1", [0], StartRecord("ada/", ("GPU-0",)))
    hidden = start_escaper(groups)
    assert alive([hidden]) == [hidden]
    assert Path(f"/proc/{hidden}/environ").read_bytes() == b""  # nothing names it...
    assert os.getsid(hidden) != os.getsid(0)  # a session of its own
    assert find_servers(fence.root.name) == []  # ...so the environment marks cannot find it
    assert fence.pids("s1") == [hidden]  # but its cgroups hold it
    assert fence.record("s1") == StartRecord("ada/", ("GPU-0",))
    assert fence.remove("s1") is False
    assert asyncio.run(end_start(fence, "s1", 10)) == []
    assert alive([hidden]) == []
    assert fence.remove("s1") is True
    assert fence.starts() == [] and fence.record("s1") is None
    assert not fence.root.exists() and not fence.freezer_root.exists()


def test_a_process_the_kernel_holds_keeps_the_start_until_it_is_released(fence):
    groups = fence.create("s1", [1], StartRecord("bob/", ("GPU-1",)))
    stuck = start_escaper(groups)
    with devcgroup.frozen(stuck) as frozen:  # as a process inside a driver call: SIGKILL waits
        assert asyncio.run(end_start(fence, "s1", 1.5)) == [stuck]
        name = Path(sys.executable).name[:15]
        assert describe_processes([stuck]) == [f"pid {stuck} ({name}, in uninterruptible sleep, inside the kernel)"]
        assert fence.remove("s1") is False
        devcgroup.thaw(frozen)  # it comes back from the kernel, to the SIGKILL waiting for it
        assert asyncio.run(end_start(fence, "s1", 10)) == []
    assert fence.remove("s1") is True


UNIFIED = Path("/sys/fs/cgroup/unified")


def test_a_v2_cgroup_is_emptied_at_once_through_cgroup_kill():
    """The systemd scope's way (cgroup.kill), on this machine's cgroup v2 hierarchy."""
    root = UNIFIED if (UNIFIED / "cgroup.procs").exists() else Path("/sys/fs/cgroup")
    if os.geteuid() != 0 or not (root / "cgroup.subtree_control").exists():
        devcgroup.missing(f"no writable cgroup v2 hierarchy at {root}")
    group = root / f"gpuspawner-unit-{os.getpid()}-{os.urandom(3).hex()}"
    group.mkdir()
    try:
        hidden = start_escaper([group])
        assert cgroup_pids(group) == [hidden]
        assert (group / "cgroup.kill").exists()
        kill_cgroup(group)
        for _ in range(100):
            if not cgroup_pids(group):
                break
            asyncio.run(asyncio.sleep(0.05))
        assert cgroup_pids(group) == [] and alive([hidden]) == []
    finally:
        group.rmdir()
