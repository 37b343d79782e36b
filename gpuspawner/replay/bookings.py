"""The replay with a booking load: are bookings honoured at their start, and what do they cost everyone else?

``python -m gpuspawner.replay --bookings`` adds to each synthetic day (policy ``gpuspawner``):

- a class: the group ``class`` (:data:`CLASS_SIZE` users) books half the A100s from 10 to 12 h;
  each member asks for one A100 in the window's first 10 minutes and computes until its end;
- two deadline runs: a user books 2 T4s from 14 to 17 h, another 2 A100s from 15 to 18 h; each
  asks in the first 10 minutes as a batch job that runs to the window's end.

The decisions are the hub's own: :func:`gpuspawner.bookings.verdicts` over the ledger's holders
(:func:`gpuspawner.bookings.kept`), booked GPUs left out of placement for the others, a booking's
own users placed without queueing, and a server admitted ``until`` a window stopped at its start
(its user asks again for the rest of the session at once, from the queue).

Three runs of the same days: **no bookings** (the ordinary sessions only), **asked, not booked**
(the booked sessions as ordinary requests), **booked**. Figures: the share of booked sessions
served at once (``honoured``, goal 100 %), the others' median and p95 wait, the servers stopped
at a window's start.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace

from ..bookings import Booking, Verdict, kept, verdicts
from ..gpu import GPU
from ..placement import PlacementError
from ..queue import WAITABLE
from ..quota import QuotaError
from ..refusals import refuse
from .simulation import Policy, _Live, _Replay
from .trace import Session

HOUR = 3600.0
CLASS_SIZE = 6
CLASS = "class"
_OK = Verdict("ok")


@dataclass(frozen=True)
class Booked:
    """A booking of the load and the sessions that use it."""

    booking: Booking
    sessions: tuple[Session, ...]


def booking_load(inventory: tuple[GPU, ...], seed: int, first_id: int = 1_000_000) -> list[Booked]:
    """The day's bookings (see the module docstring), their users' sessions jittered by ``seed``."""
    rng = random.Random(seed)
    a100 = sum(1 for g in inventory if g.model.startswith("a100"))
    t4 = sum(1 for g in inventory if g.model == "t4")
    ids = iter(range(first_id, first_id + 1000))
    out = []

    def sessions(users: list[str], count: int, model: str, start: float, end: float, job: bool) -> tuple:
        made = []
        for user in users:
            arrive = start + rng.uniform(0, 600)
            made.append(Session(next(ids), user, arrive, count, (model,), [("active", end - arrive)], job=job))
        return tuple(made)

    if a100 >= 2:
        members = [f"class-{n}" for n in range(CLASS_SIZE)]
        count = a100 // 2
        b = Booking(id="b-class", group=CLASS, booked_by="teacher", model="a100-sxm4-80gb", count=count,
                    start=10 * HOUR, end=12 * HOUR)
        out.append(Booked(b, sessions(members[:count], 1, "a100", b.start, b.end, job=False)))
    if t4 >= 2:
        b = Booking(id="b-t4", user="deadline-t4", booked_by="deadline-t4", model="t4", count=2,
                    start=14 * HOUR, end=17 * HOUR)
        out.append(Booked(b, sessions([b.user], 2, "t4", b.start, b.end, job=True)))
    if a100 >= 4:
        b = Booking(id="b-a100", user="deadline-a100", booked_by="deadline-a100", model="a100-sxm4-80gb",
                    count=2, start=15 * HOUR, end=18 * HOUR)
        out.append(Booked(b, sessions([b.user], 2, "a100", b.start, b.end, job=True)))
    return out


class _BookingReplay(_Replay):
    """:class:`_Replay` whose placement honours ``bookings`` as the hub's does (backends/policies.py)."""

    def __init__(self, sessions: list[Session], inventory: tuple[GPU, ...], policy: Policy, hours: float,
                 bookings: list[Booking] | None = None) -> None:
        super().__init__(sessions, inventory, policy, hours)
        self.bookings = list(bookings or [])
        self.admitted: dict[str, float] = {}  # owner -> until
        self.stopped_for_booking = 0
        self.capacity: dict[str, int] = {}
        for g in inventory:
            self.capacity[g.model] = self.capacity.get(g.model, 0) + 1
        self.model_of = {g.uuid: g.model for g in inventory}

    def said(self, live: _Live) -> dict[str, Verdict]:
        groups = {CLASS} if live.s.user.startswith("class-") else set()
        holders = [(owner.split("/", 1)[0], {CLASS} if owner.startswith("class-") else set(), self.model_of[u])
                   for owner, uuids in self.ledger.allocations().items() if owner not in self.admitted
                   for u in uuids]
        ends_by = self.now + live.s.planned if live.s.job else None
        return verdicts(self.bookings, self.capacity, live.s.user, groups, live.s.models, live.s.count, self.now,
                        ends_by, kept(self.bookings, holders, self.now), live.s.job)

    def place(self, live: _Live, room: tuple[GPU, ...] | None = None) -> None:
        said = self.said(live)
        blocked = [v for v in said.values() if not v.ok]
        usable = tuple(g for g in (self.inventory if room is None else room) if said.get(g.model, _OK).ok)
        try:
            super().place(live, usable)
        except PlacementError as e:
            if blocked and not isinstance(e, QuotaError) and e.code not in WAITABLE:
                raise refuse("booked", {"sentence": blocked[0].message}) from e
            raise
        held = self.ledger.allocations().get(live.s.owner, ())
        verdict = said.get(self.model_of[held[0]]) if held else None
        if verdict is not None and verdict.kind == "until":
            self.admitted[live.s.owner] = verdict.until
            self.at(verdict.until, "booking-stop", live, live.generation + 1)  # granted() bumps the generation

    def ask(self, live: _Live) -> None:
        if self.policy.queue and any(v.kind == "ok" and v.booking is not None for v in self.said(live).values()):
            live.tries += 1  # a booking's own user: placed at once, never queued
            self.live[live.s.owner] = live
            self.place_now(live)
            return
        super().ask(live)

    def release(self, live: _Live) -> None:
        self.admitted.pop(live.s.owner, None)
        super().release(live)

    def other(self, what: str, live: _Live | None, generation: int) -> None:
        if what == "booking-stop" and live is not None and live.generation == generation and live.held:
            self.stopped_for_booking += 1
            rest = live.spans
            self.release(live)
            if rest:  # the user asks again at once for the rest of the session
                self.at(self.now, "arrive", _Live(replace(live.s, id=live.s.id + 500_000, arrive=self.now,
                                                          spans=rest)))


@dataclass
class BookingFigures:
    run: str
    booked_sessions: int
    honoured_pct: float
    others_median_wait_min: float
    others_p95_wait_min: float
    others_served: int
    refusals: int
    gave_up: int
    stopped_for_booking: int


COLUMNS = [("run", "run", "{}"), ("booked_sessions", "booked sessions", "{}"),
           ("honoured_pct", "served at once %", "{:.0f}"), ("others_median_wait_min", "others' median wait min",
                                                             "{:.1f}"),
           ("others_p95_wait_min", "others' p95 wait min", "{:.1f}"), ("others_served", "others served", "{}"),
           ("refusals", "refusals", "{}"), ("gave_up", "gave up", "{}"),
           ("stopped_for_booking", "stopped at a window", "{}")]


def _figures(run: str, replays: list[_Replay], booked: set[str]) -> BookingFigures:
    waits, at_once, asked = [], 0, 0
    for r in replays:
        for owner, wait in r.granted_waits:
            if owner in booked:
                at_once += wait <= 1.0
            else:
                waits.append(wait)
        asked += sum(1 for s in r.sessions if s.owner in booked)
    waits.sort()
    return BookingFigures(
        run=run, booked_sessions=asked, honoured_pct=100.0 * at_once / asked if asked else 0.0,
        others_median_wait_min=round(statistics.median(waits) / 60, 1) if waits else 0.0,
        others_p95_wait_min=round(waits[min(len(waits) - 1, int(0.95 * len(waits)))] / 60, 1) if waits else 0.0,
        others_served=len(waits), refusals=sum(r.refusals for r in replays), gave_up=sum(r.gave_up for r in replays),
        stopped_for_booking=sum(getattr(r, "stopped_for_booking", 0) for r in replays))


def measure(days: list[list[Session]], inventory: tuple[GPU, ...], policy: Policy,
            hours: float = 24.0) -> list[BookingFigures]:
    """The three runs of the module docstring over ``days`` (each day's load seeded by its index)."""
    loads = [booking_load(inventory, seed) for seed in range(len(days))]
    booked = {s.owner for load in loads for b in load for s in b.sessions}
    plain = [_Replay(d, inventory, policy, hours).run() for d in days]
    asked = [_Replay(sorted(d + [s for b in load for s in b.sessions], key=lambda s: s.arrive), inventory,
                     policy, hours).run() for d, load in zip(days, loads, strict=True)]
    honoured = [_BookingReplay(sorted(d + [s for b in load for s in b.sessions], key=lambda s: s.arrive),
                               inventory, policy, hours, [b.booking for b in load]).run()
                for d, load in zip(days, loads, strict=True)]
    return [_figures("no bookings", plain, booked), _figures("asked, not booked", asked, booked),
            _figures("booked", honoured, booked)]
