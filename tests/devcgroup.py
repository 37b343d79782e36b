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
FREEZER = Path("/sys/fs/cgroup/freezer")
NVIDIA_MAJOR = 195

# A process that leaves everything a hub could find it by: it forks, the child starts a session
# of its own and forks again, and the grandchild (reparented to init) runs with an empty
# environment. It prints the grandchild's pid; ``argv[1]``, when given, is a device node the
# grandchild tries to open every 0.1 s, writing what it got (``ENXIO``: the kernel let it
# through to a node without a driver; ``EPERM``: refused) to the file ``argv[2]``.
ESCAPER = r"""
import os, sys
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # nothing of its starter's: no terminal, no pipe
            os.dup2(null, fd)
        loop = ("import errno, os, sys, time\n"
                "while True:\n"
                "    if len(sys.argv) > 2:\n"
                "        try:\n"
                "            os.close(os.open(sys.argv[1], os.O_RDWR)); got = 'opened'\n"
                "        except OSError as e:\n"
                "            got = errno.errorcode[e.errno]\n"
                "        open(sys.argv[2] + '.tmp', 'w').write(f'{os.getpid()} {got}')\n"
                "        os.replace(sys.argv[2] + '.tmp', sys.argv[2])\n"
                "    time.sleep(0.1)\n")
        os.execve(sys.executable, [sys.executable, "-c", loop, *sys.argv[1:]], {})
    os._exit(0)
os.close(w)
print(os.read(r, 32).decode(), flush=True)
"""


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
        node.chmod(0o666)  # whatever the umask: servers run as other users (the fence decides)
        nodes.append(node)
    return nodes


@contextmanager
def frozen(pid: int) -> Iterator[Path]:
    """Hold process ``pid`` in a frozen freezer cgroup of its own, as the kernel holds a process stuck in a
    driver call: SIGKILL does not end it (it shows state D) until the group thaws; then it dies."""
    require()
    path = FREEZER / f"gpuspawner-frozen-{os.getpid()}-{os.urandom(3).hex()}"
    path.mkdir()
    try:
        (path / "cgroup.procs").write_text(str(pid))
        (path / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 10
        while (path / "freezer.state").read_text().strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.01)
        yield path
    finally:
        thaw(path)
        deadline = time.monotonic() + 10
        while True:
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # a thawed process still in it: move it back to the root before removing
                for left in (path / "cgroup.procs").read_text().split():
                    try:
                        (FREEZER / "cgroup.procs").write_text(left)
                    except OSError:
                        pass
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def thaw(path: Path) -> None:
    """Let the processes of freezer group ``path`` run again (a SIGKILL sent meanwhile ends them now)."""
    try:
        (path / "freezer.state").write_text("THAWED")
    except FileNotFoundError:
        pass
