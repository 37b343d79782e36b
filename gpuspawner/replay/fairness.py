"""FIFO vs fair-share queueing on the same trace (``python -m gpuspawner.replay --fairness``).

The runnable hub's settings (policy ``gpuspawner``: queue on, strict order) with the queue's
``gpu_queue_order`` ``"arrival"`` and ``"fair-share"`` (:mod:`gpuspawner.fairshare`, the hub's
own :class:`~gpuspawner.queue.GPUQueue` ordering on the simulated clock; each replayed day starts
with no history, so recent use is that day's). Figures (:class:`FairnessFigures`), per policy:

- Jain's fairness index of the GPU-hours each user held in a day (``(sum x)^2 / (n sum x^2)``
  over the users who asked for GPUs that day; 1: all alike), the mean over the days;
- the median wait for a GPU (served requests, from the first try) of light users' and of heavy
  users' requests: light are the bottom quartile of the day's users by demand (GPU-hours their
  sessions mean to hold), heavy the top quartile; and their means (a median hides the long waits
  when more than half start at once);
- the median and p95 wait of all served requests, and requests given up.

The documented day draws every session's user alike; ``--heavy-users 0.2`` makes a fifth of the
users start ``--heavy-demand`` (default 4) times as many sessions as the others.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from ..gpu import GPU
from ..owner import user_of
from .simulation import Policy, _Replay
from .trace import Session

#: the columns of the fairness table (attribute, title, format)
COLUMNS = [("policy", "policy", "{}"), ("jain", "Jain's index, GPU-hours per user", "{:.3f}"),
           ("light_median_min", "median wait light min", "{:.1f}"),
           ("heavy_median_min", "median wait heavy min", "{:.1f}"),
           ("light_mean_min", "mean wait light min", "{:.1f}"), ("heavy_mean_min", "mean wait heavy min", "{:.1f}"),
           ("median_wait_min", "median wait min", "{:.1f}"), ("p95_wait_min", "p95 wait min", "{:.1f}"),
           ("gave_up", "gave up", "{}"), ("served", "served", "{}")]


@dataclass
class FairnessFigures:
    policy: str
    jain: float
    light_median_min: float
    heavy_median_min: float
    light_mean_min: float
    heavy_mean_min: float
    median_wait_min: float
    p95_wait_min: float
    gave_up: int
    served: int


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index of ``values``: 1 when all are equal, 1/n when one has everything."""
    xs = list(values)
    square = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * square) if square else 1.0


def quartiles(demand: dict[str, float]) -> tuple[set[str], set[str]]:
    """(light, heavy): the bottom and top quartile of users by ``demand`` (at least one user each)."""
    ranked = sorted(demand, key=lambda u: (demand[u], u))
    n = max(1, len(ranked) // 4)
    return set(ranked[:n]), set(ranked[-n:])


def _held_hours(day: _Replay) -> dict[str, float]:
    """A replayed day's GPU-hours held per user: ended holdings, and those still held at the day's end."""
    held: dict[str, float] = {}
    for user, seconds in day.held_seconds:
        held[user] = held.get(user, 0.0) + seconds / 3600
    for owner, uuids in day.ledger.allocations().items():
        since = day.ledger.since(owner)
        held[user_of(owner)] = held.get(user_of(owner), 0.0) + len(uuids) * (day.end - since) / 3600
    return held


class _Counting(_Replay):
    """A replay that also counts each user's GPU-seconds held, at each release."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held_seconds: list[tuple[str, float]] = []
        self.ledger.observe(self._released)

    def _released(self, event: str, owner: str, uuids: tuple[str, ...], since: float) -> None:
        if event == "release":
            self.held_seconds.append((user_of(owner), len(uuids) * (self.now - since)))


def measure(days: list[list[Session]], inventory: tuple[GPU, ...], policies: list[Policy],
            hours: float = 24.0) -> list[FairnessFigures]:
    """Each policy's :class:`FairnessFigures` over ``days`` (the same trace for each)."""
    out = []
    for policy in policies:
        indexes, light_waits, heavy_waits, waits, gave_up = [], [], [], [], 0
        for sessions in days:
            day = _Counting(sessions, inventory, policy, hours).run()
            demand: dict[str, float] = {}
            for s in sessions:
                demand[s.user] = demand.get(s.user, 0.0) + s.count * s.planned
            held = _held_hours(day)
            indexes.append(jain(held.get(user, 0.0) for user in demand))
            light, heavy = quartiles(demand)
            for owner, wait in day.granted_waits:
                user = user_of(owner)
                waits.append(wait)
                (light_waits if user in light else heavy_waits if user in heavy else []).append(wait)
            gave_up += day.gave_up
        waits.sort()
        out.append(FairnessFigures(
            policy.name, round(statistics.mean(indexes), 3), _median_min(light_waits), _median_min(heavy_waits),
            _mean_min(light_waits), _mean_min(heavy_waits),
            _median_min(waits), round(waits[min(len(waits) - 1, int(0.95 * len(waits)))] / 60, 1) if waits else 0.0,
            gave_up, len(waits)))
    return out


def _median_min(waits: list[float]) -> float:
    return round(statistics.median(waits) / 60, 1) if waits else 0.0


def _mean_min(waits: list[float]) -> float:
    return round(statistics.mean(waits) / 60, 1) if waits else 0.0
