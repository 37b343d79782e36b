"""Wait estimates: when a queued request likely gets its GPUs, an interval, and what that rests on.

Pure (no JupyterHub, no clock of its own): the caller says what the hub knows now.

**What goes in.** The request (:class:`Ask`: its GPU count, user and profile); the requests ahead
of it in the queue that compete for the same GPUs (their own :class:`Ask`, in queue order); the
free GPUs it could use, per group (one host's GPUs of one model: a request's GPUs all live in one
group, :mod:`gpuspawner.placement`); and the holders of the others (:class:`Holder`), each with

- its *latest possible end* where one is known: a notebook job's time limit, a server walltime
  limit, or, for GPUs already idle, when the idle culler will stop them (idle since + its
  timeout); and
- its *likely end* from the usage history (:class:`History`): the lengths of past sessions of the
  same profile and user (too few: of the profile; too few again: of the whole hub), only those
  longer than the holder has already run, so a session that has run 3 hours is judged by the
  sessions that lasted more than 3 hours.

**How.** :data:`SAMPLES` scenarios: in each, every holder ends at a length drawn from its history
(never after its latest end), each request ahead, once started, holds its GPUs for a length drawn
from its own history; the requests then start in queue order, each as soon as one of its groups
has room for it (a group: one host's GPUs of a model it asked for; a request never spans hosts;
it takes the fullest group with room, the placement's best fit) and its user stays within the
quota (``quota``: GPUs per user, counting what the user holds elsewhere); a request ahead that
would not start before it gives up (``gives_up``: when the queue's limit ends its wait) leaves
the queue then instead (that is strict order, the queue's default; under its ``gpu_queue_backfill``
rules, ``backfill``, the requests start as :mod:`gpuspawner.estimate_backfill` says). The likely
start is the median scenario, the interval the :data:`LOW` and
:data:`HIGH` quantiles. Each holder's and request's
draws come from a generator seeded by its owner's name, so the same state always gives the same
estimate, and adding a holder or a request ahead changes nobody else's draws: where all use the
same GPUs (one group) and none gives up, more holders or more requests ahead never make an
estimate earlier. (Otherwise they can, as in the queue itself: a longer wait may make a request
ahead give up, or a best fit take another host.)

Where nothing bounds an end (no history that reaches this far and no time limit) that scenario
never starts: the interval then has no upper end (``high`` None), or no time at all, and the basis
sentence says what is known instead (:data:`WORDS`). The hub's queue can call :func:`for_gpus`.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .estimate_backfill import NearestHost, give_back, start_backfill, take
from .gpu import GPU, model_slug
from .queue import BACKFILL, _utc_time, _Wanted

__all__ = ["LOW", "HIGH", "SAMPLES", "MIN_SAMPLES", "WORDS", "Ask", "Estimate", "History", "Holder", "Holding",
           "estimate", "for_gpus", "latest_end"]

#: scenarios per estimate
SAMPLES = 200
#: the interval's quantiles of the start time (the likely start is the median): 10-90 % held 81-86 % of
#: the real starts in the replay (:mod:`gpuspawner.replay.estimates`) on days held out from those it reports,
#: 5-95 % held 88-91 %: the goal is 80 %
LOW, HIGH = 0.05, 0.95
#: ended sessions a level of the history needs (among those longer than a holder has run) to be used
MIN_SAMPLES = 10

#: Every sentence an estimate says, key -> template. ``when*``: the time; the rest: its basis.
WORDS: dict[str, str] = {
    "when": "About {likely}, likely between {low} and {high}",
    "when_point": "About {likely}",
    "when_open": "About {likely}, likely after {low}, possibly much later",
    "when_after": "Not before {low}, and no later time is known",
    "when_unknown": "No start time can be given yet",
    "history": "going by the {n} sessions recorded on this hub ({level}), given how long each holder has run",
    "level_mine": "each holder judged by its user's own sessions of its profile",
    "level_profile": "each judged by its profile's sessions where its user has too few",
    "level_hub": "judged by all of them where a profile has too few",
    "no_history": "no session has ended on this hub yet, so nothing tells how long sessions last",
    "beyond": "no session recorded lasted as long as {n} of the holders have already run",
    "bounds": "{n} of the {holders} holders must give their GPUs back by a known time, the first by {time} ({why})",
    "bounds_all": "every holder must give its GPUs back by a known time, the first by {time} ({why})",
    "no_bounds": "no holder of these GPUs has a time limit",
    "no_holders": "none of these GPUs is held",
    "ahead": "{n} requests ahead of yours",
    "ahead_one": "1 request ahead of yours",
    "bound_job": "a notebook job's time limit",
    "bound_walltime": "a server's walltime limit",
    "bound_idle": "the idle culler stops GPUs left idle",
    "if_queued": "If you queue now: {when}. {basis}.",
}
_LEVELS = ("mine", "profile", "hub")


@dataclass(frozen=True)
class Ask:
    """A request for GPUs: the one estimated, or one ahead of it in the queue."""

    owner: str
    count: int
    user: str = ""
    profile: str = ""
    gives_up: float | None = None  # when it leaves the queue unserved (joined + the queue's limit)
    groups: frozenset[str] | None = None  # the groups it could use (None: all those the estimate sees)
    models: tuple[str, ...] = ()  # the models it asks for, for :func:`for_gpus` (empty: any)


@dataclass(frozen=True)
class Holder:
    """An owner holding ``count`` GPUs of ``group`` since ``since`` (epoch seconds).

    ``latest``: the latest it gives them back (None: nothing bounds it); ``bound``: why, a key of
    :data:`WORDS` after ``bound_`` (``job``, ``walltime``, ``idle``). ``group``: the host and model
    of its GPUs (a request's GPUs all come from one group).
    """

    owner: str
    count: int
    since: float
    group: str = ""
    user: str = ""
    profile: str = ""
    latest: float | None = None
    bound: str = ""
    usable: bool = True  # False: GPUs the asking user holds elsewhere, which count only against its quota


@dataclass(frozen=True)
class Holding:
    """What the hub knows about an owner of GPUs, for :func:`for_gpus` (a :class:`Holder` less its GPUs)."""

    since: float
    user: str = ""
    profile: str = ""
    latest: float | None = None
    bound: str = ""


class History:
    """Lengths (seconds) of ended sessions per (profile, user), per profile, and on the whole hub."""

    def __init__(self, sessions: Iterable[tuple[str, str, float]], min_samples: int = MIN_SAMPLES) -> None:
        by: dict[tuple, list[float]] = {}
        for profile, user, seconds in sessions:
            for key in (("mine", profile, user), ("profile", profile), ("hub",)):
                by.setdefault(key, []).append(float(seconds))
        self._by = {key: sorted(v) for key, v in by.items()}
        self.min_samples = min_samples

    def __len__(self) -> int:
        return len(self._by.get(("hub",), ()))

    def add(self, profile: str, user: str, seconds: float) -> None:
        """One more ended session."""
        for key in (("mine", profile, user), ("profile", profile), ("hub",)):
            bisect.insort(self._by.setdefault(key, []), float(seconds))

    def lengths(self, profile: str, user: str, ran: float) -> tuple[list[float], int, str]:
        """(sorted lengths, index of the first longer than ``ran``, level) at the most specific level
        with :attr:`min_samples` sessions longer than ``ran``; the hub's with fewer; level "" with none."""
        for level, key in zip(_LEVELS, (("mine", profile, user), ("profile", profile), ("hub",)), strict=True):
            found = self._by.get(key, [])
            first = bisect.bisect_right(found, ran)
            if len(found) - first >= self.min_samples or (level == "hub" and first < len(found)):
                return found, first, level
        return [], 0, ""


@dataclass(frozen=True)
class Estimate:
    """A request's likely start (epoch seconds), its interval, and what they rest on.

    ``likely``/``low``/``high`` are None where no time is known (``high`` alone: no upper end);
    ``starts``: the start in each scenario, sorted (inf where it never starts; empty where not simulated).
    """

    likely: float | None
    low: float | None
    high: float | None
    basis: str
    starts: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def when(self, now: float | None = None) -> str:
        """The time part, as a user reads it (times with their date when not on ``now``'s day)."""
        now = time.time() if now is None else now
        t = {k: _utc_time(v, now) for k, v in (("likely", self.likely), ("low", self.low), ("high", self.high))
             if v is not None}
        if self.likely is None:
            key = "when_after" if self.low is not None else "when_unknown"
        elif self.high is None:
            key = "when_open"
        else:
            key = "when_point" if t["low"] == t["high"] else "when"
        return WORDS[key].format(**t)

    def sentence(self, now: float | None = None) -> str:
        """The time and its basis: "About 10:40 UTC, likely between 10:25 UTC and 11:05 UTC. Going by ..."."""
        return f"{self.when(now)}. {self.basis}."

    def as_json(self, now: float | None = None) -> dict:
        """The REST fields: ``likely``, ``low``, ``high`` (epoch seconds or null), ``text`` (:meth:`sentence`)
        and ``basis``."""
        return {"likely": self.likely, "low": self.low, "high": self.high, "text": self.sentence(now),
                "basis": self.basis}


def latest_end(since: float, limit: float | None = None, limit_kind: str = "job", idle_since: float | None = None,
               idle_timeout: float | None = None) -> tuple[float | None, str]:
    """A holder's latest end and why (a :class:`Holder`'s ``latest`` and ``bound``): its start plus its
    time ``limit`` (``limit_kind``: ``job``, a notebook job's limit, or ``walltime``, a server's), or,
    for GPUs idle since ``idle_since``, when the idle culler stops them (``idle_timeout`` later),
    whichever comes first; ``(None, "")`` when neither applies."""
    ends = []
    if limit is not None:
        ends.append((since + limit, limit_kind))
    if idle_since is not None and idle_timeout is not None:
        ends.append((idle_since + idle_timeout, "idle"))
    return min(ends, default=(None, ""))


@functools.lru_cache(maxsize=16384)
def _draws(owner: str, n: int) -> tuple[array, array, array]:
    """``owner``'s ``n`` draws (uniform in [0, 1), one per scenario), the same every run and kept while it
    holds GPUs: in scenario order, sorted, and the scenario of each sorted draw."""
    rng = random.Random(owner)  # a str seed is hashed with SHA-512: the same every run
    drawn = [rng.random() for _ in range(n)]
    order = sorted(range(n), key=drawn.__getitem__)
    return array("d", drawn), array("d", (drawn[j] for j in order)), array("H", order)


def _lengths(history: History, owner: str, profile: str, user: str, ran: float, n: int) -> tuple[list[float], str]:
    """``n`` drawn lengths (inf where nothing longer than ``ran`` is recorded) and the level used."""
    found, first, level = history.lengths(profile, user, ran)
    if not level:
        return [math.inf] * n, ""
    span = len(found) - first
    return [found[first + min(span - 1, int(u * span))] for u in _draws(owner, n)[0]], level


def _start(free: Mapping[str, int], ends: list[tuple[float, int, str, int]], queue: Sequence[tuple],
           now: float, own: int, quota: float) -> float | None:
    """When the last of ``queue`` starts: ``(count, held for, gives up at, same user, groups)`` in queue order
    (groups None: any).

    ``ends``: when each holding gives its GPUs back, ``(time, GPUs, group, GPUs of the user asking)``
    (group "": GPUs elsewhere, counted only against the quota); ``own``: the GPUs that user holds
    now, which with what it asks may not exceed ``quota``. A request takes the group with the fewest
    free GPUs that has room for it (the placement's best fit). An end of -1 GPUs is a horizon: ``ends``
    holds every end before it, none after; None when the start lies beyond it.
    """
    heapq.heapify(ends)
    room = dict(free)
    t = now
    for count, hold, gives_up, same, groups in queue:
        if t > gives_up:
            continue  # it left the queue before its turn
        cap = quota - count if same else math.inf
        while True:
            fits = [(n, g) for g, n in room.items() if n >= count and (groups is None or g in groups)]
            if fits and own <= cap:
                break
            if not ends or ends[0][0] > gives_up:
                fits = []
                break
            back = give_back(ends, room)
            if back is None:
                return None  # what happens next depends on ends not known here
            t, own = max(t, back[0]), own - back[1]
        if fits:
            own += take(room, ends, min(fits)[1], count, hold, same, t)
            continue
        if gives_up == math.inf:
            return math.inf  # nothing known ever frees enough
        t = max(t, gives_up)
    return t


def _quantile(values: list[float], q: float) -> float | None:
    v = values[max(0, math.ceil(q * len(values)) - 1)]
    return None if v == math.inf else v


class _Row:
    """A holder as the scenarios see it: its drawn end in scenario ``j`` is :meth:`end`."""

    __slots__ = ("h", "found", "first", "span", "cap", "key")

    def __init__(self, h: Holder, found: list[float], first: int, cap: float, same: bool) -> None:
        self.h, self.found, self.first, self.span, self.cap = h, found, first, len(found) - first, cap
        self.key = (h.count if h.usable else 0, h.group if h.usable else "", h.count * same)

    def end(self, u: float, now: float) -> float:
        length = self.found[self.first + min(self.span - 1, int(u * self.span))] if self.span else math.inf
        return max(now, min(self.h.since + length, self.cap))

    def ends(self, now: float, n: int) -> list[float]:
        """Its drawn end in each of ``n`` scenarios."""
        if not self.span:
            return [max(now, self.cap)] * n
        found, first, span, since, cap = self.found, self.first, self.span, self.h.since, self.cap
        return [max(now, min(since + found[first + min(span - 1, int(u * span))], cap))
                for u in _draws(self.h.owner, n)[0]]

    def ends_by(self, horizon: float, n: int) -> Iterable[tuple[int, float]]:
        """(scenario, draw) of the scenarios where it ends by ``horizon`` (and perhaps a few more)."""
        _, ordered, order = _draws(self.h.owner, n)
        if self.cap <= horizon:
            cut = n
        elif not self.span:
            return ()
        else:  # its end is by the horizon where the index of its drawn length is below ``m``
            m = bisect.bisect_right(self.found, horizon - self.h.since) - self.first
            cut = n if m >= self.span else bisect.bisect_left(ordered, m / self.span + 1e-12)
        return zip(order[:cut], ordered[:cut], strict=True)


#: the scenarios first run with only the holders' ends up to a horizon that holds :data:`_AHEAD` times the
#: ends the first scenario needed and :data:`_SPARE` more; a scenario that needs more runs again whole
_AHEAD, _SPARE = 4, 32


def estimate(
    ask: Ask, now: float, free: Mapping[str, int], holders: Sequence[Holder], ahead: Sequence[Ask],
    history: History, samples: int = SAMPLES, quota: int | None = None, backfill: str = "off",
) -> Estimate:
    """When ``ask`` likely starts, behind ``ahead`` (in queue order), with ``free`` GPUs per group and
    ``holders`` of the rest (and of the asking user's GPUs elsewhere, ``usable=False``), where a user
    may hold ``quota`` GPUs at most and the queue's ``backfill`` rule (:data:`~gpuspawner.queue.BACKFILL`)
    lets requests start out of order (:mod:`gpuspawner.estimate_backfill`; ``"off"``: strict order).

    Only the ends that can matter are simulated: each scenario first runs with the holders' ends up
    to a horizon (set by the first scenario, run whole); a scenario whose start lies past it runs
    again whole, so the result is that of simulating every holder in every scenario."""
    if backfill not in BACKFILL:
        raise ValueError(f"backfill must be one of {', '.join(BACKFILL)}, not {backfill!r}")
    levels: Counter[str] = Counter()
    beyond = 0
    rows = []
    limit = math.inf if quota is None else quota
    sizes = Counter(free)
    for h in holders:
        sizes[h.group] += h.count if h.usable else 0

    def same(user: str) -> bool:
        return bool(ask.user) and user == ask.user

    for h in holders:
        found, first, level = history.lengths(h.profile, h.user, max(0.0, now - h.since))
        if not h.usable:
            pass
        elif level:
            levels[level] += 1
        elif len(history):
            beyond += 1
        rows.append(_Row(h, found if level else [], first, math.inf if h.latest is None else max(h.latest, now),
                         same(h.user)))
    holds = [_lengths(history, a.owner, a.profile, a.user, 0.0, samples)[0] for a in ahead]
    own = sum(h.count for h in holders if same(h.user))
    queue = [(a.count, math.inf, math.inf if a.gives_up is None else a.gives_up, same(a.user), a.groups)
             for a in ahead]
    queue.append((ask.count, math.inf, math.inf, True, ask.groups))

    nearest = NearestHost(queue, sizes) if backfill == "nearest-host" else None

    def run(j: int, ends: list[tuple[float, int, str, int]]) -> float | None:
        for i, drawn in enumerate(holds):
            queue[i] = (queue[i][0], drawn[j], *queue[i][2:])
        if backfill == "off":
            return _start(free, ends, queue, now, own, limit)
        return start_backfill(free, ends, queue, now, own, limit, nearest)

    def whole(j: int) -> float:
        return run(j, [(r.end(_draws(r.h.owner, samples)[0][j], now), *r.key) for r in rows])

    if len(rows) <= _SPARE or (own and quota is not None):  # every scenario whole: each holder's ends at once
        table = [r.ends(now, samples) for r in rows]
        return _estimate(sorted(run(j, [(ends[j], *r.key) for ends, r in zip(table, rows, strict=True)])
                                for j in range(samples)), now, holders, ahead, history, levels, beyond)
    starts: list[float | None] = [None] * samples
    starts[0] = whole(0)
    first_ends = sorted(r.end(_draws(r.h.owner, samples)[0][0], now) for r in rows)
    needed = bisect.bisect_right(first_ends, starts[0])
    horizon = first_ends[min(len(first_ends) - 1, _AHEAD * needed + _SPARE)]
    known: list[list[tuple[float, int, str, int]]] = [[(horizon, -1, "", 0)] for _ in range(samples)]
    for r in rows:
        for j, u in r.ends_by(horizon, samples):
            known[j].append((r.end(u, now), *r.key))
    for j in range(1, samples):
        starts[j] = run(j, known[j])
    for j in range(samples):
        if starts[j] is None:
            starts[j] = whole(j)
    return _estimate(sorted(starts), now, holders, ahead, history, levels, beyond)


def _estimate(starts: list[float], now: float, holders: Sequence[Holder], ahead: Sequence[Ask], history: History,
              levels: Mapping[str, int], beyond: int) -> Estimate:
    shown = [h for h in holders if h.usable]
    return Estimate(_quantile(starts, 0.5), _quantile(starts, LOW), _quantile(starts, HIGH),
                    basis(now, shown, ahead, history, levels, beyond), tuple(starts))


def basis(now: float, holders: Sequence[Holder], ahead: Sequence[Ask], history: History,
          levels: Mapping[str, int], beyond: int) -> str:
    """What an estimate rests on, in words (see :data:`WORDS`)."""
    parts = []
    if not len(history):
        parts.append(WORDS["no_history"])
    elif levels:
        level = max(levels, key=_LEVELS.index)  # the broadest level any holder needed
        parts.append(WORDS["history"].format(n=len(history), level=WORDS["level_" + level]))
    if beyond:
        parts.append(WORDS["beyond"].format(n=beyond))
    if ahead:
        parts.append(WORDS["ahead_one"] if len(ahead) == 1 else WORDS["ahead"].format(n=len(ahead)))
    bounded = [h for h in holders if h.latest is not None]
    if not holders:
        parts.append(WORDS["no_holders"])
    elif bounded:
        why = ", ".join(WORDS["bound_" + b] for b in sorted({h.bound for h in bounded}) if "bound_" + b in WORDS)
        key = "bounds_all" if len(bounded) == len(holders) else "bounds"
        parts.append(WORDS[key].format(n=len(bounded), holders=len(holders), why=why or "a limit",
                                            time=_utc_time(max(now, min(h.latest for h in bounded)), now)))
    else:
        parts.append(WORDS["no_bounds"])
    text = "; ".join(parts)
    return text[:1].upper() + text[1:]


def for_gpus(
    ask: Ask, now: float, gpus: Iterable[GPU], holders: Mapping[str, str], holdings: Mapping[str, Holding],
    ahead: Sequence[Ask], history: History, samples: int = SAMPLES, quota: int | None = None,
    backfill: str = "off",
) -> Estimate:
    """:func:`estimate` (under the queue's ``backfill`` rule) from the inventory ``gpus``, ``holders``
    (GPU UUID -> owner) and what is known of each owner (``holdings``; an owner missing there counts as
    just started). Each request's groups are those of the healthy GPUs of its ``models`` (the queue's
    own rule); where a ``quota`` applies, what the asking user holds elsewhere counts against it."""
    gpus = tuple(gpus)
    wanted = _Wanted(gpus)
    named = [(g, f"{g.host}/{g.name}") for g in gpus]
    healthy: dict[str, set[str]] = {}  # model slug -> the groups of its healthy GPUs
    for g, group in named:
        if g.healthy:
            healthy.setdefault(model_slug(g.name), set()).add(group)
    groups: dict[tuple[str, ...], frozenset[str]] = {}
    for a in (*ahead, ask):
        if a.models not in groups:
            groups[a.models] = frozenset().union(*(healthy.get(s, ()) for s in wanted(a.models)))
    asks = [replace(a, groups=groups[a.models]) for a in (*ahead, ask)]
    seen = frozenset().union(*groups.values())
    free: Counter[str] = Counter()
    held: Counter[tuple[str, str]] = Counter()
    for g, group in named:
        owner = holders.get(g.uuid)
        if group not in seen:
            if owner is not None and quota is not None and (holdings.get(owner) or Holding(now)).user == ask.user:
                held[owner, ""] += 1
        elif owner is None:
            free[group] += 1
        else:
            held[owner, group] += 1
    rows = []
    for (owner, group), count in sorted(held.items()):
        h = holdings.get(owner) or Holding(now)
        rows.append(Holder(owner, count, h.since, group, h.user, h.profile, h.latest, h.bound, usable=bool(group)))
    return estimate(asks[-1], now, dict(free), rows, asks[:-1], history, samples, quota, backfill)
