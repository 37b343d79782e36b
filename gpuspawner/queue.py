"""The hub's GPU queue: spawns of ``queue: true`` profiles wait here for free GPUs.

One queue per hub, owned by its :class:`~gpuspawner.state.HubState`.

Order: first come, first served, with fairness across users. Each waiting
request gets a rank when it joins: how many requests of the same user are
already waiting. Requests are served by (rank, arrival), so a user's second
request never goes ahead of another user's first.

Requests compete only when they could use the same GPU models; a request may
try to place only when no request ahead of it competes with it, so a queue of
A100 requests does not hold back a T4 request. The queue is woken whenever
GPUs are released (:meth:`GPUQueue.wake`) and re-checks every few seconds in
case GPUs came back some other way (health, inventory).

Nothing here knows about JupyterHub: the spawner passes functions that read the
inventory and place a request (see ``backends/policies.py``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from .gpu import GPU, model_slug, slug_matches
from .refusals import WAITABLE, PlacementError, refuse  # WAITABLE: codes a wait can cure; others end the wait

__all__ = ["GPUQueue", "QueueTimeout", "Waiter", "WAITABLE"]


T = TypeVar("T")


class QueueTimeout(PlacementError):
    """No GPU became free within the queue's limit (code ``queue_timeout``)."""


@dataclass(eq=False)
class Waiter:
    """One request waiting in the queue."""

    owner: str
    user: str
    count: int
    models: tuple[str, ...]
    rank: int
    seq: int
    profile: str = ""
    joined: float = field(default_factory=time.time)
    event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def key(self) -> tuple[int, int]:
        return (self.rank, self.seq)


@functools.lru_cache(maxsize=1024)
def _slug(name: str) -> str:
    return model_slug(name)


def _accepts(models: tuple[str, ...], slug: str) -> bool:
    return not models or "any" in models or any(slug_matches(p, slug) for p in models)


class _Wanted:
    """Which inventory models each request pattern accepts, computed once per inventory look."""

    def __init__(self, gpus: Iterable[GPU]) -> None:
        self.slugs = frozenset(_slug(name) for name in {g.name for g in gpus})
        self._cache: dict[tuple[str, ...], frozenset[str]] = {}

    def __call__(self, models: tuple[str, ...]) -> frozenset[str]:
        found = self._cache.get(models)
        if found is None:
            found = self._cache[models] = frozenset(s for s in self.slugs if _accepts(models, s))
        return found


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} seconds"
    return f"{round(seconds / 60)} minutes"


class GPUQueue:
    """Waiting GPU requests in fair order; the event loop's own object (not thread-safe across loops)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waiters: list[Waiter] = []
        self._seq = itertools.count()
        self._served: deque[float] = deque(maxlen=10)

    # ------------------------------------------------------------ membership

    def join(self, owner: str, user: str, count: int, models: tuple[str, ...] = (), profile: str = "") -> Waiter:
        """Add a request at the back of its user's rank."""
        rank = sum(1 for w in self._waiters if w.user == user)
        waiter = Waiter(owner, user, count, tuple(models), rank, next(self._seq), profile)
        self._waiters.append(waiter)
        self._waiters.sort(key=lambda w: w.key)
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """Remove a request (served, refused, timed out or cancelled) and let the others move up."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self.wake()

    def wake(self) -> None:
        """GPUs may have been released: every waiter looks again."""
        for waiter in self._waiters:
            waiter.event.set()

    def __len__(self) -> int:
        return len(self._waiters)

    def waiters(self) -> list[Waiter]:
        """The waiting requests, in the order they will be served."""
        return list(self._waiters)

    # ------------------------------------------------------------ order

    def ahead(self, count_models: tuple[str, ...], gpus: Iterable[GPU], before: Waiter | None = None) -> list[Waiter]:
        """Waiting requests (ahead of ``before``, or all) that want some of the same GPU models."""
        wanted = _Wanted(gpus)
        mine = wanted(tuple(count_models))
        found = []
        for w in self._waiters:
            if w is before:
                break
            if w.count and not mine.isdisjoint(wanted(w.models)):
                found.append(w)
        return found

    def position(self, waiter: Waiter, gpus: Iterable[GPU]) -> int:
        """1 + the number of competing requests ahead of ``waiter``."""
        return 1 + len(self.ahead(waiter.models, gpus, before=waiter))

    def estimate(self, position: int) -> float | None:
        """Seconds until a request at ``position`` is served, from the pace of recent serves; None if unknown."""
        if len(self._served) < 2:
            return None
        gap = (self._served[-1] - self._served[0]) / (len(self._served) - 1)
        return max(gap, 1.0) * position

    def describe(self, position: int) -> str:
        estimate = self.estimate(position)
        guess = f"about {_minutes(estimate)}" if estimate is not None else "no estimate yet"
        return f"Waiting for a free GPU: number {position} in the queue ({guess})"

    # ------------------------------------------------------------ waiting

    async def serve(
        self,
        waiter: Waiter,
        read_inventory: Callable[[], Awaitable[tuple[GPU, ...]]],
        place: Callable[[tuple[GPU, ...]], T],
        timeout: float,
        report: Callable[[int, str], None] = lambda position, text: None,
        recheck: float = 5.0,
    ) -> T:
        """Wait until ``waiter`` is first among its competitors and ``place`` succeeds.

        ``place`` runs synchronously right after the order was checked (no
        await in between); a :class:`PlacementError` whose code is not in
        :data:`WAITABLE` ends the wait. Raises :class:`QueueTimeout` after
        ``timeout`` seconds. Always leaves the queue, also when cancelled.
        """
        deadline = self._clock() + timeout
        last_report: tuple[int, str] | None = None
        try:
            while True:
                waiter.event.clear()
                gpus = await read_inventory()
                if not self.ahead(waiter.models, gpus, before=waiter):
                    try:
                        result = place(gpus)
                    except PlacementError as e:
                        if e.code not in WAITABLE:
                            raise
                    else:
                        self._served.append(self._clock())
                        return result
                position = self.position(waiter, gpus)
                text = self.describe(position)
                if (position, text) != last_report:
                    report(position, text)
                    last_report = (position, text)
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise refuse("queue_timeout", {"minutes": _minutes(timeout), "position": position},
                                 QueueTimeout, requested=waiter.count, models=waiter.models)
                try:
                    await asyncio.wait_for(waiter.event.wait(), min(remaining, recheck))
                except asyncio.TimeoutError:
                    pass
        finally:
            self.leave(waiter)
