"""Who waits longest in the replay, and why (``python -m gpuspawner.replay --tail``).

The policy is replayed as :func:`~gpuspawner.replay.simulation.replay` does; meanwhile, for every
request still waiting, each moment is put in one of these states, by what the GPUs it could use
(the models it accepts) are doing: *busy* (all held, every holder computing), *held idle* (all
held, at least one by a session not in use that the culler has not stopped yet), *free, kept*
(enough free on one host, but kept for a request ahead of it:
:meth:`~gpuspawner.queue.GPUQueue.room`), *free, too few on one host* (free GPUs, but not enough
on any one host for it), and *between tries* (refused, or past the queue's limit, until its user
asks again). :func:`tail` sums these over the requests that waited longer than
``over`` seconds: where the tail comes from.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..gpu import GPU, model_slug
from ..queue import _Wanted
from .simulation import Policy, _Live, _Replay
from .trace import Session

STATES = ("busy", "held idle", "free, kept", "free, too few on one host", "between tries")


@dataclass
class Waited:
    """One served request that waited: seconds per state while it waited."""

    owner: str
    count: int
    models: tuple[str, ...]
    wait: float
    tries: int
    came_back: bool
    states: Counter = field(default_factory=Counter)


class _Watched(_Replay):
    def __init__(self, sessions: list[Session], inventory: tuple[GPU, ...], policy: Policy, hours: float) -> None:
        super().__init__(sessions, inventory, policy, hours)
        self.wanted = _Wanted(inventory)
        self.states: dict[_Live, Counter] = defaultdict(Counter)  # per request (never its id: ids are reused)
        self.returning: set[_Live] = set()
        self._culling = False
        self.served: list[Waited] = []

    def _state(self, live: _Live, holders: dict[str, str], held: frozenset[str]) -> str:
        if live.waiter is None:
            return "between tries"
        mine = self.wanted(live.s.models)
        usable = [g for g in self.inventory if model_slug(g.name) in mine]
        if all(g.uuid in held for g in usable):
            owners = {holders[g.uuid] for g in usable}
            idle = any(owner in self.live and self.live[owner].state != "active" for owner in owners)
            return "held idle" if idle else "busy"
        free: Counter = Counter((g.host, g.name) for g in usable if g.uuid not in held)
        if max(free.values()) >= live.s.count:
            return "free, kept"
        return "free, too few on one host"

    def advance(self, t: float) -> None:
        if t > self.now:
            waiting = [lv for lv in self.live.values() if not lv.held and lv.state == "waiting"]
            if waiting:
                allocations = self.ledger.allocations()
                holders = {uuid: owner for owner, uuids in allocations.items() for uuid in uuids}
                held = frozenset(holders)
                for live in waiting:
                    self.states[live][self._state(live, holders, held)] += t - self.now
        super().advance(t)

    def granted(self, live: _Live) -> None:
        wait = self.now - live.first_try
        if wait > 0:
            self.served.append(Waited(live.s.owner, live.s.count, live.s.models, wait, live.tries,
                                      live in self.returning, self.states.pop(live, Counter())))
        super().granted(live)

    def at(self, t: float, what: str, live: _Live | None = None, generation: int = 0) -> None:
        if self._culling and what == "arrive" and live is not None:
            self.returning.add(live)  # asked for again by a culled user who comes back
        super().at(t, what, live, generation)

    def cull(self, live: _Live, warned: bool) -> None:
        self._culling = True
        try:
            super().cull(live, warned)
        finally:
            self._culling = False


def tail(days: list[list[Session]], inventory: tuple[GPU, ...], policy: Policy, hours: float = 24.0,
         over: float = 1200.0) -> tuple[int, list[Waited]]:
    """(requests served, the waits longer than ``over`` seconds, longest first) of ``policy`` on ``days``."""
    served, long = 0, []
    for sessions in days:
        run = _Watched(sessions, inventory, policy, hours)
        run.run()
        served += len(run.waits)
        long += [w for w in run.served if w.wait > over]
    return served, sorted(long, key=lambda w: -w.wait)


def describe(served: int, long: list[Waited], policy: str, over: float = 1200.0, rows: int = 10) -> str:
    """The tail in words: how many waited longer than ``over``, by GPU count, what held them up, the longest."""
    minutes = over / 60
    by_count = Counter(w.count for w in long)
    counts = ", ".join(f"{c} GPU{'s' if c > 1 else ''}: {n}" for c, n in sorted(by_count.items()))
    lines = [f"Who waits longest ({policy}): {len(long)} of {served} served requests waited over {minutes:g} "
             f"minutes ({100 * len(long) / served if served else 0:.1f} %; {counts or 'none'}); "
             f"{sum(w.came_back for w in long)} of them were culled users who came back."]
    total = Counter()
    for w in long:
        total.update(w.states)
    whole = sum(total.values())
    if whole:
        shares = ", ".join(f"{state} {100 * total[state] / whole:.0f} %" for state in STATES)
        lines.append(f"While they waited, the GPUs they could use were: {shares}.")
    for w in long[:rows]:
        spent = sum(w.states.values()) or 1
        main = ", ".join(f"{state} {100 * s / spent:.0f} %" for state, s in w.states.most_common(3))
        lines.append(f"  {w.wait / 60:6.1f} min  {w.count} x {'/'.join(w.models) or 'any'}, {w.tries} "
                     f"tr{'ies' if w.tries > 1 else 'y'}{', came back' if w.came_back else ''}: {main}")
    return "\n".join(lines)
