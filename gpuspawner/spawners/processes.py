"""gpu-local's source of truth: the server processes themselves.

Every gpu-local server process starts with three variables in its environment,
which every process it starts (kernels, terminals) inherits:

- ``GPUSPAWNER_HUB``: the hub's id (``gpu_hub_id``);
- ``GPUSPAWNER_SERVER``: the server, ``"user/server-name"``;
- ``GPUSPAWNER_SPAWN``: an id new at every start of that server;

beside ``CUDA_VISIBLE_DEVICES`` (the GPUs, by UUID). The kernel keeps a
process's starting environment in ``/proc/PID/environ``, so after a hub
restart, whatever moment the old hub died in, the new hub finds every live
process of its servers and the GPUs it holds (:func:`find_servers`), and can
end all processes of one start (:func:`end_processes`). Nothing here knows
about JupyterHub.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

HUB_VAR = "GPUSPAWNER_HUB"
SERVER_VAR = "GPUSPAWNER_SERVER"
SPAWN_VAR = "GPUSPAWNER_SPAWN"
GPUS_VAR = "CUDA_VISIBLE_DEVICES"

__all__ = ["HUB_VAR", "SERVER_VAR", "SPAWN_VAR", "ServerProcesses", "alive", "end_processes", "find_servers"]


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
        gpus = dict((pid, g) for pid, _, g in members)[leader]
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
