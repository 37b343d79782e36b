"""Running Slurm's commands from the hub, the way batchspawner runs its own; ``sinfo`` and ``squeue`` cached.

Every Slurm command the hub runs goes through batchspawner's ``exec_prefix`` (filled
in by the spawner for the user it acts for: ``sudo -E -u alice``, ``ssh alice@login``,
``runuser -u jupyter-alice --``), as one shell command line in the hub's environment,
as batchspawner's ``run_command`` runs its job queries and cancellations. So at a site
whose Slurm commands work only through the prefix, the form's availability, the queue
in words and the reconciliation work as batchspawner's own commands do.

One :class:`SlurmReader` per prefix (kept in the hub state: with ``{username}`` in the
prefix, one per user, since Slurm may show each user other things) runs ``sinfo --json``,
``squeue --json`` and ``scontrol show reservation -o`` (a booking's reservation, which a booked
user's job is submitted into) at most once per ``ttl`` seconds each; concurrent callers share
one run. A command that fails or does not answer gives a reading with ``unknown`` set
to why, never an exception: the form then says "availability unknown" and spawns go to
Slurm unchecked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .capacity import SlurmNode, read_nodes
from .queue import SlurmJob, read_jobs
from .reservations import read_reservations


@dataclass(frozen=True)
class Reading:
    """What one command said: ``value`` (nodes or jobs), or ``unknown`` (why not)."""

    value: tuple[Any, ...] = ()
    unknown: str | None = None
    at: float = 0.0


def prefixed(prefix: str, command: str) -> str:
    """``command`` behind ``prefix`` (an exec_prefix already filled in), as batchspawner joins them."""
    return " ".join(part for part in (prefix.strip(), command) if part)


async def run_command_line(line: str, name: str, timeout: float = 10.0) -> str:
    """Run one shell command line (``prefix + command``) in the hub's environment; its stdout, or
    RuntimeError saying why it failed, naming the Slurm command ``name``.

    The line runs in a session of its own, so a command that does not answer within
    ``timeout`` seconds is ended with whatever the prefix started (sudo, ssh).
    """
    try:
        proc = await asyncio.create_subprocess_shell(
            line, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except OSError as e:
        raise RuntimeError(f"{name} cannot run: {e.strerror}") from e
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except (asyncio.TimeoutError, asyncio.CancelledError) as e:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()
        if isinstance(e, asyncio.CancelledError):
            raise
        raise RuntimeError(f"{name} did not answer within {timeout:g}s") from None
    if proc.returncode != 0:
        why = err.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"{name} failed: {why[-1] if why else f'exit status {proc.returncode}'}")
    return out.decode(errors="replace")


class _Cached:
    def __init__(self, line: Callable[[], str], name: str, parse: Callable[[str], tuple], ttl: float,
                 timeout: float) -> None:
        self.line, self.name, self.parse, self.ttl, self.timeout = line, name, parse, ttl, timeout
        self._last = Reading()
        self._running: asyncio.Future | None = None

    async def read(self, max_age: float | None = None) -> Reading:
        age = self.ttl if max_age is None else max_age
        if self._last.at and time.monotonic() - self._last.at <= age:
            return self._last
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._run())
        return await asyncio.shield(self._running)

    async def _run(self) -> Reading:
        try:
            value = self.parse(await run_command_line(self.line(), self.name, timeout=self.timeout))
            self._last = Reading(value, None, time.monotonic())
        except (RuntimeError, ValueError) as e:
            self._last = Reading((), str(e), time.monotonic())
        return self._last


class SlurmReader:
    """The hub's cached view of Slurm through one exec_prefix: nodes (``sinfo --json``) and jobs (``squeue --json``)."""

    def __init__(self, prefix: str = "", ttl: float = 5.0, timeout: float = 10.0, problem: str | None = None) -> None:
        """``prefix``: the exec_prefix filled in; ``problem``: why no command can run (every reading says it)."""
        self.prefix, self.problem = prefix, problem
        self._nodes = _Cached(lambda: self._line("sinfo --json"), "sinfo", read_nodes, ttl, timeout)
        self._jobs = _Cached(lambda: self._line("squeue --json"), "squeue", read_jobs, min(ttl, 2.0), timeout)
        self._reservations = _Cached(lambda: self._line("scontrol show reservation -o"), "scontrol",
                                     read_reservations, ttl, timeout)

    def _line(self, command: str) -> str:
        if self.problem is not None:
            raise RuntimeError(self.problem)
        return prefixed(self.prefix, command)

    async def nodes(self) -> Reading:
        """The cluster's nodes (:class:`~gpuspawner.backends.slurm.capacity.SlurmNode`), at most ``ttl`` old."""
        return await self._nodes.read()

    async def jobs(self, max_age: float | None = None) -> Reading:
        """Every job Slurm lists (:class:`~gpuspawner.backends.slurm.queue.SlurmJob`)."""
        return await self._jobs.read(max_age)

    async def reservations(self) -> Reading:
        """Every advance reservation (:class:`~gpuspawner.backends.slurm.reservations.Reservation`)."""
        return await self._reservations.read()


__all__ = ["Reading", "SlurmJob", "SlurmNode", "SlurmReader", "prefixed", "run_command_line"]
