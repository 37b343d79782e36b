"""The wait estimator's scenario run under the queue's backfill rules (``gpu_queue_backfill``).

:func:`gpuspawner.estimate.estimate` plays each scenario through one of two runs: strict order
(``"off"``, in :mod:`gpuspawner.estimate`), where each request starts no earlier than the one ahead
of it, or :func:`start_backfill` here, which follows :meth:`gpuspawner.queue.GPUQueue.room`: at each
moment GPUs come back (or a request ahead reaches the queue's limit), every request still waiting
looks again in queue order and starts where the rule lets it fit now:

- ``"first-fit"``: wherever one of its groups (one host's GPUs of a model it accepts) has room for it;
- ``"nearest-host"``: the same, but behind competing requests (those ahead of it that want some of its
  groups) only outside the groups each of them is nearest to fitting (of its groups with enough GPUs
  for it, those with the most free; every such group on a tie).

A request takes the fullest group with room among those it may use (the placement's best fit) and
its user stays within the quota, as in strict order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

__all__ = ["give_back", "start_backfill", "take"]


def give_back(ends: list[tuple[float, int, str, int]], room: dict[str, int]) -> tuple[float, int] | None:
    """The next end of ``ends`` (a heap) given back to ``room``: (its time, the asking user's GPUs it
    held), or None at the horizon (an end of -1 GPUs: what happens next depends on ends not known)."""
    end, n, group, mine = heapq.heappop(ends)
    if n < 0:
        return None
    if group:
        room[group] = room.get(group, 0) + n
    return end, mine


def take(room: dict[str, int], ends: list[tuple[float, int, str, int]], group: str, count: int, hold: float,
         same: bool, t: float) -> int:
    """A request starts at ``t`` on ``group`` and holds it for ``hold``: the asking user's GPUs it adds."""
    room[group] -= count
    if hold < math.inf:
        heapq.heappush(ends, (t + hold, count, group, count if same else 0))
    return count if same else 0


def _kept(queue: Sequence[tuple], ahead: list[int], mine: frozenset[str] | None, room: Mapping[str, int],
          sizes: Mapping[str, int]) -> set[str]:
    """The groups the competing requests of ``ahead`` are nearest to fitting (``"nearest-host"``)."""
    kept: set[str] = set()
    for k in ahead:
        count, groups = queue[k][0], queue[k][4]
        if mine is not None and groups is not None and mine.isdisjoint(groups):
            continue  # it wants none of these GPUs: not competing
        fits = [g for g, n in sizes.items() if n >= count and (groups is None or g in groups)]
        most = max((room.get(g, 0) for g in fits), default=0)
        kept.update(g for g in fits if room.get(g, 0) == most)
    return kept


def start_backfill(free: Mapping[str, int], ends: list[tuple[float, int, str, int]], queue: Sequence[tuple],
                   now: float, own: int, quota: float, rule: str, sizes: Mapping[str, int]) -> float | None:
    """When the last of ``queue`` starts under ``rule`` (``"first-fit"`` or ``"nearest-host"``);
    ``sizes``: the GPUs of each group (free or held). The rest as :func:`gpuspawner.estimate._start`:
    None where the start lies past the horizon in ``ends``, inf where nothing known frees enough."""
    heapq.heapify(ends)
    room = dict(free)
    t = now
    waiting = list(range(len(queue)))
    last = len(queue) - 1
    while True:
        left: list[int] = []
        for i in waiting:
            count, hold, gives_up, same, groups = queue[i]
            if t > gives_up:
                continue  # it left the queue unserved
            kept = _kept(queue, left, groups, room, sizes) if rule == "nearest-host" and left else ()
            fits = [(n, g) for g, n in room.items()
                    if n >= count and g not in kept and (groups is None or g in groups)]
            if not fits or own > (quota - count if same else math.inf):
                left.append(i)
                continue
            if i == last:
                return t
            own += take(room, ends, min(fits)[1], count, hold, same, t)
        waiting = left
        leaves, first = min(((queue[i][2], i) for i in waiting), default=(math.inf, -1))
        if ends and ends[0][0] <= leaves:
            back = give_back(ends, room)
            if back is None:
                return None
            t, own = max(t, back[0]), own - back[1]
        elif leaves < math.inf:  # the first to reach the queue's limit leaves: what it kept is free to others
            t = max(t, leaves)
            waiting.remove(first)
        else:
            return math.inf
