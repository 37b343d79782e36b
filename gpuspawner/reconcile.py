"""The ledger agrees with the cluster: what one reconciliation pass changes. Pure: no I/O here.

Where the cluster, not the hub, holds the truth (gpu-slurm's jobs, gpu-kube's pods,
gpu-docker's containers, gpu-swarm's services), the hub reconciles its ledger with the
cluster's own list of this hub's *workloads* (found by the marks the hub puts on them: a
job's comment, a pod's or container's labels) at start and then every
``gpu_reconcile_interval`` seconds. The rule, for every owner (a server ``user/name`` or a
notebook job ``user/job/<id>``):

- no charge without a live workload: an owner the ledger charges whose workloads are all
  gone is released;
- no live workload of the hub's without an owner: a live workload the hub's records name is
  charged to its owner, with what the cluster says it holds; one no record names (an
  *orphan*: the hub died between making it and saving its id) is cancelled, or adopted
  (charged to the owner its marks name) where the backend keeps orphans;
- owners *in flight* are left alone: a start or stop under way (or that was under way at any
  moment since the pass began reading) is changing both the ledger and the cluster, and its
  workload may not be listed yet (a job submitted but not yet in ``squeue``) or its id not
  yet saved. Only a workload marked with another start than the ones in flight is an orphan
  even then (an old start of the same server).

:func:`plan` decides; the spawner mixin reads the cluster, asks it, and applies the answer.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Flights", "Plan", "Workload", "plan"]


@dataclass(frozen=True)
class Workload:
    """One live workload of this hub as the cluster lists it."""

    id: str  # the cluster's id: Slurm job id, pod name, container or service name
    owner: str  # the ledger key its marks name: ``user/server`` or ``user/job/<id>``
    holds: tuple[str, ...] = ()  # ledger keys of what it holds (GPU UUIDs or cluster tokens)
    start: str = ""  # the start it belongs to, where its marks say (gpu-slurm's comment)
    what: str = ""  # how the log names it, e.g. "Slurm job 12"

    def __str__(self) -> str:
        return self.what or self.id


@dataclass(frozen=True)
class Plan:
    """What one pass changes in the ledger, and the orphans it found."""

    #: owner -> exactly what the ledger must hold for it (a new charge, or a changed one)
    hold: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: owners whose charge goes: no live workload of theirs
    release: tuple[str, ...] = ()
    #: live workloads no record names, to cancel (or adopted: then also in ``hold``)
    orphans: tuple[Workload, ...] = ()
    #: live workloads whose owner the ledger did not charge before (for the log)
    adopted: tuple[Workload, ...] = ()


def plan(
    held: Mapping[str, tuple[str, ...]],
    live: Iterable[Workload],
    recorded: Mapping[str, Iterable[str]] | None,
    busy: Mapping[str, Iterable[str]],
    adopt_orphans: bool,
) -> Plan:
    """What makes the ledger (``held``: owner -> keys) agree with the ``live`` workloads.

    ``recorded``: owner -> the workload ids the hub's database names for each owner that is
    active there (a server JupyterHub shows running or starting, an active notebook job);
    ``None`` where the backend keeps no such record: then every live workload is its owner's.
    ``busy``: owners in flight (see the module docstring) -> the start marks of their
    flights. ``adopt_orphans``: charge orphans to their owners instead of cancelling them.

    A live workload that holds nothing the ledger can name yet (a Swarm task not placed)
    leaves its owner's charge as it is.
    """
    busy = {owner: frozenset(marks) for owner, marks in busy.items()}
    named: dict[str, list[Workload]] = {}
    orphans: list[Workload] = []
    for workload in sorted(live, key=lambda w: (w.owner, w.id)):
        if recorded is None or workload.id in set(recorded.get(workload.owner, ())):
            named.setdefault(workload.owner, []).append(workload)
        elif workload.owner in busy and (not workload.start or not busy[workload.owner]
                                         or workload.start in busy[workload.owner]):
            continue  # the start in flight, whose id is not saved yet
        else:
            orphans.append(workload)
            if adopt_orphans:
                named.setdefault(workload.owner, []).append(workload)
    hold: dict[str, tuple[str, ...]] = {}
    adopted: list[Workload] = []
    for owner, workloads in named.items():
        if owner in busy:
            continue
        keys = tuple(dict.fromkeys(key for w in workloads for key in w.holds))
        if not keys:
            continue  # nothing to count (CPU-only), or not placed yet: the charge stays as it is
        if set(held.get(owner, ())) != set(keys):
            hold[owner] = keys
        if owner not in held:
            adopted.extend(workloads)
    release = tuple(sorted(owner for owner, keys in held.items()
                           if keys and owner not in busy and owner not in named))
    return Plan(hold, release, tuple(orphans), tuple(adopted))


class Flights:
    """Owners whose workload the hub is making or ending right now: a server's start or stop, a
    notebook job the job manager launches and watches. One per hub (on its HubState).

    A pass calls :meth:`mark` before it reads anything, and :meth:`since` with that mark once it
    has read: every owner in flight at any moment in between, with the start marks of those
    flights, is left alone.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ids = itertools.count(1)
        self._flying: dict[int, tuple[str, str]] = {}  # flight -> (owner, its start mark)
        self._landed: list[tuple[float, str, str]] = []  # (when, owner, start mark) of ended flights

    def begin(self, owner: str, mark: str = "") -> int:
        """A flight of ``owner`` begins (``mark``: the start's own mark, where its workload carries one)."""
        flight = next(self._ids)
        self._flying[flight] = (owner, mark)
        return flight

    def end(self, flight: int) -> None:
        """The flight ended (again: nothing happens)."""
        ended = self._flying.pop(flight, None)
        if ended is not None:
            self._landed.append((self._clock(), *ended))

    @contextmanager
    def flying(self, owner: str, mark: str = "") -> Iterator[int]:
        flight = self.begin(owner, mark)
        try:
            yield flight
        finally:
            self.end(flight)

    def mark(self) -> float:
        """Now, for :meth:`since`."""
        return self._clock()

    def since(self, mark: float) -> dict[str, frozenset[str]]:
        """Owners in flight now or at any moment after ``mark`` -> the start marks of those flights."""
        found: dict[str, set[str]] = {}
        for owner, start in self._flying.values():
            found.setdefault(owner, set()).add(start)
        for when, owner, start in self._landed:
            if when >= mark:
                found.setdefault(owner, set()).add(start)
        return {owner: frozenset(m for m in marks if m) for owner, marks in found.items()}

    def forget(self, before: float) -> None:
        """Forget flights that ended before ``before`` (no pass that began earlier is still running)."""
        self._landed = [landed for landed in self._landed if landed[0] >= before]
