"""Who holds which GPU, kept consistent under one lock.

JupyterHub runs every spawner of a hub in one process, one spawner object per
user server. They all consult the same :class:`Ledger` (the hub's
:class:`~gpuspawner.state.HubState` owns it) so that two concurrent spawns can
never be given the same GPU: choosing GPUs and recording them happen under one
lock, and the lock is never held across I/O.

Where the cluster places (gpu-kube: the scheduler and the device plugin pick
the GPUs), the hub still counts what each server holds, for the quotas: a
server holding N GPUs of a cluster resource holds N *cluster tokens* (see
:func:`cluster_tokens`), never an inventory UUID, so nothing of the hub's own
inventory is ever marked taken by them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping

from gpuspawner.gpu import GPU
from gpuspawner.placement import FreeState, GPURequest, PlacementIndex, place_in

__all__ = ["Ledger", "CLUSTER", "cluster_tokens", "cluster_resource", "cluster_holdings"]

#: The prefix of a cluster token: ``cluster:RESOURCE:N:OWNER``.
CLUSTER = "cluster:"

Admit = Callable[[Mapping[str, tuple[str, ...]]], None]

#: Told of every change of who holds what, after the ledger's lock is released:
#: ``observer("hold", owner, uuids, since)`` when ``owner`` starts holding or holds more
#: (``uuids``: all it holds now; ``since``: when it started holding), and
#: ``observer("release", owner, uuids, since)`` when it gave everything back.
Observer = Callable[[str, str, tuple[str, ...], float], None]


def cluster_tokens(owner: str, holdings: Mapping[str, int]) -> tuple[str, ...]:
    """The ledger keys of ``owner`` holding ``holdings`` (cluster resource -> GPU count).

    ``{"nvidia.com/gpu": 2}`` for ``alice/`` gives ``cluster:nvidia.com/gpu:0:alice/``
    and ``cluster:nvidia.com/gpu:1:alice/``: one per GPU (a MIG slice or a
    time-sliced replica counts as one), unique to the owner, so quotas count
    them like GPUs and no two owners ever share one. Resource names hold no colon.
    """
    return tuple(
        f"{CLUSTER}{resource}:{i}:{owner}"
        for resource, count in sorted(holdings.items())
        for i in range(count)
    )


def cluster_resource(key: str) -> str | None:
    """The cluster resource of a cluster token; ``None`` for an inventory UUID."""
    if not key.startswith(CLUSTER):
        return None
    return key[len(CLUSTER):].split(":", 1)[0]


def cluster_holdings(keys: Iterable[str]) -> dict[str, int]:
    """Cluster resource -> count among ``keys`` (inventory UUIDs are left out)."""
    counts: dict[str, int] = {}
    for key in keys:
        resource = cluster_resource(key)
        if resource is not None:
            counts[resource] = counts.get(resource, 0) + 1
    return counts


class Ledger:
    """In-flight reservations and allocations, under one lock, so concurrent spawns never share a GPU.

    Two maps are kept in step: owner -> UUIDs and UUID -> owner (a UUID here is
    an inventory GPU's UUID or a cluster token). An owner appears only while it
    holds at least one GPU.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._by_owner: dict[str, tuple[str, ...]] = {}
        self._by_uuid: dict[str, str] = {}
        self._since: dict[str, float] = {}  # owner -> when it started holding (the clock's time)
        # placement's view of the last inventory reserved on, kept in step with the maps
        self._free: FreeState | None = None
        self._observers: list[Observer] = []
        self._events: list[tuple[str, str, tuple[str, ...], float]] = []  # told once the lock is free

    def observe(self, observer: Observer) -> None:
        """Tell ``observer`` of every hold and release from now on (see :data:`Observer`).

        Every holder goes through the ledger (servers, jobs, adopted allocations), so an
        observer sees them all. Observers run in the caller's thread, outside the lock.
        """
        self._observers.append(observer)

    def _notify(self) -> None:
        """Tell the observers what changed; called right after the lock is released."""
        with self._lock:
            events, self._events = self._events, []
        for event in events:
            for observer in self._observers:
                observer(*event)

    def reserve(
        self,
        inventory: Iterable[GPU],
        request: GPURequest,
        admit: Admit | None = None,
    ) -> tuple[GPU, ...]:
        """Place ``request`` on GPUs nobody holds and record them for its owner.

        Raises :class:`~gpuspawner.placement.PlacementError` when the request
        cannot be placed (nothing is recorded then), and :class:`ValueError`
        when the owner already holds GPUs: callers release first. A request
        for 0 GPUs returns ``()`` and records nothing.

        ``admit`` (e.g. a quota check) is called under the lock with owner ->
        held UUIDs before placing; whatever it raises refuses the request, so
        the check and the reservation are one step.
        """
        gpus = tuple(inventory)  # materialise outside the lock
        current = self._free
        # a new reading: group it outside the lock (pure work); the state is built under it
        index = current.index if current is not None and current.index.gpus is gpus else PlacementIndex(gpus)
        with self._lock:
            if request.owner in self._by_owner:
                raise ValueError(
                    f"{request.owner!r} already holds GPUs "
                    f"{', '.join(self._by_owner[request.owner])}; release them first"
                )
            if admit is not None and request.count:
                admit(self._by_owner)
            chosen = place_in(self._free_state(index), self._by_uuid.keys(), request) if request.count else ()
            if chosen:
                self._record(request.owner, tuple(gpu.uuid for gpu in chosen))
        self._notify()
        return chosen

    def claim(self, owner: str, holdings: Mapping[str, int], admit: Admit | None = None) -> tuple[str, ...]:
        """Record that ``owner`` holds GPUs the cluster places: ``holdings`` is resource -> count.

        For backends whose scheduler picks the exact GPUs (gpu-kube): the hub
        only counts them, as :func:`cluster_tokens`. ``admit`` (the quota
        check) is called under the lock with owner -> held keys first, exactly
        as in :meth:`reserve`; whatever it raises refuses the claim and nothing
        is recorded. :class:`ValueError` when the owner already holds
        something; a claim of no GPU records nothing and returns ``()``.
        """
        tokens = cluster_tokens(owner, {r: n for r, n in holdings.items() if n > 0})
        with self._lock:
            if owner in self._by_owner:
                raise ValueError(
                    f"{owner!r} already holds GPUs {', '.join(self._by_owner[owner])}; release them first"
                )
            if tokens:
                if admit is not None:
                    admit(self._by_owner)
                self._record(owner, tokens)
        self._notify()
        return tokens

    def adopt(self, owner: str, uuids: Iterable[str]) -> tuple[str, ...]:
        """Restore ``owner``'s allocation after a hub restart.

        UUIDs come from spawner state or container labels. Those already held
        by another owner are not taken over; they are returned, so the caller
        can log the conflict. Adopting UUIDs the owner already holds changes
        nothing, and new ones are added to what the owner holds.
        """
        wanted = tuple(dict.fromkeys(uuids))  # unique, in order
        with self._lock:
            refused = tuple(u for u in wanted if self._by_uuid.get(u, owner) != owner)
            current = self._by_owner.get(owner, ())
            added = tuple(u for u in wanted if u not in refused and u not in self._by_uuid)
            if added:
                self._record(owner, current + added)
        self._notify()
        return refused

    def release(self, owner: str) -> tuple[str, ...]:
        """Free everything ``owner`` holds and return those UUIDs; ``()`` if nothing."""
        with self._lock:
            uuids = self._by_owner.pop(owner, ())
            since = self._since.pop(owner, None)
            for uuid in uuids:
                del self._by_uuid[uuid]
            if self._free is not None:
                self._free.give(uuids)
            if uuids:
                self._events.append(("release", owner, uuids, since))
        self._notify()
        return uuids

    def transfer(self, owner: str, to: str) -> tuple[str, ...]:
        """Move everything ``owner`` holds to ``to`` in one step, and return those UUIDs.

        No other request can take the GPUs in between (e.g. a stopped server's GPUs
        that stay out of service). :class:`ValueError` when ``to`` already holds
        something; ``()`` when ``owner`` holds nothing.
        """
        with self._lock:
            if to in self._by_owner:
                raise ValueError(f"{to!r} already holds GPUs {', '.join(self._by_owner[to])}")
            uuids = self._by_owner.pop(owner, ())
            since = self._since.pop(owner, None)
            if uuids:
                self._events.append(("release", owner, uuids, since))
                self._by_owner[to] = uuids
                self._since[to] = now = self._clock()
                for uuid in uuids:
                    self._by_uuid[uuid] = to
                self._events.append(("hold", to, uuids, now))
        self._notify()
        return uuids

    def holder(self, uuid: str) -> str | None:
        """The owner holding ``uuid``, or ``None``."""
        with self._lock:
            return self._by_uuid.get(uuid)

    def allocations(self) -> dict[str, tuple[str, ...]]:
        """A copy of owner -> held UUIDs."""
        with self._lock:
            return dict(self._by_owner)

    def since(self, owner: str) -> float | None:
        """When ``owner`` started holding GPUs (seconds since the epoch), or ``None``."""
        with self._lock:
            return self._since.get(owner)

    def held(self) -> frozenset[str]:
        """Every UUID held by anyone."""
        with self._lock:
            return frozenset(self._by_uuid)

    def _record(self, owner: str, uuids: tuple[str, ...]) -> None:
        """Set ``owner``'s UUIDs, updating both maps; the lock must be held."""
        self._by_owner[owner] = uuids
        since = self._since.setdefault(owner, self._clock())
        for uuid in uuids:
            self._by_uuid[uuid] = owner
        self._events.append(("hold", owner, uuids, since))
        if self._free is not None:
            self._free.take(uuids)

    def _free_state(self, index: PlacementIndex) -> FreeState:
        """Placement's free state for this inventory reading; the lock must be held.

        Built (O(inventory)) when the reading is a new object, e.g. every
        ``gpu_inventory_ttl`` seconds; between readings it is updated as GPUs
        are taken and released, so a decision does not walk the inventory.
        """
        if self._free is None or self._free.index is not index:
            self._free = FreeState(index, self._by_uuid)
        return self._free
