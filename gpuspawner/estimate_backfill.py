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

__all__ = ["NearestHost", "give_back", "start_backfill", "take"]


def give_back(ends: list[tuple[float, int, str, int]], room: dict[str, int]) -> tuple[float, int, str, int] | None:
    """The next end of ``ends`` (a heap) given back to ``room``: (its time, the asking user's GPUs it
    held, its group, its GPUs), or None at the horizon (an end of -1 GPUs: what happens next depends on ends not
    known)."""
    end, n, group, mine = heapq.heappop(ends)
    if n < 0:
        return None
    if group:
        room[group] = room.get(group, 0) + n
    return end, mine, group, n


def take(room: dict[str, int], ends: list[tuple[float, int, str, int]], group: str, count: int, hold: float,
         same: bool, t: float) -> int:
    """A request starts at ``t`` on ``group`` and holds it for ``hold``: the asking user's GPUs it adds."""
    room[group] -= count
    if hold < math.inf:
        heapq.heappush(ends, (t + hold, count, group, count if same else 0))
    return count if same else 0


class NearestHost:
    """``"nearest-host"``: the groups each request of ``queue`` is nearest to fitting (of its groups with
    enough GPUs for it, ``sizes``, those with the most free; none where that is 0: a group without a
    free GPU has no room to keep). Made once per estimate (the requests' counts and groups are those
    of every scenario); it follows the room through :meth:`moved`."""

    def __init__(self, queue: Sequence[tuple], sizes: Mapping[str, int]) -> None:
        self.queue, self.sizes = queue, sizes
        self.eligible: dict[int, frozenset[str]] = {}
        self.by_room: dict[int, set[str]] = {}  # free GPUs (1 or more) -> the groups with that many

    def reset(self, room: Mapping[str, int]) -> None:
        """A scenario starts from ``room``."""
        self.by_room = {}
        for g, n in room.items():
            if n > 0:
                self.by_room.setdefault(n, set()).add(g)

    def moved(self, group: str, before: int, after: int) -> None:
        """``group``'s free GPUs went from ``before`` to ``after``."""
        if before > 0:
            self.by_room[before].discard(group)
        if after > 0:
            self.by_room.setdefault(after, set()).add(group)

    def _of(self, k: int) -> set[str]:
        fits = self.eligible.get(k)
        if fits is None:
            count, groups = self.queue[k][0], self.queue[k][4]
            fits = self.eligible[k] = frozenset(g for g, n in self.sizes.items()
                                                if n >= count and (groups is None or g in groups))
        for n in sorted(self.by_room, reverse=True):
            found = {g for g in self.by_room[n] if g in fits}
            if found:
                return found
        return set()

    def kept(self, ahead: list[int], mine: frozenset[str] | None) -> set[str]:
        """The groups the competing requests of ``ahead`` (those that want some of ``mine``) keep."""
        kept: set[str] = set()
        for k in ahead:
            groups = self.queue[k][4]
            if mine is None or groups is None or not mine.isdisjoint(groups):
                kept |= self._of(k)
        return kept


def start_backfill(free: Mapping[str, int], ends: list[tuple[float, int, str, int]], queue: Sequence[tuple],
                   now: float, own: int, quota: float, nearest: NearestHost | None = None) -> float | None:
    """When the last of ``queue`` starts under first fit, or under ``"nearest-host"`` with ``nearest``
    (made for this ``queue``). The rest as :func:`gpuspawner.estimate._start`: None where the start lies
    past the horizon in ``ends``, inf where nothing known frees enough."""
    if nearest is not None:
        nearest.reset(free)
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
            kept = nearest.kept(left, groups) if nearest is not None and left else ()
            fits = [(n, g) for g, n in room.items()
                    if n >= count and g not in kept and (groups is None or g in groups)]
            if not fits or own > (quota - count if same else math.inf):
                left.append(i)
                continue
            if i == last:
                return t
            group = min(fits)[1]
            own += take(room, ends, group, count, hold, same, t)
            if nearest is not None:
                nearest.moved(group, room[group] + count, room[group])
        waiting = left
        leaves, first = min(((queue[i][2], i) for i in waiting), default=(math.inf, -1))
        if ends and ends[0][0] <= leaves:
            back = give_back(ends, room)
            if back is None:
                return None
            t, own = max(t, back[0]), own - back[1]
            if nearest is not None and back[2]:
                nearest.moved(back[2], room[back[2]] - back[3], room[back[2]])
        elif leaves < math.inf:  # the first to reach the queue's limit leaves: what it kept is free to others
            t = max(t, leaves)
            waiting.remove(first)
        else:
            return math.inf
