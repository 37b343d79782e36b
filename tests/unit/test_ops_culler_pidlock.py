"""The culler's pid-file lock never signals a process that is not a culler holding it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpuspawner.hub import culler

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, sys.argv[2].encode())
print("locked", flush=True)
time.sleep(60)
"""


@pytest.fixture
def process():
    started: list[subprocess.Popen] = []

    def start(*args: str, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(list(args), **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_stale_pid_file_is_taken_without_signalling_the_pid_in_it(tmp_path, process):
    bystander = process("sleep", "60")  # a live process whose pid a killed culler's file might hold
    pid_file = tmp_path / "gpu-culler.pid"
    pid_file.write_text(f"{bystander.pid}\n")
    lock = culler.PidLock(str(pid_file))
    lock.acquire()
    try:
        assert pid_file.read_text() == f"{os.getpid()}\n"
        assert bystander.poll() is None
    finally:
        lock.release()
    assert pid_file.read_text() == ""  # emptied, not removed: another culler may hold it open


def test_a_lock_held_by_something_else_is_not_broken(tmp_path, process, monkeypatch):
    monkeypatch.setattr(culler, "TAKEOVER_GRACE", 0.3)
    pid_file = tmp_path / "gpu-culler.pid"
    bystander = process("sleep", "60")
    # the lock's holder is no culler, and the pid it wrote is a bystander's: neither is signalled
    holder = process(sys.executable, "-c", HOLD, str(pid_file), str(bystander.pid), stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    with pytest.raises(RuntimeError, match="not starting a second culler"):
        culler.PidLock(str(pid_file)).acquire()
    time.sleep(0.2)
    assert holder.poll() is None and bystander.poll() is None
