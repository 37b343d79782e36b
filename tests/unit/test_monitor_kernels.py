"""Attributing GPU process ids to kernels through /proc parent chains (real processes)."""

import os
import subprocess
import sys

import pytest
from traitlets import TraitError

from gpuspawner.monitor.config import GPUMonitor
from gpuspawner.monitor.kernels import NOT_A_KERNEL, NOT_VISIBLE, Attributor, Kernel, parent_pid


@pytest.fixture
def parent_and_child():
    """A 'kernel' process that started a child (like a DataLoader worker)."""
    code = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '300']); "
            "print(p.pid, flush=True); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        yield parent.pid, child
    finally:
        try:
            os.kill(child, 9)
        except (ProcessLookupError, UnboundLocalError):
            pass
        parent.kill()
        parent.wait()


def unused_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


def test_parent_pid_reads_proc(parent_and_child):
    parent, child = parent_and_child
    assert parent_pid(child) == parent
    assert parent_pid(parent) == os.getpid()
    assert parent_pid(unused_pid()) is None


def test_kernel_and_its_children_are_attributed(parent_and_child):
    parent, child = parent_and_child
    attribute = Attributor()
    attribute.table = {parent: Kernel("k-1", "python3", "work/train.ipynb", parent)}
    assert attribute(parent) == ({"id": "k-1", "name": "python3", "path": "work/train.ipynb", "pid": parent,
                                  "via_child": None}, None)
    kernel, note = attribute(child)
    assert kernel["path"] == "work/train.ipynb" and kernel["via_child"] == child and note is None
    assert attribute(os.getpid()) == (None, NOT_A_KERNEL)
    assert attribute(unused_pid()) == (None, NOT_VISIBLE)


@pytest.mark.parametrize("trait,value", [("interval", 0), ("interval", 61), ("history_seconds", -1), ("idle_pause", 0)])
def test_config_refuses_out_of_range_values(trait, value):
    with pytest.raises(TraitError, match=f"GPUMonitor.{trait} must be between"):
        GPUMonitor(**{trait: value})
