"""What users do with a long wait estimate, in the replay (``python -m gpuspawner.replay --choices``).

The hub shows each ``queue: true`` profile's estimate on the spawn form ("If you queue now: about
10:40 UTC ...", :func:`gpuspawner.waits.if_queued_now`), and a refused spawn's pointer names the
queued profiles that would serve it. Here a user about to queue looks at those estimates first,
made by the same :func:`~gpuspawner.estimate.for_gpus` the hub calls (:func:`~gpuspawner.replay.estimates.estimator`,
from a history recorded on other days), for the request as asked and, where the request allows any
model (the trace's ``any``), for each model of the inventory alone (its own profile on the form):

- where the estimate for the request as asked is within the user's ``patience``, they queue as asked;
- else, where another model's estimate is sooner and within ``patience``, they take that model;
- else they come back at the soonest estimate (with that model) and look again; after
  :data:`MAX_DEFERRALS` returns they queue whatever it says.

**Or book** (the rows "users choose or book"): where the rules above send a user away, they book
instead, through the hub's own booking rules (:mod:`gpuspawner.bookings`): ``count`` GPUs of that
model (``any`` for an any-model request) from the soonest estimate, on the next 5 minutes, for the
session's planned length (at most the hub's longest window), as :func:`~gpuspawner.bookings.check_new`
takes it for a user (default :class:`~gpuspawner.bookings.BookingLimits`), else 30, 60 and 90 minutes
later; where none is taken they come back as above. They ask a minute into the window, and are
placed at once, never queued, as a booking's own user is; everyone else is placed by
:func:`~gpuspawner.bookings.verdicts` (a server admitted ``until`` a window is stopped at its start).
A window none of its users holds GPUs in past the grace period is released, as the hub does.
What the rules do not do: move a holder admitted before the booking was made, with no end; such
a holder keeps its GPUs through the window, and the booked user is refused and retries.

Figures (:class:`ChoiceFigures`), per policy: p95 of the wait of those who queued (from when they
decided to queue, their first try or their return, to their start, less any time away), p95 and
median of "asked -> started" for everyone (from their first try, time away included, so demand
that moved is not hidden), held-idle, users who took another model, users who came back at their
estimate, windows booked and how many of their users started at the window (a minute in), and culled
users who came back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..bookings import ANY, Booking, BookingError, BookingLimits, check_new, holding
from ..estimate import History
from ..gpu import GPU
from .bookings import _BookingReplay
from .estimates import estimator, fit
from .simulation import Policy, _Live, _Replay, _result
from .trace import MODELS, Session

#: how many times a user comes back at the estimate before queueing whatever it says
MAX_DEFERRALS = 3
#: with bookings: how many window starts (30 minutes apart) a user tries before coming back instead
BOOKING_TRIES = 4
#: with bookings: seconds after its window's start that a user asks for the booked GPUs
ARRIVE_AFTER = 60.0

#: the columns of the choices table (attribute, title, format)
COLUMNS = [("policy", "policy", "{}"), ("held_idle_pct", "held-idle %", "{:.1f}"),
           ("p95_queued_min", "p95 wait, queued min", "{:.1f}"),
           ("p95_asked_min", "p95 asked -> started min", "{:.1f}"),
           ("median_asked_min", "median asked -> started min", "{:.1f}"),
           ("other_model", "took another model", "{}"), ("later", "came back at the estimate", "{}"),
           ("booked", "booked a window", "{}"), ("honoured", "started at the window", "{}"),
           ("gave_up", "gave up", "{}"), ("came_back", "culled, came back", "{}")]


@dataclass
class ChoiceFigures:
    policy: str
    held_idle_pct: float
    p95_queued_min: float
    p95_asked_min: float
    median_asked_min: float
    other_model: int
    later: int
    booked: int
    honoured: str  # "N of M" bookings whose user started at the window's start; "-" where none could book
    gave_up: int
    came_back: int


class _Choosing(_Replay):
    """A replay whose users look at the estimates before they queue (the module's rules)."""

    def __init__(self, sessions: list[Session], inventory: tuple[GPU, ...], policy: Policy, hours: float,
                 history: History, patience: float) -> None:
        super().__init__(sessions, inventory, policy, hours)
        self.estimate_of = estimator(history)
        self.patience = patience
        self.models = [m for m, name in MODELS.items() if any(g.name == name for g in inventory)]
        self.queued_waits: list[float] = []
        self.other_model = self.later = 0
        # per request (the object itself, never its id: an id is reused once a request is gone)
        self.decided: dict[_Live, float] = {}  # when its user decided to queue
        self.deferrals: dict[_Live, int] = {}  # times its user came back later instead
        self.spent: dict[_Live, float] = {}  # time it waited in the queue before it went away

    def _likely(self, live: _Live, models: tuple[str, ...]) -> float:
        likely = self.estimate_of(self, _Live(replace(live.s, models=models))).likely
        return float("inf") if likely is None else likely

    def ask(self, live: _Live) -> None:
        if not self.policy.queue or self.deferrals.get(live, 0) >= MAX_DEFERRALS:
            self.decided.setdefault(live, self.now)
            super().ask(live)
            return
        asked = self._likely(live, live.s.models)
        if asked > self.now + self.patience:
            options = [(asked, live.s.models)]
            if live.s.models == ("any",):
                options += [(self._likely(live, (m,)), (m,)) for m in self.models]
            soonest, models = min(options)
            if soonest > self.now + self.patience and soonest < float("inf"):
                self.defer(live, soonest, models)
                return
            if models != live.s.models:
                self.other_model += 1
                live.s = replace(live.s, models=models)
        self.decided.setdefault(live, self.now)
        super().ask(live)

    def away(self, live: _Live) -> None:
        """``live``'s user goes away; a wait it had in the queue (up to the queue's limit) counts."""
        if live in self.decided:
            self.spent[live] = self.spent.get(live, 0.0) + self.now - self.decided.pop(live)

    def defer(self, live: _Live, soonest: float, models: tuple[str, ...]) -> None:
        """``live``'s user comes back at ``soonest``, the soonest estimate, and looks again."""
        self.later += live not in self.deferrals
        self.deferrals[live] = self.deferrals.get(live, 0) + 1
        self.away(live)
        self.at(soonest, "retry", live, live.generation)

    def granted(self, live: _Live) -> None:
        self.queued_waits.append(self.now - self.decided.pop(live, self.now) + self.spent.pop(live, 0.0))
        super().granted(live)


class _Booking(_Choosing, _BookingReplay):
    """Users who book a window instead of coming back later (the module's rules), under the hub's booking
    rules: :func:`gpuspawner.bookings.check_new` takes the booking, :func:`~gpuspawner.bookings.verdicts`
    places everyone (:class:`~gpuspawner.replay.bookings._BookingReplay`)."""

    def __init__(self, sessions: list[Session], inventory: tuple[GPU, ...], policy: Policy, hours: float,
                 history: History, patience: float) -> None:
        super().__init__(sessions, inventory, policy, hours, history, patience)
        self.limits = BookingLimits()
        self.slugs = {m: next(g.model for g in inventory if g.name == MODELS[m]) for m in self.models}
        self.booked_for: dict[_Live, Booking] = {}
        self.honoured = 0

    def ask(self, live: _Live) -> None:
        b = self.booked_for.get(live)
        if b is not None and holding(b, self.now):  # back at the window: placed at once, never queued
            self.decided.setdefault(live, self.now)
            _BookingReplay.ask(self, live)
            return
        super().ask(live)

    def book(self, live: _Live, soonest: float, models: tuple[str, ...]) -> Booking | None:
        """The first window from ``soonest`` (on the next 5 minutes, then every 30 minutes, for
        :data:`BOOKING_TRIES` starts) the hub takes for the session as planned; None if none."""
        model = ANY if models == ("any",) else self.slugs[models[0]]
        length = min(live.s.planned, self.limits.max_window)
        start = math.ceil(soonest / 300) * 300
        for n in range(BOOKING_TRIES):
            b = Booking(id=f"c-{live.s.id}-{n}", user=live.s.user, booked_by=live.s.user, model=model,
                        count=live.s.count, start=start + n * 1800, end=start + n * 1800 + length, created=self.now)
            try:
                check_new(b, self.bookings, self.limits, self.capacity, self.now, is_admin=False)
            except BookingError:
                continue
            return b
        return None

    def defer(self, live: _Live, soonest: float, models: tuple[str, ...]) -> None:
        b = None if live in self.booked_for else self.book(live, soonest, models)
        if b is None:
            super().defer(live, soonest, models)
            return
        self.booked_for[live] = b
        self.bookings = [o for o in self.bookings if o.last_end > self.now] + [b]
        if models != live.s.models:
            self.other_model += 1
            live.s = replace(live.s, models=models)
        self.away(live)
        self.at(b.start + ARRIVE_AFTER, "retry", live, live.generation)

    def granted(self, live: _Live) -> None:
        b = self.booked_for.get(live)
        if b is not None and b.start + ARRIVE_AFTER <= self.now <= b.start + ARRIVE_AFTER + 1:
            self.honoured += 1
        super().granted(live)

    def release(self, live: _Live) -> None:
        super().release(live)
        for b in self.bookings:  # the hub releases a window none of its users holds GPUs in, past the grace
            if b.user == live.s.user and b.state == "booked" and holding(b, self.now):
                self.at(max(self.now, b.start + self.limits.grace), "booking-unused", live)

    def other(self, what: str, live: _Live | None, generation: int) -> None:
        if what != "booking-unused" or live is None:
            super().other(what, live, generation)
            return
        if any(lv.held and lv.s.user == live.s.user for lv in self.live.values()):
            return
        self.bookings = [replace(b, state="released", released_at=self.now)
                         if b.user == live.s.user and b.state == "booked" and holding(b, self.now) else b
                         for b in self.bookings]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 60, 1) if ordered else 0.0


def measure(days: list[list[Session]], fit_days: list[list[Session]] | History, inventory: tuple[GPU, ...],
            policies: Iterable[Policy], patience: float, hours: float = 24.0) -> list[ChoiceFigures]:
    """Each policy on ``days`` as is, with users choosing by the estimates (drawn from the history the
    policy recorded on ``fit_days``, or that history itself), and with users who book instead of coming back."""
    out = []
    for policy in policies:
        history = fit_days if isinstance(fit_days, History) else fit(fit_days, inventory, policy, hours)
        plain = [_Replay(sessions, inventory, policy, hours).run() for sessions in days]
        chose = [_Choosing(sessions, inventory, policy, hours, history, patience).run() for sessions in days]
        book = [_Booking(sessions, inventory, policy, hours, history, patience).run() for sessions in days]
        for runs, name in ((plain, policy.name), (chose, f"{policy.name}, users choose"),
                           (book, f"{policy.name}, users choose or book")):
            result = _result(runs)
            queued = [w for r in runs for w in getattr(r, "queued_waits", r.waits)]
            booked = sum(len(getattr(r, "booked_for", ())) for r in runs)
            honoured = f"{sum(r.honoured for r in runs)} of {booked}" if runs is book else "-"
            out.append(ChoiceFigures(
                name, result.held_idle_pct, _p(queued, 0.95), result.p95_wait_min, result.median_wait_min,
                sum(getattr(r, "other_model", 0) for r in runs), sum(getattr(r, "later", 0) for r in runs),
                booked, honoured, result.gave_up, result.came_back))
    return out
