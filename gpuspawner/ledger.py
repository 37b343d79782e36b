"""Who holds which GPU, kept consistent under one lock.

JupyterHub runs every spawner of a hub in one process, one spawner object per
user server. They all consult the same :class:`Ledger` (the hub's
:class:`~gpuspawner.state.HubState` owns it) so that two concurrent spawns can
never be given the same GPU: choosing GPUs and recording them happen under one
lock, and the lock is never held across I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping

from gpuspawner.gpu import GPU
from gpuspawner.placement import GPURequest, place

__all__ = ["Ledger"]


class Ledger:
    """In-flight reservations and allocations, under one lock, so concurrent spawns never share a GPU.

    Two maps are kept in step: owner -> UUIDs and UUID -> owner. An owner
    appears only while it holds at least one GPU.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_owner: dict[str, tuple[str, ...]] = {}
        self._by_uuid: dict[str, str] = {}
        self._since: dict[str, float] = {}  # owner -> when it started holding (time.time())

    def reserve(
        self,
        inventory: Iterable[GPU],
        request: GPURequest,
        admit: Callable[[Mapping[str, tuple[str, ...]]], None] | None = None,
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
        with self._lock:
            if request.owner in self._by_owner:
                raise ValueError(
                    f"{request.owner!r} already holds GPUs "
                    f"{', '.join(self._by_owner[request.owner])}; release them first"
                )
            if admit is not None and request.count:
                admit(self._by_owner)
            chosen = place(gpus, self._by_uuid.keys(), request)
            if chosen:
                self._record(request.owner, tuple(gpu.uuid for gpu in chosen))
            return chosen

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
            return refused

    def release(self, owner: str) -> tuple[str, ...]:
        """Free everything ``owner`` holds and return those UUIDs; ``()`` if nothing."""
        with self._lock:
            uuids = self._by_owner.pop(owner, ())
            self._since.pop(owner, None)
            for uuid in uuids:
                del self._by_uuid[uuid]
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
        self._since.setdefault(owner, time.time())
        for uuid in uuids:
            self._by_uuid[uuid] = owner
