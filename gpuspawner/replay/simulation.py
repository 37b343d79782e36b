"""One policy on a simulated clock through the hub's real decision code (see :mod:`gpuspawner.replay`):
:func:`replay` runs each day's sessions and pools the figures into a :class:`Result`."""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from ..fairshare import RecentUse, held_now, use_now
from ..gpu import GPU, GPUs
from ..idle import IdleTracker
from ..ledger import Ledger
from ..owner import user_of
from ..placement import GPURequest, PlacementError
from ..queue import BACKFILL, WAITABLE, GPUQueue, Waiter
from ..quota import Quota, check
from ..recommended import RECOMMENDED_CULLER, RECOMMENDED_QUEUE_TIMEOUT, RECOMMENDED_QUOTA_PER_USER
from .trace import Session

BUSY_UTILISATION = 80.0  # what the monitor reads while a session computes


@dataclass(frozen=True)
class Policy:
    """What the hub does with the trace."""

    name: str
    queue: bool
    gpu_culler: dict | None  # IdleTracker's settings (threshold, idle_timeout, warn_before, period) or None
    kernel_cull_after: float | None = None  # JupyterHub's idle culler (no warning), seconds without activity
    queue_timeout: float = RECOMMENDED_QUEUE_TIMEOUT
    quota_per_user: int | None = None
    retry_minutes: float = 10.0
    retries: int = 3
    backfill: str = "off"  # the queue's gpu_queue_backfill (GPUQueue.room)
    queue_order: str = "arrival"  # the queue's gpu_queue_order: "arrival" or "fair-share" (replay/fairness.py)
    half_life: float = 168.0  # gpu_fair_share_half_life, hours


def default_policies(timeouts: Iterable[float] = (900, 1800, 3600, 7200)) -> list[Policy]:
    """(a) JupyterHub's default, (b) gpuspawner as configured, and with the queue's other backfill rules,
    (c) the sweep."""
    out = [
        Policy("jupyterhub-default", queue=False, gpu_culler=None, kernel_cull_after=3600),
        Policy("gpuspawner", queue=True, gpu_culler=dict(RECOMMENDED_CULLER),
               quota_per_user=RECOMMENDED_QUOTA_PER_USER),
    ]
    for backfill in BACKFILL[1:]:
        out.append(replace(out[-1], name=f"gpuspawner, backfill {backfill}", backfill=backfill))
    for timeout in timeouts:
        for queue in (True, False):
            culler = {**RECOMMENDED_CULLER, "idle_timeout": timeout,
                      "warn_before": min(RECOMMENDED_CULLER["warn_before"], timeout / 3)}
            out.append(Policy(f"idle {timeout / 60:g} min, queue {'on' if queue else 'off'}", queue=queue,
                              gpu_culler=culler, quota_per_user=RECOMMENDED_QUOTA_PER_USER))
    return out


@dataclass
class Result:
    policy: str
    held_idle_pct: float
    median_wait_min: float
    p95_wait_min: float
    refusals: int
    gave_up: int
    utilisation_pct: float
    culled_warned: int
    culled_unwarned: int
    came_back: int
    served: int
    series: list[tuple[float, int, int, int]] = field(default_factory=list, repr=False)  # t, busy, idle, free

    def row(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "series"}


class _Live:
    """A session while it is asked for or held."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.spans = list(session.spans)
        self.first_try = session.arrive
        self.tries = 0
        self.waiter: Waiter | None = None
        self.held = False
        self.state = "waiting"  # active, cpu, away, abandoned, done
        self.span_end = math.inf
        self.last_active = -math.inf
        self.last_kernel = -math.inf
        self.generation = 0  # events of an older holding are ignored
        self.granted_at = math.inf
        self.enqueued = math.inf
        self.estimate: tuple | None = None  # (Estimate, enqueued at) where it waited and was estimated

    @property
    def profile(self) -> str:
        """The replay's profile: a notebook server or a batch job, of the model asked for."""
        return f"{'job' if self.s.job else 'server'}:{self.s.models[0] if self.s.models else 'any'}"


class _Replay:
    def __init__(self, sessions: list[Session], inventory: tuple[GPU, ...], policy: Policy, hours: float,
                 estimator: Callable[[_Replay, _Live], object] | None = None) -> None:
        self.now = 0.0
        self.end = hours * 3600
        self.inventory = GPUs(inventory)  # what placement derives from it is kept with it
        self.policy = policy
        self.ledger = Ledger(clock=lambda: self.now)
        self.queue = GPUQueue(clock=lambda: self.now)
        self.tracker = (IdleTracker(policy.gpu_culler["threshold"], policy.gpu_culler["idle_timeout"],
                                    policy.gpu_culler["warn_before"]) if policy.gpu_culler else None)
        self.events: list = []
        self.seq = itertools.count()
        self.live: dict[str, _Live] = {}
        self.waits: list[float] = []
        self.granted_waits: list[tuple[str, float]] = []  # (owner, wait) of every grant (replay/bookings.py)
        self.refusals = self.gave_up = self.warned_culls = self.unwarned_culls = self.came_back = 0
        self.busy_s = self.idle_s = 0.0
        self.series: list[tuple[float, int, int, int]] = []
        self.sessions = sessions
        self.estimator = estimator  # called when a request starts to wait in the queue (replay/estimates.py)
        self.lengths: list[tuple[str, str, float]] = []  # ended holdings: (profile, user, seconds), the history
        self.estimated: list[tuple[object, float, float]] = []  # (estimate, enqueued, started) of served waits
        self.unserved: list[tuple[object, float]] = []  # (estimate, enqueued) of waits that reached the queue's limit
        if policy.queue_order == "fair-share":
            self.order_by_fair_share(RecentUse(policy.half_life * 3600))

    def order_by_fair_share(self, recent: RecentUse) -> None:
        """The queue orders by each user's recent use (the hub's rule): what this day's releases ended, and
        what is held now, on the simulated clock."""
        model_of = {g.uuid: g.model for g in self.inventory}

        def released(event: str, owner: str, uuids: tuple[str, ...], since: float) -> None:
            if event == "release" and uuids:
                recent.add(user_of(owner), len(uuids), model_of.get(uuids[0], ""), since, self.now)

        def held() -> dict:
            return held_now(self.ledger.allocations(), self.ledger.since, user_of, model_of.__getitem__, self.now)

        self.ledger.observe(released)
        self.queue.fair_share = use_now(lambda: recent, recent.half_life, held, lambda: self.now)

    # ------------------------------------------------------------ the clock

    def at(self, t: float, what: str, live: _Live | None = None, generation: int = 0) -> None:
        heapq.heappush(self.events, (t, next(self.seq), what, live, generation))

    def advance(self, t: float) -> None:
        """Count busy and idle GPU-seconds from now to ``t``."""
        if t <= self.now:
            return
        busy = sum(lv.s.count for lv in self.live.values() if lv.held and lv.state == "active")
        held = sum(lv.s.count for lv in self.live.values() if lv.held)
        self.busy_s += busy * (t - self.now)
        self.idle_s += (held - busy) * (t - self.now)
        self.now = t

    def snapshot(self) -> None:
        busy = sum(lv.s.count for lv in self.live.values() if lv.held and lv.state == "active")
        held = sum(lv.s.count for lv in self.live.values() if lv.held)
        self.series.append((self.now, busy, held - busy, len(self.inventory) - held))

    # ------------------------------------------------------------ asking for GPUs

    def request(self, live: _Live) -> GPURequest:
        return GPURequest(owner=live.s.owner, count=live.s.count, models=live.s.models)

    def place(self, live: _Live, room: tuple[GPU, ...] | None = None) -> None:
        quota = Quota(live.s.user, self.policy.quota_per_user)
        request = self.request(live)
        self.ledger.reserve(self.inventory if room is None else room, request,
                            admit=lambda held: check(quota, request.count, held, request.owner))

    def ask(self, live: _Live) -> None:
        live.tries += 1
        self.live[live.s.owner] = live
        if self.policy.queue:
            try:
                waiting: dict[str, int] = {}
                for w in self.queue.waiters():
                    waiting[w.user] = waiting.get(w.user, 0) + w.count
                check(Quota(live.s.user, self.policy.quota_per_user), live.s.count, self.ledger.allocations(),
                      live.s.owner, waiting)
            except PlacementError:
                self.refused(live)
                return
            live.waiter = self.queue.join(live.s.owner, live.s.user, live.s.count, live.s.models, live.profile)
            live.enqueued = self.now
            self.at(self.now + self.policy.queue_timeout, "queue-timeout", live, live.generation)
            self.serve()
            if live.waiter is not None and self.estimator is not None:
                live.estimate = (self.estimator(self, live), self.now)
            return
        if self.queue.ahead(live.s.models, self.inventory):  # others queue for these GPUs: refused, as the hub does
            self.refused(live)
            return
        self.place_now(live)

    def place_now(self, live: _Live) -> None:
        """Place ``live`` at once: granted, or refused (and retried later, or given up)."""
        try:
            self.place(live)
        except PlacementError:
            self.refused(live)
            return
        self.granted(live)

    def serve(self) -> None:
        """Every waiter tries to place on the GPUs the queue lets it use (GPUQueue.serve's rule: all of
        them with no competing request ahead, else its backfill room, ``GPUQueue.room``), in the queue's
        order as it is now (``GPUQueue.reorder``: fair share changes it as GPUs are held)."""
        self.queue.reorder()
        for waiter in self.queue.waiters():
            live = self.live.get(waiter.owner)
            if live is None or live.waiter is not waiter:
                continue
            first = not self.queue.ahead(waiter.models, self.inventory, before=waiter)
            room = (self.inventory if first else
                    self.queue.room(waiter, self.inventory, self.ledger.held(), self.policy.backfill))
            if room is None:
                continue
            try:
                self.place(live, room)
            except PlacementError as e:
                if e.code in WAITABLE or not first:
                    continue
                self.queue.leave(waiter)
                live.waiter = None
                self.refused(live)
                continue
            self.queue.leave(waiter)
            live.waiter = None
            self.granted(live)

    def refused(self, live: _Live) -> None:
        self.refusals += 1
        if live.tries <= self.policy.retries:
            self.at(self.now + self.policy.retry_minutes * 60, "retry", live, live.generation)
        else:
            self.gave_up += 1
            self.live.pop(live.s.owner, None)

    def granted(self, live: _Live) -> None:
        self.waits.append(self.now - live.first_try)
        self.granted_waits.append((live.s.owner, self.now - live.first_try))
        live.granted_at = self.now
        if live.estimate is not None:
            self.estimated.append((*live.estimate, self.now))
            live.estimate = None
        live.held = True
        live.generation += 1
        self.next_span(live)

    # ------------------------------------------------------------ holding

    def next_span(self, live: _Live) -> None:
        if live.spans:
            kind, seconds = live.spans.pop(0)
            live.state, live.span_end = kind, self.now + seconds
            if kind == "active":
                live.last_active = self.now
            if kind in ("active", "cpu"):
                live.last_kernel = self.now
            self.at(live.span_end, "span", live, live.generation)
        elif live.s.stops:
            self.release(live)
        else:
            live.state, live.span_end = "abandoned", math.inf

    def end_span(self, live: _Live) -> None:
        if live.state == "active":
            live.last_active = self.now
        if live.state in ("active", "cpu"):
            live.last_kernel = self.now
        self.next_span(live)

    def release(self, live: _Live) -> None:
        self.lengths.append((live.profile, live.s.user, self.now - live.granted_at))
        live.held = False
        live.state = "done"
        live.generation += 1
        self.ledger.release(live.s.owner)
        self.live.pop(live.s.owner, None)
        if self.tracker is not None:
            self.tracker.forget_except(set(self.ledger.allocations()))
        self.serve()

    def cull(self, live: _Live, warned: bool) -> None:
        if warned:
            self.warned_culls += 1
        else:
            self.unwarned_culls += 1
        rest = live.spans
        returns_at = live.span_end
        self.release(live)
        if any(kind == "active" for kind, _s in rest) and returns_at < math.inf:
            self.came_back += 1  # the user comes back from the pause to a stopped server and asks again
            again = _Live(replace(live.s, arrive=returns_at, spans=rest))
            self.at(returns_at, "arrive", again)

    # ------------------------------------------------------------ cullers

    def cull_round(self) -> None:
        period = self.policy.gpu_culler["period"] if self.policy.gpu_culler else 60.0
        for live in [lv for lv in self.live.values() if lv.held]:
            if live.state == "active":
                live.last_active = live.last_kernel = self.now
            elif live.state == "cpu" or (live.state == "abandoned" and live.s.tab_open):
                live.last_kernel = self.now
            if self.tracker is not None:
                utilisation = BUSY_UTILISATION if live.last_active > self.now - period else 0.0
                action, _idle = self.tracker.observe(live.s.owner, [(self.now, utilisation)], self.now)
                if action == "warn":
                    self.tracker.warned(live.s.owner, self.now)
                elif action == "stop":
                    self.cull(live, warned=True)
                    continue
            after = self.policy.kernel_cull_after
            if after is not None and self.now - live.last_kernel >= after:
                self.cull(live, warned=False)

    # ------------------------------------------------------------ the run

    def run(self) -> Result:
        for session in self.sessions:
            self.at(session.arrive, "arrive", _Live(session))
        period = self.policy.gpu_culler["period"] if self.policy.gpu_culler else 60.0
        for k in range(int(self.end // period) + 1):
            self.at(k * period, "cull")
        for k in range(int(self.end // 300) + 1):
            self.at(k * 300.0, "snapshot")
        while self.events:
            t, _seq, what, live, generation = heapq.heappop(self.events)
            if t > self.end:
                break
            self.advance(t)
            if what == "arrive":
                self.ask(live)
            elif what == "retry":
                if live.generation == generation and not live.held:
                    self.ask(live)
            elif what == "queue-timeout":
                if live.generation == generation and live.waiter is not None:
                    self.queue.leave(live.waiter)
                    live.waiter = None
                    if live.estimate is not None:
                        self.unserved.append(live.estimate)
                    live.estimate = None
                    self.refused(live)
                    self.serve()  # leaving wakes the others (GPUQueue.leave): the next may place now
            elif what == "span":
                if live.generation == generation and live.held:
                    self.end_span(live)
            elif what == "cull":
                self.cull_round()
            elif what == "snapshot":
                self.snapshot()
            else:
                self.other(what, live, generation)
        self.advance(self.end)
        return self

    def other(self, what: str, live: _Live | None, generation: int) -> None:
        """An event a subclass schedules (replay/bookings.py: a server stopped at a booked window)."""


def _result(runs: list[_Replay]) -> Result:
    """The figures of one policy over the runs of several days (pooled)."""
    busy = sum(r.busy_s for r in runs)
    held = busy + sum(r.idle_s for r in runs)
    waits = sorted(w for r in runs for w in r.waits)
    capacity = sum(len(r.inventory) * r.end for r in runs)
    return Result(
        policy=runs[0].policy.name,
        held_idle_pct=round(100 * (held - busy) / held, 1) if held else 0.0,
        median_wait_min=round(statistics.median(waits) / 60, 1) if waits else 0.0,
        p95_wait_min=round(waits[min(len(waits) - 1, int(0.95 * len(waits)))] / 60, 1) if waits else 0.0,
        refusals=sum(r.refusals for r in runs), gave_up=sum(r.gave_up for r in runs),
        utilisation_pct=round(100 * busy / capacity, 1) if capacity else 0.0,
        culled_warned=sum(r.warned_culls for r in runs), culled_unwarned=sum(r.unwarned_culls for r in runs),
        came_back=sum(r.came_back for r in runs), served=len(waits), series=runs[0].series,
    )


def replay(days: list[list[Session]], inventory: tuple[GPU, ...], policy: Policy, hours: float = 24.0) -> Result:
    """Run each day's sessions against ``policy`` on ``inventory`` for ``hours`` of simulated time;
    the figures pool the days (the chart's series is the first day's)."""
    return _result([_Replay(sessions, inventory, policy, hours).run() for sessions in days])
