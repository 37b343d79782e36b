"""DeviceFence on this machine's cgroup v1 devices controller (as root): what a start's cgroup lets open."""

from __future__ import annotations

import os
import subprocess
import sys

import devcgroup
from gpuspawner.fence import DeviceFence, deny_rules

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
        first = fence.create("s1", [0])
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
