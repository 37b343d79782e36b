"""The wait estimator (:mod:`gpuspawner.estimate`) measured in the replay.

Every request that has to wait in the queue is estimated the moment it joins, by the same
:func:`~gpuspawner.estimate.for_gpus` the hub's queue calls, from what the replayed hub knows then:
the GPUs it could use and who holds them (the ledger), since when (each holding's start), the
culler's latest end for GPUs already idle (idle since + the idle timeout), the
requests ahead of it (the queue's own ``ahead``) and the usage history. When it starts, the
estimate is compared with the real start.

**Held out.** The history the estimator draws lengths from is what the same policy recorded
on *other* days (seeds ``fit_seed``, ``fit_seed`` + 1, ...), never the days the figures are
measured on, and nothing in the estimator was tuned on the figures it reports.

Figures (:class:`Figures`): requests that waited and started; the median absolute error of the
likely start (minutes) beside the median wait; the median error as a share of each wait; the
share of requests whose error is within 25 % of their wait or 2 minutes (the goal); the requests
that reached the queue's limit unserved and the share of them whose estimate said they would (its
likely start past their limit, or none); the share
that started inside the stated interval (goal >= 80 %; an interval without an upper end counts as
missed); estimates without an upper end; how many likely starts missed the goal late (later than
the real start) and early; the median error a perfectly calibrated estimate would score here
(:func:`calibrated`); and, beside them, the policy's p95 wait, held-idle and "culled, came back".

**Calibrated reference.** Only the waits that ended before the queue's limit are scored, so the
figures mix how right the estimate is with how spread it must be: under first fit a 1-GPU request
starts at the first of many holders' ends, and even an estimate whose scenarios are exactly the
real odds misses the goal there, and leans late (the waits that are scored are those that ended
early). ``calibrated_pct`` is the median error, as a share of the wait, if each estimated request's
real start were one of its own scenarios (each equally likely; those past the queue's limit are not
served, as in the replay): what the same estimates would score in a world they describe exactly.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ..estimate import Ask, Estimate, History, Holding, for_gpus, latest_end
from ..gpu import GPU
from .simulation import Policy, Result, _Live, _Replay, _result
from .trace import Session

#: the columns of the estimate table (attribute, title, format), for :func:`~gpuspawner.replay.report.table`
COLUMNS = [("load", "offered load %", "{:.0f}"), ("waited", "waited", "{}"), ("unserved", "reached the limit", "{}"),
           ("foretold_pct", "of them foretold %", "{:.0f}"),
           ("median_error_min", "median error min", "{:.1f}"), ("median_wait_min", "median wait min", "{:.1f}"),
           ("median_relative_pct", "median error % of wait", "{:.0f}"),
           ("within_goal_pct", "error <= 25% or 2 min %", "{:.0f}"),
           ("in_interval_pct", "in interval %", "{:.0f}"), ("open_ended", "no upper end", "{}"),
           ("late", "missed late", "{}"), ("early", "missed early", "{}"),
           ("calibrated_pct", "if calibrated: median error % of wait", "{:.0f}"),
           ("p95_wait_min", "p95 wait min", "{:.1f}"), ("held_idle_pct", "held-idle %", "{:.1f}"),
           ("came_back", "culled, came back", "{}")]


@dataclass
class Figures:
    """How the estimates at enqueue compared with the real starts, and the policy's figures beside them."""

    load: float
    waited: int
    unserved: int
    foretold_pct: float
    median_error_min: float
    median_wait_min: float
    median_relative_pct: float
    within_goal_pct: float
    in_interval_pct: float
    open_ended: int
    late: int
    early: int
    calibrated_pct: float
    p95_wait_min: float
    held_idle_pct: float
    came_back: int


def estimator(history: History) -> Callable[[_Replay, _Live], Estimate]:
    """The replay's hook: estimate ``live``'s start from what the replayed hub knows now."""

    def estimate(run: _Replay, live: _Live) -> Estimate:
        allocations = run.ledger.allocations()
        holders = {uuid: owner for owner, uuids in allocations.items() for uuid in uuids}
        culler = run.policy.gpu_culler
        holdings = {}
        for owner in allocations:
            other = run.live.get(owner)
            if other is None:
                continue
            idle = run.tracker.idle_since(owner) if run.tracker is not None else None
            timeout = culler["idle_timeout"] if culler else None
            latest, bound = latest_end(other.granted_at, idle_since=idle, idle_timeout=timeout)
            holdings[owner] = Holding(other.granted_at, other.s.user, other.profile, latest, bound)
        ahead = [Ask(w.owner, w.count, w.user, w.profile, run.live[w.owner].enqueued + run.policy.queue_timeout,
                     models=w.models) for w in run.queue.ahead(live.s.models, run.inventory, before=live.waiter)]
        ask = Ask(live.s.owner, live.s.count, live.s.user, live.profile, models=live.s.models)
        return for_gpus(ask, run.now, run.inventory, holders, holdings, ahead, history,
                        quota=run.policy.quota_per_user, backfill=run.policy.backfill)

    return estimate


def fit(days: list[list[Session]], inventory: tuple[GPU, ...], policy: Policy, hours: float = 24.0) -> History:
    """The history a hub running ``policy`` would have recorded over ``days``: each holding's length."""
    return History(row for sessions in days for row in _Replay(sessions, inventory, policy, hours).run().lengths)


def calibrated(estimated: list[tuple[Estimate, float]], limit: float) -> float:
    """The median relative error (%) of the likely starts of ``estimated`` ((estimate, enqueued at) of every
    estimated request, served or not) if each one's real start were one of its scenarios, each equally
    likely, scored as :func:`measure` scores: only starts within the queue's ``limit`` of joining."""
    relative = []
    for est, enqueued in estimated:
        if est.likely is None:
            continue
        for start in est.starts:
            if start <= enqueued + limit:
                wait = start - enqueued
                relative.append(abs(est.likely - start) / wait if wait > 0 else 0.0)
    return round(100 * statistics.median(relative), 1) if relative else 0.0


def measure(days: list[list[Session]], inventory: tuple[GPU, ...], policy: Policy, history: History,
            load: float, hours: float = 24.0) -> tuple[Result, Figures]:
    """Replay ``days`` under ``policy``, estimating every wait from ``history``; the policy's figures and
    the estimates'."""
    runs = [_Replay(sessions, inventory, policy, hours, estimator(history)).run() for sessions in days]
    result = _result(runs)
    rows = [(est, enqueued, started) for run in runs for est, enqueued, started in run.estimated]
    unserved = [u for run in runs for u in run.unserved]
    errors, waits, relative, within, inside, open_ended, late, early = [], [], [], [], [], 0, 0, 0
    for est, enqueued, started in rows:
        wait = started - enqueued
        likely = est.likely if est.likely is not None else enqueued + wait * 1e9  # no time: counts as wrong
        error = abs(likely - started)
        errors.append(error)
        waits.append(wait)
        relative.append(error / wait if wait > 0 else 0.0)
        within.append(error <= max(0.25 * wait, 120.0))
        late += not within[-1] and likely > started
        early += not within[-1] and likely < started
        open_ended += est.high is None
        inside.append(est.low is not None and est.high is not None and est.low <= started <= est.high)

    def pct(flags: list[bool]) -> float:
        return round(100 * sum(flags) / len(flags), 1) if flags else 0.0

    figures = Figures(
        load=100 * load, waited=len(rows), unserved=len(unserved),
        foretold_pct=pct([est.likely is None or est.likely > at + policy.queue_timeout for est, at in unserved]),
        median_error_min=round(statistics.median(errors) / 60, 1) if errors else 0.0,
        median_wait_min=round(statistics.median(waits) / 60, 1) if waits else 0.0,
        median_relative_pct=round(100 * statistics.median(relative), 1) if relative else 0.0,
        within_goal_pct=pct(within), in_interval_pct=pct(inside), open_ended=open_ended, late=late, early=early,
        calibrated_pct=calibrated([(est, at) for est, at, _ in rows] + unserved, policy.queue_timeout),
        p95_wait_min=result.p95_wait_min, held_idle_pct=result.held_idle_pct, came_back=result.came_back,
    )
    return result, figures
