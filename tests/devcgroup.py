"""Throwaway cgroup v1 ``devices`` groups and NVIDIA-like device nodes for tests.

As root on a host that mounts the cgroup v1 devices controller (this machine:
``/sys/fs/cgroup/devices``), a process moved into a group whose
``devices.deny`` holds ``c 195:N rwm`` gets EPERM opening a ``c 195 N`` node,
as under gpu-local's fence or Slurm's ConstrainDevices. Elsewhere the tests
that need it call :func:`needs.missing` (skip, or fail in CI).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from needs import missing

MOUNT = Path("/sys/fs/cgroup/devices")
NVIDIA_MAJOR = 195


def require() -> None:
    """Skip (fail in CI) unless this process can make device cgroups."""
    __tracebackhide__ = True
    if os.geteuid() != 0:
        missing("device cgroups need root")
    if not (MOUNT / "devices.deny").exists():
        missing(f"no cgroup v1 devices controller mounted at {MOUNT}")


@contextmanager
def group(prefix: str = "test") -> Iterator[Path]:
    """A new devices cgroup (everything allowed, as its parent); removed once its processes are gone."""
    require()
    path = MOUNT / f"gpuspawner-{prefix}-{os.getpid()}-{os.urandom(3).hex()}"
    path.mkdir()
    try:
        yield path
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY: a stopped process is still being reaped
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def deny(path: Path, minors: Iterable[int]) -> None:
    """Refuse the GPU nodes ``195:minor`` to the group's processes."""
    for minor in minors:
        (path / "devices.deny").write_text(f"c {NVIDIA_MAJOR}:{minor} rwm")


def join(path: Path, pid: int) -> None:
    """Move process ``pid`` (all its threads) into the group."""
    (path / "cgroup.procs").write_text(str(pid))


def gpu_nodes(directory: Path, minors: Iterable[int]) -> list[Path]:
    """``directory/nvidiaN`` character nodes ``195:N`` (mode 0666), as the driver makes them."""
    directory.mkdir(parents=True, exist_ok=True)
    nodes = []
    for minor in minors:
        node = directory / f"nvidia{minor}"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, minor))
        nodes.append(node)
    return nodes
