"""Replay a day of GPU sessions on a simulated clock through the hub's real decision code.

``python -m gpuspawner.replay`` (and ``benchmarks/fleet.py``) compare culler,
queue and quota settings on the same trace. What decides is the project's own
code, driven by a simulated clock instead of the wall clock:

- placement and the ledger (:class:`~gpuspawner.ledger.Ledger` with its
  ``clock``, :func:`~gpuspawner.placement.place` through ``Ledger.reserve``);
- quotas (:func:`~gpuspawner.quota.check`, as the ledger's ``admit``);
- the queue's order (:class:`~gpuspawner.queue.GPUQueue`: ``join``, ``ahead``,
  ``leave``; a waiting request places only when no competing request is ahead
  of it, exactly as ``GPUQueue.serve`` decides; :data:`~gpuspawner.queue.WAITABLE`
  says which refusals wait);
- the GPU culler's warning and stop rules
  (:class:`~gpuspawner.hub.culler.IdleTracker`, fed the samples it would read).

What is modelled instead of run: users (a trace of sessions), JupyterHub's
kernel-activity idle culler for policy (a), and the wall-clock waits.

**The trace** (:class:`TraceParams`; every parameter is a command-line option).
Sessions arrive at random over the day, more in working hours
(``hourly_weights``: by default 1.4 times the day's mean rate from 9 to 16 h, 0.6 times
at night, as a lab with users in several time zones and overnight jobs;
``--office-hours``: twice the mean by day, a fifth at night), until the GPU-hours they mean to hold reach ``load`` x
GPUs x ``hours``. A notebook session alternates *active* spans (its GPUs
busy; exponential, mean ``active_minutes``) and *pauses* (GPUs idle; mean
``pause_minutes``, of which a share ``cpu_share`` keep the kernel busy on the
CPU); with probability ``break_share`` one pause is a long break (uniform
``break_minutes``). Its length is lognormal (mean ``session_hours``, sigma
0.5). At its end the user stops the server, except a share ``abandon_share``
who walk away and leave it idle; of these a share ``tab_open_share`` leave a
browser tab open, which keeps the server "active" for JupyterHub's own idle
culler. A share ``batch_share`` of sessions are batch jobs (busy throughout,
mean ``batch_hours``, always stopped). Each asks for 1, 2 or 4 GPUs
(``count_weights``) of any model, A100 or T4 (``model_weights``), for one of
``users`` users.

**Policies.** ``jupyterhub-default``: a refused request is retried after
``retry_minutes`` up to ``retries`` times (then the user gives up), no queue, no
GPU culler, JupyterHub's idle culler stops servers without kernel or browser
activity for an hour, without warning. ``gpuspawner``: the runnable hub's
settings (:data:`gpuspawner.hub.setup.RECOMMENDED_CULLER`, queue on, queue
limit and user quota as configured there). A sweep varies the culler's idle
timeout and queue on/off. A session culled while its user would still come
back (a pause, not the end) is asked for again when the user returns, with
the rest of its work; its new wait counts.

**Figures** per policy: GPU-hours held-but-idle as % of held, median and p95
wait for a GPU (served requests; a refused and retried request waits from its
first try), refusals (tries refused at once or by the queue's limit) and
requests given up, GPU utilisation (busy GPU-hours / GPU-hours in the day),
sessions culled with and without warning, and culled users who came back.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import itertools
import json
import math
import random
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from .gpu import GPU
from .hub.culler import IdleTracker
from .hub.setup import RECOMMENDED_CULLER, RECOMMENDED_QUEUE_TIMEOUT, RECOMMENDED_QUOTA_PER_USER
from .ledger import Ledger
from .owner import Owner
from .placement import GPURequest, PlacementError
from .queue import WAITABLE, GPUQueue, Waiter
from .quota import Quota, check

__all__ = ["TraceParams", "Session", "Policy", "Result", "synthetic_trace", "trace_from_usage", "replay",
           "default_policies", "gpus"]

DAY = 24 * 3600.0
BUSY_UTILISATION = 80.0  # what the monitor reads while a session computes
MODELS = {"a100": "NVIDIA A100-SXM4-80GB", "t4": "Tesla T4"}


def gpus(spec: str) -> tuple[GPU, ...]:
    """GPUs from ``"a100=8,t4=8"``: hosts of 4 GPUs each, one model per host."""
    out: list[GPU] = []
    for part in spec.split(","):
        model, _, count = part.strip().partition("=")
        if model not in MODELS or not count.isdigit():
            raise ValueError(f"GPU spec {part!r}: use MODEL=COUNT with MODEL one of {', '.join(MODELS)}")
        for i in range(int(count)):
            host = f"{model}-node{i // 4 + 1}"
            out.append(GPU(uuid=f"GPU-{model}-{i:03d}", name=MODELS[model], index=i % 4, host=host))
    return tuple(out)


#: ``--office-hours``: nearly every session between 8 and 18 h
OFFICE_HOURS = (0.2, 0.2, 0.2, 0.2, 0.2, 0.3, 0.5, 1.0, 1.8, 2.0, 2.0, 1.6,
                1.2, 1.8, 2.0, 1.8, 1.5, 1.0, 0.7, 0.5, 0.4, 0.3, 0.3, 0.2)


@dataclass(frozen=True)
class TraceParams:
    """The synthetic trace's parameters (see the module docstring)."""

    load: float = 0.70
    hours: float = 24.0
    users: int = 40
    hourly_weights: tuple[float, ...] = (0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 1.0, 1.3, 1.4, 1.4, 1.3,
                                         1.1, 1.3, 1.4, 1.3, 1.2, 1.0, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6)
    session_hours: float = 2.5
    active_minutes: float = 40.0
    pause_minutes: float = 3.0
    cpu_share: float = 0.3
    break_share: float = 0.3
    break_minutes: tuple[float, float] = (30.0, 90.0)
    abandon_share: float = 0.3
    tab_open_share: float = 0.5
    batch_share: float = 0.15
    batch_hours: float = 1.5
    count_weights: tuple[tuple[int, float], ...] = ((1, 0.7), (2, 0.2), (4, 0.1))
    model_weights: tuple[tuple[str, float], ...] = (("any", 0.5), ("a100", 0.3), ("t4", 0.2))
    seed: int = 1


@dataclass
class Session:
    """One request for GPUs and what its user then does with them."""

    id: int
    user: str
    arrive: float
    count: int
    models: tuple[str, ...]
    spans: list[tuple[str, float]]  # ("active" | "cpu" | "away", seconds), in order
    stops: bool = True  # False: the user walks away at the end and leaves it idle
    tab_open: bool = False  # an abandoned server whose browser tab stays open
    job: bool = False

    @property
    def owner(self) -> str:
        return str(Owner.of_job(self.user, str(self.id)) if self.job else Owner.of_server(self.user, f"s{self.id}"))

    @property
    def planned(self) -> float:
        return sum(seconds for _kind, seconds in self.spans)


def _pick(rng: random.Random, weighted: Iterable[tuple]) -> object:
    items = list(weighted)
    return rng.choices([v for v, _w in items], weights=[w for _v, w in items])[0]


def synthetic_trace(params: TraceParams, capacity: int) -> list[Session]:
    """Sessions until their planned GPU-hours reach ``load`` x ``capacity`` x ``hours``."""
    rng = random.Random(params.seed)
    hours = list(range(len(params.hourly_weights)))
    target = params.load * capacity * params.hours * 3600
    offered, sessions = 0.0, []
    for i in itertools.count():
        if offered >= target:
            break
        hour = rng.choices(hours, weights=params.hourly_weights)[0]
        arrive = (hour + rng.random()) * 3600 * params.hours / 24
        count = int(_pick(rng, params.count_weights))
        model = str(_pick(rng, params.model_weights))
        user = f"user{rng.randrange(params.users):02d}"
        if rng.random() < params.batch_share:
            length = rng.expovariate(1 / (params.batch_hours * 3600))
            session = Session(i, user, arrive, count, (model,), [("active", length)], job=True)
        else:
            sigma = 0.5
            length = rng.lognormvariate(math.log(params.session_hours * 3600) - sigma ** 2 / 2, sigma)
            spans: list[tuple[str, float]] = []
            breaks = 1 if rng.random() < params.break_share else 0
            total = 0.0
            while total < length:
                active = min(rng.expovariate(1 / (params.active_minutes * 60)), length - total)
                spans.append(("active", active))
                total += active
                if total >= length:
                    break
                if breaks and rng.random() < 0.5:
                    pause = ("away", rng.uniform(*params.break_minutes) * 60)
                    breaks = 0
                else:
                    kind = "cpu" if rng.random() < params.cpu_share else "away"
                    pause = (kind, rng.expovariate(1 / (params.pause_minutes * 60)))
                spans.append(pause)
                total += pause[1]
            stops = rng.random() >= params.abandon_share
            session = Session(i, user, arrive, count, (model,), spans, stops=stops,
                              tab_open=not stops and rng.random() < params.tab_open_share)
        offered += session.count * session.planned
        sessions.append(session)
    return sorted(sessions, key=lambda s: (s.arrive, s.id))


def trace_from_usage(rows: list[dict]) -> list[Session]:
    """Sessions from ``GET /hub/api/gpus/usage?by=allocation`` rows (JSON, or CSV read as dicts).

    Each allocation becomes one session starting when it started (relative to
    the first one's midnight, UTC): busy time first, then its idle time as a
    pause; unsampled time counts as busy. A culled allocation was left idle by
    its user (not stopped); the others were stopped.
    """
    sessions = []
    parsed = [(datetime.fromisoformat(r["started"].replace("Z", "+00:00")).timestamp(), r) for r in rows]
    if not parsed:
        return []
    first = min(t for t, _r in parsed)
    midnight = first - first % DAY
    for i, (started, row) in enumerate(sorted(parsed, key=lambda p: p[0])):
        count = int(row["gpu_count"]) or 1
        held, busy, idle = (float(row[k]) * 3600 / count for k in ("gpu_hours", "busy_gpu_hours", "idle_gpu_hours"))
        spans = [("active", max(held - idle, 0.0))] + ([("away", idle)] if idle > 0 else [])
        sessions.append(Session(i, str(row["user"]), started - midnight, count, (str(row["model"]) or "any",),
                                spans, stops=row.get("end_reason") != "culled", job=row.get("kind") == "job"))
    return sessions


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


def default_policies(timeouts: Iterable[float] = (900, 1800, 3600, 7200)) -> list[Policy]:
    """(a) JupyterHub's default, (b) gpuspawner as configured, (c) the sweep."""
    out = [
        Policy("jupyterhub-default", queue=False, gpu_culler=None, kernel_cull_after=3600),
        Policy("gpuspawner", queue=True, gpu_culler=dict(RECOMMENDED_CULLER),
               quota_per_user=RECOMMENDED_QUOTA_PER_USER),
    ]
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


class _Replay:
    def __init__(self, sessions: list[Session], inventory: tuple[GPU, ...], policy: Policy, hours: float) -> None:
        self.now = 0.0
        self.end = hours * 3600
        self.inventory = inventory
        self.policy = policy
        self.ledger = Ledger(clock=lambda: self.now)
        self.queue = GPUQueue(clock=lambda: self.now)
        self.tracker = (IdleTracker(policy.gpu_culler["threshold"], policy.gpu_culler["idle_timeout"],
                                    policy.gpu_culler["warn_before"]) if policy.gpu_culler else None)
        self.events: list = []
        self.seq = itertools.count()
        self.live: dict[str, _Live] = {}
        self.waits: list[float] = []
        self.refusals = self.gave_up = self.warned_culls = self.unwarned_culls = self.came_back = 0
        self.busy_s = self.idle_s = 0.0
        self.series: list[tuple[float, int, int, int]] = []
        self.sessions = sessions

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

    def place(self, live: _Live) -> None:
        quota = Quota(live.s.user, self.policy.quota_per_user)
        request = self.request(live)
        self.ledger.reserve(self.inventory, request,
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
            live.waiter = self.queue.join(live.s.owner, live.s.user, live.s.count, live.s.models)
            self.at(self.now + self.policy.queue_timeout, "queue-timeout", live, live.generation)
            self.serve()
            return
        if self.queue.ahead(live.s.models, self.inventory):  # others queue for these GPUs: refused, as the hub does
            self.refused(live)
            return
        try:
            self.place(live)
        except PlacementError:
            self.refused(live)
            return
        self.granted(live)

    def serve(self) -> None:
        """Every waiter with no competing request ahead of it tries to place (GPUQueue.serve's rule)."""
        for waiter in self.queue.waiters():
            live = self.live.get(waiter.owner)
            if live is None or live.waiter is not waiter:
                continue
            if self.queue.ahead(waiter.models, self.inventory, before=waiter):
                continue
            try:
                self.place(live)
            except PlacementError as e:
                if e.code in WAITABLE:
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
                    self.refused(live)
            elif what == "span":
                if live.generation == generation and live.held:
                    self.end_span(live)
            elif what == "cull":
                self.cull_round()
            elif what == "snapshot":
                self.snapshot()
        self.advance(self.end)
        return self


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


def offered_load(sessions: list[Session], capacity: int, hours: float) -> float:
    return sum(s.count * s.planned for s in sessions) / (capacity * hours * 3600)


COLUMNS = [("policy", "policy", "{}"), ("held_idle_pct", "held-idle %", "{:.1f}"),
           ("median_wait_min", "median wait min", "{:.1f}"), ("p95_wait_min", "p95 wait min", "{:.1f}"),
           ("refusals", "refusals", "{}"), ("gave_up", "gave up", "{}"), ("utilisation_pct", "utilisation %", "{:.1f}"),
           ("culled_warned", "culled, warned", "{}"), ("culled_unwarned", "culled, no warning", "{}"),
           ("came_back", "culled, came back", "{}")]


def table(results: list[Result], markdown: bool = False) -> str:
    rows = [[fmt.format(getattr(r, key)) for key, _t, fmt in COLUMNS] for r in results]
    titles = [title for _k, title, _f in COLUMNS]
    if markdown:
        lines = ["| " + " | ".join(titles) + " |", "|" + "|".join(" --- " for _ in titles) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(t), *(len(r[i]) for r in rows)) for i, t in enumerate(titles)]
    lines = ["  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def chart(results: list[Result], path: str, capacity: int) -> bool:
    """A PNG of busy/idle/free GPUs over the day, one panel per policy; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.0 * len(results)), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        hours = [t / 3600 for t, *_ in result.series]
        busy, idle, free = ([row[i] for row in result.series] for i in (1, 2, 3))
        ax.stackplot(hours, busy, idle, free, labels=["busy", "held, idle", "free"],
                     colors=["#2e7d32", "#e65100", "#cfd8dc"], step="post")
        ax.set_ylim(0, capacity)
        ax.set_ylabel("GPUs")
        ax.set_title(f"{result.policy}: held-idle {result.held_idle_pct:.0f}%, median wait "
                     f"{result.median_wait_min:g} min, utilisation {result.utilisation_pct:.0f}%", fontsize=9)
    axes[0, 0].legend(loc="upper left", fontsize=8, ncol=3)
    axes[-1, 0].set_xlabel("hour of the day")
    axes[-1, 0].set_xlim(0, 24)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def parse_args(argv: list[str]) -> argparse.Namespace:
    defaults = TraceParams()
    p = argparse.ArgumentParser(prog="python -m gpuspawner.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default="a100=8,t4=8", help="the GPUs: MODEL=COUNT,... (hosts of 4; a100, t4)")
    p.add_argument("--history", help="replay GET /hub/api/gpus/usage?by=allocation output (.json or .csv) "
                                     "instead of a synthetic trace")
    for name in ("load", "hours", "session_hours", "active_minutes", "pause_minutes", "cpu_share",
                 "break_share", "abandon_share", "tab_open_share", "batch_share", "batch_hours"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name),
                       help=f"trace parameter (default {getattr(defaults, name)})")
    p.add_argument("--users", type=int, default=defaults.users, help=f"users (default {defaults.users})")
    p.add_argument("--seed", type=int, default=defaults.seed, help="random seed of the synthetic trace's first day")
    p.add_argument("--days", type=int, default=5,
                   help="synthetic days replayed (seeds SEED, SEED+1, ...); the figures pool them (default 5)")
    p.add_argument("--office-hours", action="store_true",
                   help="arrivals peaking at twice the day's mean from 9 to 17 h (default: 1.4 times)")
    p.add_argument("--timeouts", default="10,15,20,30,60,120", help="culler idle timeouts to sweep, minutes")
    p.add_argument("--chart", help="write a PNG of busy/idle/free GPUs over the day (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    return p.parse_args(argv)


def load_history(path: str) -> list[Session]:
    with open(path, newline="") as f:
        if path.endswith(".csv"):
            return trace_from_usage(list(csv.DictReader(f)))
        return trace_from_usage(json.load(f)["rows"])


def main(argv: list[str] | None = None) -> list[Result]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    inventory = gpus(args.gpus)
    if args.history:
        days = [load_history(args.history)]
    else:
        fields = {k: getattr(args, k) for k in TraceParams.__dataclass_fields__ if hasattr(args, k)}
        if args.office_hours:
            fields["hourly_weights"] = OFFICE_HOURS
        days = [synthetic_trace(TraceParams(**{**fields, "seed": args.seed + d}), len(inventory))
                for d in range(args.days)]
    timeouts = [float(m) * 60 for m in args.timeouts.split(",") if m.strip()]
    results = [replay(days, inventory, policy, args.hours) for policy in default_policies(timeouts)]
    sessions = sum(len(d) for d in days)
    load = statistics.mean(offered_load(d, len(inventory), args.hours) for d in days)
    if args.json:
        print(json.dumps({"offered_load": round(load, 3), "sessions": sessions, "days": len(days),
                          "results": [r.row() for r in results]}, indent=1))
    else:
        print(f"{sessions} sessions over {len(days)} day(s) of {args.hours:g} h on {len(inventory)} GPUs, "
              f"offered load {100 * load:.0f}%")
        print(table(results, markdown=args.markdown))
    if args.chart:
        shown = [r for r in results if r.policy in ("jupyterhub-default", "gpuspawner")]
        if chart(shown, args.chart, len(inventory)):
            print(f"chart: {args.chart}")
        else:
            print("chart: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
