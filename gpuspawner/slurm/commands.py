"""Reading Slurm from the hub: ``sinfo --json`` and ``squeue --json``, cached briefly.

One :class:`SlurmReader` per hub (kept in the hub state) runs the commands for
every spawner, at most once per ``ttl`` seconds each; concurrent callers share
one run. A command that fails or does not answer gives a reading with
``unknown`` set to why, never an exception: the form then says "availability
unknown" and spawns go to Slurm unchecked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .jobs import SlurmJob, read_jobs
from .sinfo import SlurmNode, read_nodes


@dataclass(frozen=True)
class Reading:
    """What one command said: ``value`` (nodes or jobs), or ``unknown`` (why not)."""

    value: tuple[Any, ...] = ()
    unknown: str | None = None
    at: float = 0.0


async def run_slurm(*args: str, timeout: float = 10.0) -> str:
    """Run a Slurm command; its stdout, or RuntimeError saying why it failed."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        raise RuntimeError(f"{args[0]} cannot run: {e.strerror}") from e
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"{args[0]} did not answer within {timeout:g}s") from None
    if proc.returncode != 0:
        why = err.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"{args[0]} failed: {why[-1] if why else f'exit status {proc.returncode}'}")
    return out.decode(errors="replace")


class _Cached:
    def __init__(self, command: tuple[str, ...], parse: Callable[[str], tuple], ttl: float, timeout: float) -> None:
        self.command, self.parse, self.ttl, self.timeout = command, parse, ttl, timeout
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
            value = self.parse(await run_slurm(*self.command, timeout=self.timeout))
            self._last = Reading(value, None, time.monotonic())
        except (RuntimeError, ValueError) as e:
            self._last = Reading((), str(e), time.monotonic())
        return self._last


class SlurmReader:
    """The hub's cached view of Slurm: nodes (``sinfo --json``) and jobs (``squeue --json``)."""

    def __init__(self, ttl: float = 5.0, timeout: float = 10.0) -> None:
        self._nodes = _Cached(("sinfo", "--json"), read_nodes, ttl, timeout)
        self._jobs = _Cached(("squeue", "--json"), read_jobs, min(ttl, 2.0), timeout)

    async def nodes(self) -> Reading:
        """The cluster's nodes (:class:`~gpuspawner.slurm.sinfo.SlurmNode`), at most ``ttl`` old."""
        return await self._nodes.read()

    async def jobs(self, max_age: float | None = None) -> Reading:
        """Every job Slurm lists (:class:`~gpuspawner.slurm.jobs.SlurmJob`)."""
        return await self._jobs.read(max_age)


__all__ = ["Reading", "SlurmJob", "SlurmNode", "SlurmReader", "run_slurm"]
