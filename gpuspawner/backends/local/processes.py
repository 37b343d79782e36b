"""gpu-local's source of truth: the server processes themselves.

Every gpu-local server process starts with three variables in its environment
(:mod:`gpuspawner.marks`), which every process it starts (kernels, terminals) inherits:

- ``GPUSPAWNER_HUB``: the hub's id (``gpu_hub_id``);
- ``GPUSPAWNER_SERVER``: the server, ``"user/server-name"``;
- ``GPUSPAWNER_SPAWN``: an id new at every start of that server;

beside ``CUDA_VISIBLE_DEVICES`` (the GPUs, by UUID). The kernel keeps a
process's starting environment in ``/proc/PID/environ``, so after a hub
restart, whatever moment the old hub died in, the new hub finds every live
process of its servers and the GPUs it holds (:func:`find_servers`), and can
end all processes of one start (:func:`end_processes`).

A process can clear its environment, though. Where the kernel fences starts
(:mod:`gpuspawner.backends.local.fence`), the start's cgroup is the truth about its processes;
:class:`MarkedStarts` is the same interface over the environment marks, for
hosts without a fence. :func:`end_start` empties a start through either.
Nothing here knows about JupyterHub.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ...marks import HUB_VAR, SERVER_VAR, SPAWN_VAR
from .fence_starts import StartRecord, kill_pids

GPUS_VAR = "CUDA_VISIBLE_DEVICES"

__all__ = [
    "HUB_VAR", "SERVER_VAR", "SPAWN_VAR", "Fence", "MarkedStarts", "ServerProcesses", "StartFence", "alive",
    "describe_processes", "end_processes", "end_start", "find_servers",
]


@dataclass(frozen=True)
class ServerProcesses:
    """The live processes of one start of one server."""

    owner: str  # "user/server-name"
    spawn: str
    uuids: tuple[str, ...]
    pids: tuple[int, ...]  # sorted
    leader: int  # the process the others descend from: the server (or its shell)


def _environ(pid: int, proc: Path) -> dict[bytes, bytes] | None:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's process the hub may not read
        return None
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def _stat(pid: int, proc: Path) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the name may hold spaces and parentheses
    return fields[0], int(fields[1])


def find_servers(hub_id: str, proc: str | Path = "/proc", spawn: str | None = None) -> list[ServerProcesses]:
    """Every live server start of hub ``hub_id`` (or only start ``spawn``), from the process table."""
    proc = Path(proc)
    hub = hub_id.encode()
    groups: dict[tuple[bytes, bytes], list[tuple[int, int, bytes]]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid, proc)
        if not env or env.get(HUB_VAR.encode()) != hub or SPAWN_VAR.encode() not in env:
            continue
        if spawn is not None and env[SPAWN_VAR.encode()] != spawn.encode():
            continue
        stat = _stat(pid, proc)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        key = (env.get(SERVER_VAR.encode(), b""), env[SPAWN_VAR.encode()])
        groups.setdefault(key, []).append((pid, stat[1], env.get(GPUS_VAR.encode(), b"")))
    found = []
    for (owner, spawn_id), members in sorted(groups.items()):
        pids = {pid for pid, _, _ in members}
        roots = sorted(pid for pid, parent, _ in members if parent not in pids)
        leader = roots[0] if roots else min(pids)
        gpus = {pid: g for pid, _, g in members}[leader]
        uuids = tuple(u for u in gpus.decode().split(",") if u)
        found.append(ServerProcesses(owner.decode(), spawn_id.decode(), uuids, tuple(sorted(pids)), leader))
    return found


def alive(pids: Iterable[int], proc: str | Path = "/proc") -> list[int]:
    """The pids that are still running (zombies are not)."""
    proc = Path(proc)
    return [pid for pid in pids if (s := _stat(pid, proc)) is not None and s[0] not in ("Z", "X")]


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


async def end_processes(pids: Iterable[int], grace: float = 5.0, kill_wait: float = 5.0) -> list[int]:
    """SIGTERM ``pids``, SIGKILL what is left after ``grace`` seconds; the pids still alive after that."""
    left = alive(pids)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        if not left:
            break
        _signal(left, sig)
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            left = alive(left)
    return left


class Fence(Protocol):
    """What gpu-local asks of a start's fence, whatever the mechanism (all calls do blocking I/O)."""

    def pids(self, spawn: str) -> list[int]:
        """Every live process of start ``spawn``."""

    def kill(self, spawn: str) -> None:
        """SIGKILL every process of start ``spawn`` (returns at once)."""

    def remove(self, spawn: str) -> bool:
        """Forget start ``spawn``; False while it still has processes."""

    def starts(self) -> list[str]:
        """The starts this hub has a fence for."""

    def record(self, spawn: str) -> StartRecord | None:
        """Whose start it is and which GPUs it holds."""

    def knows(self, spawn: str) -> bool:
        """Whether start ``spawn`` was fenced here (it has a cgroup or a record)."""


class MarkedStarts:
    """A hub's starts on a host without a fence: the processes that carry its marks."""

    def __init__(self, hub_id: str, proc: str | Path = "/proc") -> None:
        self.hub_id = hub_id
        self.proc = Path(proc)

    def _group(self, spawn: str) -> ServerProcesses | None:
        return next(iter(find_servers(self.hub_id, self.proc, spawn)), None)

    def pids(self, spawn: str) -> list[int]:
        group = self._group(spawn)
        return list(group.pids) if group is not None else []

    def kill(self, spawn: str) -> None:
        kill_pids(self.pids(spawn))

    def remove(self, spawn: str) -> bool:
        return not self.pids(spawn)

    def starts(self) -> list[str]:
        return [g.spawn for g in find_servers(self.hub_id, self.proc)]

    def record(self, spawn: str) -> StartRecord | None:
        group = self._group(spawn)
        return StartRecord(group.owner, group.uuids) if group is not None else None

    def knows(self, spawn: str) -> bool:
        return bool(self.pids(spawn))


class StartFence:
    """A start's processes: its cgroup's where the kernel fences it, else those carrying its marks.

    (A start is unfenced where isolation is off or advisory, or where its GPUs' device
    numbers were unknown; the marks are then all there is.)
    """

    def __init__(self, kernel: Fence | None, marks: MarkedStarts) -> None:
        self.kernel = kernel
        self.marks = marks

    def _by(self, spawn: str) -> Fence:
        return self.kernel if self.kernel is not None and self.kernel.knows(spawn) else self.marks

    def pids(self, spawn: str) -> list[int]:
        return self._by(spawn).pids(spawn)

    def kill(self, spawn: str) -> None:
        self._by(spawn).kill(spawn)

    def remove(self, spawn: str) -> bool:
        return self._by(spawn).remove(spawn)

    def starts(self) -> list[str]:
        kernel = self.kernel.starts() if self.kernel is not None else []
        return sorted(set(kernel) | set(self.marks.starts()))

    def record(self, spawn: str) -> StartRecord | None:
        return (self.kernel.record(spawn) if self.kernel is not None else None) or self.marks.record(spawn)

    def knows(self, spawn: str) -> bool:
        return self._by(spawn).knows(spawn)


#: ``/proc/PID/stat`` states, in words
STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible sleep, inside the kernel",
          "T": "stopped", "t": "stopped by a tracer", "Z": "a zombie", "X": "dead"}


def describe_processes(pids: Iterable[int], proc: str | Path = "/proc") -> list[str]:
    """``"pid 4242 (python3, in uninterruptible sleep, inside the kernel)"`` for each pid still there."""
    proc = Path(proc)
    described = []
    for pid in pids:
        try:
            text = (proc / str(pid) / "stat").read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1:text.rfind(")")]
        state = text[text.rfind(")") + 2:].split()[0]
        described.append(f"pid {pid} ({name}, {STATES.get(state, 'state ' + state)})")
    return described


async def end_start(fence: Fence, spawn: str, timeout: float) -> list[int]:
    """SIGKILL every process of start ``spawn`` until none is left or ``timeout`` seconds passed.

    Returns the pids still alive then (empty: the start is over). A process in
    uninterruptible sleep (in the kernel, e.g. a GPU driver call) cannot die before
    it returns from there: it is still listed when the time is up.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = await asyncio.to_thread(fence.pids, spawn)
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.to_thread(fence.kill, spawn)
        wait_until = min(deadline, time.monotonic() + 1.0)  # then another round (a fork may have slipped out)
        while left and time.monotonic() < wait_until:
            await asyncio.sleep(0.05)
            left = await asyncio.to_thread(fence.pids, spawn)
