"""The hub's GPU queue: spawns of ``queue: true`` profiles wait here for free GPUs.

One queue per hub, owned by its :class:`~gpuspawner.state.HubState`.

Order: first come, first served, with fairness across users. Each waiting
request gets a rank when it joins: how many requests of the same user are
already waiting. Requests are served by (rank, arrival), so a user's second
request never goes ahead of another user's first. Under fair share
(:attr:`GPUQueue.fair_share`, ``gpu_queue_order = "fair-share"``) each request is first
ordered by its user's recent GPU use (:mod:`gpuspawner.fairshare`), looked at again
whenever the queue is woken and at each re-check; (rank, arrival) break ties. Before all
of that, a request whose user's GPU-hour budget is spent (``gpu_budget_exhausted =
"queue-last"``) joins ``last``: behind every request that is not.

Requests compete only when they could use the same GPU models, so a queue of
A100 requests does not hold back a T4 request. A request with no competing
request ahead of it may place on any free GPU. One behind competing requests
waits for them (``"off"``, the default), or backfills (:meth:`GPUQueue.room`,
:data:`BACKFILL`): with ``"first-fit"`` it starts wherever it fits now (among
the requests that fit, queue order decides, and one that cannot fit yet, such
as 4 GPUs on one host, holds nobody back); with ``"nearest-host"`` only outside
the (host, model) groups the requests ahead are nearest to fitting, so a 4-GPU
request draining a host keeps it. Where the hub does not know which GPUs are
held (gpu-kube counts them), the order is strict.
The queue is woken whenever GPUs are released (:meth:`GPUQueue.wake`) and
re-checks every few seconds in case GPUs came back some other way (health,
inventory).

Nothing here knows about JupyterHub: the spawner passes functions that read the
inventory and place a request (see ``backends/policies.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .fairshare import FairShare, duration, ordinal
from .gpu import GPU, model_slug, slug_matches
from .profiles import Choice, Profile
from .refusals import WAITABLE, PlacementError, refuse  # WAITABLE: codes a wait can cure; others end the wait

__all__ = ["BACKFILL", "WAITABLE", "WORDS", "GPUQueue", "Known", "QueueTimeout", "Waiter", "known_for",
           "queue_alternatives"]


T = TypeVar("T")

#: How a request behind competing ones may start (``gpu_queue_backfill``; :meth:`GPUQueue.room`).
BACKFILL = ("off", "first-fit", "nearest-host")

#: Seconds (the queue's clock) between two looks at the users' recent use under fair share, however
#: many waiting requests look at the order meanwhile (1,000 waiting, 2,000 holders: a look takes 2-4 ms,
#: `scripts/bench fair_share`).
REORDER_EVERY = 1.0


class QueueTimeout(PlacementError):
    """No GPU became free within the queue's limit (code ``queue_timeout``)."""


def _utc_time(at: float, now: float) -> str:
    """``at`` as a user reads it: "14:05 UTC" on the same UTC day as ``now``, else with its date."""
    same_day = time.gmtime(at)[:3] == time.gmtime(now)[:3]
    return time.strftime("%H:%M UTC" if same_day else "%Y-%m-%d %H:%M UTC", time.gmtime(at))


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
    #: its last :class:`~gpuspawner.estimate.Estimate` (None before the first), made by the queue's ``known``
    estimate: Any = field(default=None, repr=False)
    #: its user's recent GPU use (GPU-hours, decayed) under fair share, as last ordered; 0 by arrival
    share: float = 0.0
    #: its user's GPU-hour budget is spent (``gpu_budget_exhausted = "queue-last"``): behind every request that is not
    last: bool = False

    @property
    def key(self) -> tuple[bool, float, int, int]:
        return (self.last, self.share, self.rank, self.seq)


def _accepts(models: tuple[str, ...], slug: str) -> bool:
    return not models or "any" in models or any(slug_matches(p, slug) for p in models)


class _Wanted:
    """Which inventory models each request pattern accepts, computed once per inventory look."""

    def __init__(self, gpus: Iterable[GPU]) -> None:
        self.slugs = frozenset(model_slug(name) for name in {g.name for g in gpus})
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


#: Every sentence the queue says to a waiting user (their spawn's progress), key -> template.
WORDS: dict[str, str] = {
    "waiting": "Waiting for a free GPU: number {position} in the queue ({position} of {waiting} waiting for "
               "these GPUs); {gpus}. {when}.",
    "gpus": "{held} of {total} {what} held",
    "pace": "About {minutes}, at the pace of the last {served} requests served from the queue",
    "job_ends": "The first could free by {time}, when a notebook job holding one reaches its time limit",
    "no_end": "No server here has a time limit, so no end time is known",
    "waiting_why": "Waiting for a free GPU: {why}; {position} of {waiting} waiting for these GPUs; {gpus}. {when}.",
    "arrival": "{nth} in the queue: first come, first served, each user's first request before anyone's second",
    "fair_share": "{nth} in the queue: fair share puts users with less recent GPU use first (your recent use: "
                  "{used} GPU-hours, use {half_life} ago counting half)",
    "budget_last": "{nth} in the queue: your GPU budget is spent, so every request of a user with budget left "
                   "goes first",
}


def queue_alternatives(profiles: Iterable[Profile], choice: Choice) -> list[Choice]:
    """The choices of ``profiles`` that wait in the queue for what ``choice`` asks: the same GPU count,
    of the model asked for (a profile of any model where any was asked for), in ``profiles``' order.

    Whether one could ever be served here is the backend's to say (its ``never_fits``).
    """
    found = []
    for profile in profiles:
        if not profile.queue or profile == choice.profile or choice.gpus not in profile.gpu_counts:
            continue
        wanted = choice.models or ("any",)
        model = next((m for m in wanted if profile.allows_model(m)), None)
        if model is not None:
            found.append(Choice(profile, choice.gpus, model))
    return found


@dataclass(frozen=True)
class Known:
    """What the queue knows about the GPUs a waiting request wants, as its words say it.

    ``total``: those GPUs in service; ``held``: of them, held now; ``what``: "GPUs" or a model's
    name; ``ends``: the earliest a holder of one must give it back (seconds since the epoch: a
    notebook job's start plus its time limit), None when no holder has a time limit.
    """

    total: int = 0
    held: int = 0
    what: str = "GPUs"
    ends: float | None = None
    estimate: Any = None  # the request's :class:`~gpuspawner.estimate.Estimate`, where one was made


def known_for(
    waiter: Waiter, gpus: Iterable[GPU], holders: dict[str, str], limits: dict[str, float],
) -> Known:
    """:class:`Known` for ``waiter`` from the inventory, ``holders`` (GPU UUID -> owner) and ``limits``
    (owner -> the latest time it gives its GPUs back, for owners that have a time limit)."""
    gpus = tuple(gpus)
    wanted = _Wanted(gpus)(waiter.models)
    mine = [g for g in gpus if g.healthy and model_slug(g.name) in wanted]
    names = {g.name for g in mine}
    held = [holders[g.uuid] for g in mine if g.uuid in holders]
    ends = [limits[owner] for owner in held if owner in limits]
    what = next(iter(names)) if len(names) == 1 else "GPUs"
    return Known(len(mine), len(held), what, min(ends, default=None))


class GPUQueue:
    """Waiting GPU requests in fair order; the event loop's own object (not thread-safe across loops)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waiters: list[Waiter] = []
        self._seq = itertools.count()
        self._served: deque[float] = deque(maxlen=10)
        self._fair_share: FairShare | None = None
        self._version = 0  # changes when a request joins or the rule changes
        self._ordered: tuple[int, float] | None = None  # (version, clock) of the last sort

    @property
    def fair_share(self) -> FairShare | None:
        """None: by arrival; else the users' recent use to order by (``gpu_queue_order = "fair-share"``)."""
        return self._fair_share

    @fair_share.setter
    def fair_share(self, value: FairShare | None) -> None:
        if value is not self._fair_share:
            self._fair_share = value
            self._version += 1

    # ------------------------------------------------------------ membership

    def join(self, owner: str, user: str, count: int, models: tuple[str, ...] = (), profile: str = "",
             last: bool = False) -> Waiter:
        """Add a request at the back of its user's rank (``last``: behind every request that is not last)."""
        rank = sum(1 for w in self._waiters if w.user == user)
        waiter = Waiter(owner, user, count, tuple(models), rank, next(self._seq), profile, last=last)
        self._waiters.append(waiter)
        self._version += 1
        self.reorder()
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """Remove a request (served, refused, timed out or cancelled) and let the others move up."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self.wake()

    def wake(self) -> None:
        """GPUs may have been released: every waiter looks again (in the order as it is now)."""
        self.reorder()
        for waiter in self._waiters:
            waiter.event.set()

    def __len__(self) -> int:
        return len(self._waiters)

    def waiters(self) -> list[Waiter]:
        """The waiting requests, in the order they will be served."""
        return list(self._waiters)

    # ------------------------------------------------------------ order

    def reorder(self) -> None:
        """Sort the waiting requests: by each user's recent use now under :attr:`fair_share`, then (rank,
        arrival); by arrival alone every request keeps ``share`` 0. Only after a join or a change of rule, and
        under fair share at most every :data:`REORDER_EVERY` seconds (a request leaving keeps the order)."""
        now, last = self._clock(), self._ordered
        if last is not None and last[0] == self._version and (
                self._fair_share is None or now - last[1] < REORDER_EVERY):
            return
        self._ordered = (self._version, now)
        use = self.fair_share.use({w.user for w in self._waiters}) if self.fair_share is not None else {}
        for w in self._waiters:
            w.share = use.get(w.user, 0.0)
        self._waiters.sort(key=lambda w: w.key)

    def _place_of(self, waiter: Waiter) -> tuple[float, float, float, float]:
        """Where ``waiter``, not in the queue, would join it now: behind everyone by arrival, else by its
        user's recent use, behind its equals (and behind every request that is not ``last``, if it is)."""
        if self.fair_share is None:
            return (math.inf, math.inf, math.inf, math.inf)
        self.reorder()
        share = self.fair_share.use((waiter.user,)).get(waiter.user, 0.0)
        return (waiter.last, share, sum(1 for w in self._waiters if w.user == waiter.user), math.inf)

    def why(self, waiter: Waiter, position: int) -> str:
        """Why ``waiter`` is ``position``-th: the rule the queue orders by, in words."""
        if waiter.last:
            return WORDS["budget_last"].format(nth=ordinal(position))
        if self.fair_share is None:
            return WORDS["arrival"].format(nth=ordinal(position))
        used = f"{waiter.share:.1f}" if waiter.share == 0 or waiter.share >= 0.05 else "less than 0.1"
        return WORDS["fair_share"].format(nth=ordinal(position), used=used,
                                          half_life=duration(self.fair_share.half_life))

    def ahead(self, count_models: tuple[str, ...], gpus: Iterable[GPU], before: Waiter | None = None) -> list[Waiter]:
        """Waiting requests (ahead of ``before``, or all) that want some of the same GPU models."""
        wanted = _Wanted(gpus)
        mine = wanted(tuple(count_models))
        found = []
        place = self._place_of(before) if before is not None and before not in self._waiters else None
        for w in self._waiters:
            if w is before or (place is not None and w.key > place):
                break
            if w.count and not mine.isdisjoint(wanted(w.models)):
                found.append(w)
        return found

    def room(self, waiter: Waiter, gpus: Iterable[GPU], held: Collection[str],
             backfill: str = "off") -> tuple[GPU, ...] | None:
        """The GPUs ``waiter`` may try to place on now (``held``: the UUIDs given out), or None.

        All of ``gpus`` when no competing request is ahead of it. Behind others, by ``backfill``
        (:data:`BACKFILL`): ``"first-fit"``, all of them where some (host, model) group of a model
        it accepts has ``waiter.count`` free GPUs; ``"nearest-host"``, the GPUs outside the groups
        the requests ahead are nearest to fitting (per request ahead, of the groups with enough
        healthy GPUs for it, those with the most free GPUs; all of them on a tie, so behind a
        blocked 1-GPU request the order is strict), where one of the other groups has room for it;
        ``"off"``, none.
        """
        gpus = tuple(gpus)
        ahead = self.ahead(waiter.models, gpus, before=waiter)
        if not ahead:
            return gpus
        if backfill not in BACKFILL:
            raise ValueError(f"backfill must be one of {', '.join(BACKFILL)}, not {backfill!r}")
        if backfill == "off":
            return None
        wanted = _Wanted(gpus)
        groups: dict[tuple[str, str], list[GPU]] = {}
        for gpu in gpus:
            if gpu.healthy:
                groups.setdefault((gpu.host, model_slug(gpu.name)), []).append(gpu)
        free = {key: sum(1 for g in members if g.uuid not in held) for key, members in groups.items()}
        kept: set[tuple[str, str]] = set()
        for other in ahead if backfill == "nearest-host" else ():
            fits = [key for key, members in groups.items() if key[1] in wanted(other.models)
                    and len(members) >= other.count]
            most = max((free[key] for key in fits), default=0)
            kept.update(key for key in fits if free[key] == most)
        mine = wanted(waiter.models)
        if not any(key not in kept and key[1] in mine and free[key] >= waiter.count for key in groups):
            return None
        return tuple(g for g in gpus if (g.host, model_slug(g.name)) not in kept) if kept else gpus

    def position(self, waiter: Waiter, gpus: Iterable[GPU]) -> int:
        """1 + the number of competing requests ahead of ``waiter``."""
        return 1 + len(self.ahead(waiter.models, gpus, before=waiter))

    def estimate(self, position: int) -> float | None:
        """Seconds until a request at ``position`` is served, from the pace of recent serves; None if unknown."""
        if len(self._served) < 2:
            return None
        gap = (self._served[-1] - self._served[0]) / (len(self._served) - 1)
        return max(gap, 1.0) * position

    def describe(self, position: int, waiting: int = 0, known: Known | None = None, now: float | None = None,
                 why: str | None = None) -> str:
        """What a request at ``position`` of ``waiting`` (for the same GPUs) is told, and what it rests on.

        The request's estimate where ``known`` has one (:mod:`gpuspawner.waits`); else the pace of the
        last serves when the queue has served two or more; else when the first of
        those GPUs must come back (``known.ends``: a job's time limit), or that no end is known.
        ``now`` (epoch seconds, default the wall clock) decides whether that time needs its date.
        ``why``: the place and its rule in words (:meth:`why`), said instead of the bare number.
        """
        known = known or Known()
        now = time.time() if now is None else now
        estimate = self.estimate(position)
        if known.estimate is not None:
            when = f"{known.estimate.when(now)}. {known.estimate.basis}"
        elif estimate is not None:
            when = WORDS["pace"].format(minutes=_minutes(estimate), served=len(self._served))
        elif known.ends is not None:
            when = WORDS["job_ends"].format(time=_utc_time(known.ends, now))
        else:
            when = WORDS["no_end"]
        gpus = WORDS["gpus"].format(held=known.held, total=known.total, what=known.what)
        if why is not None:
            return WORDS["waiting_why"].format(why=why, position=position, waiting=max(waiting, position),
                                               gpus=gpus, when=when)
        return WORDS["waiting"].format(position=position, waiting=max(waiting, position), gpus=gpus, when=when)

    # ------------------------------------------------------------ waiting

    async def serve(
        self,
        waiter: Waiter,
        read_inventory: Callable[[], Awaitable[tuple[GPU, ...]]],
        place: Callable[[tuple[GPU, ...]], T],
        timeout: float,
        report: Callable[[int, str], None] = lambda position, text: None,
        recheck: float = 5.0,
        known: Callable[[Waiter, tuple[GPU, ...]], Known] | None = None,
        held: Callable[[], Collection[str]] | None = None,
        backfill: str = "off",
    ) -> T:
        """Wait until ``place`` succeeds on the GPUs :meth:`room` lets ``waiter`` use.

        ``place`` runs synchronously right after the order was checked (no
        await in between); with no competing request ahead, a :class:`PlacementError` whose code
        is not in :data:`WAITABLE` ends the wait (behind others, any refusal waits: it may come
        from the narrower room). ``held`` (the UUIDs given out, where the hub knows them) allows
        ``backfill`` (:meth:`room`); without it a request places only when no competing request is
        ahead. Raises
        :class:`QueueTimeout` after ``timeout`` seconds. Always leaves the queue, also when
        cancelled. ``known`` says what the progress ``report`` rests on (:func:`known_for`).
        """
        deadline = self._clock() + timeout
        last_report: tuple[int, str] | None = None
        try:
            while True:
                waiter.event.clear()
                gpus = await read_inventory()
                self.reorder()
                first = not self.ahead(waiter.models, gpus, before=waiter)
                backfills = held is not None and backfill != "off"
                room = gpus if first else self.room(waiter, gpus, held(), backfill) if backfills else None
                if room is not None:
                    try:
                        result = place(room)
                    except PlacementError as e:
                        if e.code not in WAITABLE and first:
                            raise
                    else:
                        self._served.append(self._clock())
                        return result
                position = self.position(waiter, gpus)
                waiting = len(self.ahead(waiter.models, gpus))  # every request for these GPUs, this one too
                found = known(waiter, gpus) if known else None
                waiter.estimate = found.estimate if found else None
                why = self.why(waiter, position) if self.fair_share is not None or waiter.last else None
                text = self.describe(position, waiting, found, why=why)
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
