"""GPU-hour budgets: the pure core (no I/O). What each user may still use, and when it comes back.

A **budget** (:class:`BudgetSpec`) is a number of weighted GPU-hours per period: a ``day``,
a ``week`` or a ``month``, either **calendar** (UTC; a week starts on Monday 00:00, a month
on its 1st) or **rolling** (the last 24 hours, 7 days or 30 days up to now).

**Weights** (:func:`weight`): an hour of a GPU counts as its model's factor, the first of
the configured ``(pattern, factor)`` pairs whose pattern matches the model the usage
records keep (a shell pattern such as ``"a100*"`` or ``"nvidia.com/mig-1g*"``; a pattern
without ``*?[`` matches as profiles' model slugs do: ``"a100"`` matches
``a100-sxm4-80gb``); no match counts 1. The records keep one GPU per MIG slice or shared
replica, so a slice counts as its fraction of a GPU through its weight (e.g.
``{"nvidia.com/mig-1g*": 1/7}``). The unit is the site's (``"A100-hours"``: the hour
of whatever weighs 1).

**Used** (:meth:`BudgetPolicy.standing`): every row of ``gpuspawner_allocations`` that
overlaps the period counts GPU count x overlap x weight (:func:`gpuspawner.usage.shares`,
the one rule usage reports count by too), a still-held allocation up to now. Held time
counts, busy or idle. A user's own budget counts their servers and jobs; a group's budget
is shared by its members: it counts every allocation recorded with that group.

**Which budgets apply** to a user: their own (``per_user``, or the admin's override for
them, which replaces it; an override of None leaves them without one) and each budget of
a group they are in. Each is a :class:`BudgetLine`; the user's standing is spent when any
line is (:attr:`Standing.exhausted`), and what is left is the smallest left
(:attr:`Standing.binding`).

**When it resets** (:attr:`BudgetLine.resets`): calendar, the end of the period; rolling,
when the oldest use counted now starts to leave the window (its first counted moment plus
the window's length); None when nothing is counted. **When GPUs open again** for a spent
budget (:attr:`BudgetLine.available_again`, the ``retry_time`` of jupyterhub-usage-quotas):
calendar, the end of the period; rolling, the earliest moment enough use has left the
window for something to be left, if nothing more is used from now (still-held allocations
counted as ending now).

**Hook**: :func:`crossed_low` says when a user's left fell to the "low" share of its limit (or
below) since it was last looked at. The hub's :class:`gpuspawner.backends.budgets.BudgetKeeper`
(``budget_keeper(hub_state)``) looks at a user's budgets at each of their GPU spawns, form, budgets
API and usage page reads, and at least every ``gpu_budget_check_interval`` seconds for the users
holding GPUs (the running-server watch, :func:`gpuspawner.hub.budget_notices.watch`); each time a
user crosses ``gpu_budget_low`` it calls ``callback(user, standing)`` of every
``keeper.on_low(callback)``: where notifications and the running-server budget watch attach.
``keeper.last`` holds each user's last standing.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from .gpu import slug_matches
from .refusals import words
from .usage import Allocation, shares

__all__ = ["EXHAUSTED", "PERIODS", "QUOTA_ERROR", "BudgetError", "BudgetLine", "BudgetPolicy", "BudgetSpec", "Standing",
           "cost_per_hour", "crossed_low", "parse_spec", "parse_weights", "weight"]

#: the periods a budget may count over
PERIODS = ("day", "week", "month")
#: a rolling period's length in seconds
ROLLING_SECONDS = {"day": 86400.0, "week": 7 * 86400.0, "month": 30 * 86400.0}
#: what the hub does when a budget is spent (``gpu_budget_exhausted``)
EXHAUSTED = ("refuse", "queue-last")
#: how each period is said after "left": calendar, rolling
PERIOD_WORDS = {
    ("day", False): "today", ("week", False): "this week", ("month", False): "this month",
    ("day", True): "in the last 24 hours", ("week", True): "in the last 7 days", ("month", True): "in the last 30 days",
}
SPEC_KEYS = ("hours", "period", "rolling")
#: the 422's reason and its body's ``error``, as jupyterhub-usage-quotas 0.2 names it
QUOTA_ERROR = "compute-quota-exceeded"


class BudgetError(ValueError):
    """A budget setting that cannot be used; its text names the setting."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class BudgetSpec:
    """``hours`` weighted GPU-hours per ``period`` (calendar, or ``rolling``)."""

    hours: float
    period: str = "week"
    rolling: bool = False

    @property
    def length(self) -> float:
        """The rolling window's length in seconds (a calendar period's nominal length)."""
        return ROLLING_SECONDS[self.period]

    def window(self, now: float) -> tuple[float, float]:
        """The period counted at ``now``: [start, end) in epoch seconds (rolling: ends at ``now``)."""
        if self.rolling:
            return now - self.length, now
        day = datetime.fromtimestamp(now, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        if self.period == "day":
            start, end = day, day + timedelta(days=1)
        elif self.period == "week":
            start = day - timedelta(days=day.weekday())
            end = start + timedelta(days=7)
        else:
            start = day.replace(day=1)
            end = (start + timedelta(days=32)).replace(day=1)
        return start.timestamp(), end.timestamp()

    @property
    def words(self) -> str:
        """The period as the form says it after "left": "this week", "in the last 7 days"."""
        return PERIOD_WORDS[(self.period, self.rolling)]

    def as_json(self) -> dict:
        return {"hours": self.hours, "period": self.period, "rolling": self.rolling}


def parse_spec(value: Any, setting: str, period: str = "week", rolling: bool = False,
               allow_none: bool = False) -> BudgetSpec | None:
    """A budget from configuration: a number of hours (in ``period``, ``rolling`` or not), or a dict
    ``{"hours": 20, "period": "week", "rolling": True}`` (missing keys: ``period`` and ``rolling``).

    None gives None where ``allow_none``. :class:`BudgetError` names ``setting`` and what is wrong.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in SPEC_KEYS]
        if unknown:
            raise BudgetError(f"{setting}: unknown key {unknown[0]!r}; a budget has {', '.join(SPEC_KEYS)}")
        if "hours" not in value:
            raise BudgetError(f"{setting}: a budget needs 'hours', e.g. {{'hours': 20, 'period': 'week'}}")
        hours, period, rolling = value["hours"], value.get("period", period), value.get("rolling", rolling)
    else:
        hours = value
    if not _number(hours) or hours < 0:
        raise BudgetError(f"{setting}: {hours!r} is not a number of GPU-hours (a finite number, 0 or more)")
    if period not in PERIODS:
        raise BudgetError(f"{setting}: period {period!r} is not one of {', '.join(PERIODS)}")
    if not isinstance(rolling, bool):
        raise BudgetError(f"{setting}: rolling must be true or false, not {rolling!r}")
    return BudgetSpec(float(hours), period, rolling)


def parse_weights(value: Any, setting: str = "gpu_budget_weights") -> tuple[tuple[str, float], ...]:
    """``{pattern: factor}`` from configuration, in its order; :class:`BudgetError` names the bad entry."""
    if not isinstance(value, Mapping):
        raise BudgetError(f"{setting}: must be a dict of model pattern -> factor, e.g. {{'a100*': 4, 't4': 1}}")
    out = []
    for pattern, factor in value.items():
        if not isinstance(pattern, str) or not pattern.strip():
            raise BudgetError(f"{setting}: {pattern!r} is not a model pattern (a non-empty string)")
        if not _number(factor) or factor < 0:
            raise BudgetError(f"{setting}[{pattern!r}]: {factor!r} is not a factor (a finite number, 0 or more)")
        out.append((pattern.strip().lower(), float(factor)))
    return tuple(out)


def weight(model: str, weights: Sequence[tuple[str, float]]) -> float:
    """The factor an hour of ``model`` (a slug, or a cluster resource) counts by: the first pattern's that
    matches, else 1."""
    model = (model or "").lower()
    for pattern, factor in weights:
        glob = any(c in pattern for c in "*?[")
        if fnmatch.fnmatchcase(model, pattern) if glob else slug_matches(pattern, model):
            return factor
    return 1.0


def cost_per_hour(count: int, model: str, weights: Sequence[tuple[str, float]]) -> float:
    """What ``count`` GPUs of ``model`` cost per hour held, in the budget's unit."""
    return count * weight(model, weights)


def _hours(value: float) -> str:
    """A number of hours as the sentences say it: "6.5", "20", "0.25"."""
    return f"{round(value, 2):g}"


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class BudgetLine:
    """One budget that applies to a user, and where it stands at ``now``."""

    scope: str  # "user" or "group"
    name: str  # the user's or the group's name
    spec: BudgetSpec
    used: float  # weighted GPU-hours counted in the period
    since: float
    until: float
    resets: float | None
    available_again: float | None  # for a spent budget; None when not spent (or never, for a limit of 0)

    @property
    def limit(self) -> float:
        return self.spec.hours

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.used)

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def as_json(self) -> dict:
        return {"scope": self.scope, "name": self.name, **self.spec.as_json(),
                "limit": round(self.limit, 4), "used": round(self.used, 4), "left": round(self.left, 4),
                "exhausted": self.exhausted, "since": _iso(self.since), "until": _iso(self.until),
                "resets": _iso(self.resets), "available_again": _iso(self.available_again)}

    def whose(self) -> str:
        return "you have" if self.scope == "user" else f"group '{self.name}' has"


@dataclass(frozen=True)
class Standing:
    """A user's budgets at ``now`` (none: no budget applies, nothing is limited)."""

    user: str
    unit: str
    now: float
    lines: tuple[BudgetLine, ...] = ()

    @property
    def binding(self) -> BudgetLine | None:
        """The budget with the least left (a spent one first: the one that opens again last)."""
        if not self.lines:
            return None
        spent = [b for b in self.lines if b.exhausted]
        if spent:
            return max(spent, key=lambda b: (b.available_again is None, b.available_again or 0.0))
        return min(self.lines, key=lambda b: (b.left, b.scope != "user"))

    @property
    def exhausted(self) -> bool:
        return any(b.exhausted for b in self.lines)

    @property
    def left(self) -> float | None:
        binding = self.binding
        return None if binding is None else binding.left

    def summary(self) -> str:
        """What the form says: "6.5 of 20 A100-hours left this week" (empty: no budget applies)."""
        b = self.binding
        if b is None:
            return ""
        text = f"{_hours(b.left)} of {_hours(b.limit)} {self.unit} left {b.spec.words}"
        return text if b.scope == "user" else f"{text} (group '{b.name}')"

    def sentence(self) -> str:
        """The refusal's sentence (refusals.py's ``budget``), naming used, limit and when GPUs open again."""
        b = self.binding
        return words("budget", whose=b.whose(), used=_hours(b.used), limit=_hours(b.limit), unit=self.unit,
                     period=b.spec.words,
                     reset="" if b.available_again is None else words("budget_reset", time=_utc(b.available_again)))

    def as_json(self) -> dict:
        b = self.binding
        return {"user": self.user, "unit": self.unit, "at": _iso(self.now),
                "left": None if b is None else round(b.left, 4), "limit": None if b is None else round(b.limit, 4),
                "exhausted": self.exhausted, "summary": self.summary(), "budgets": [x.as_json() for x in self.lines]}

    def quota_json(self) -> dict:
        """The 422 body's own fields (beside JupyterHub's ``status`` and ``message``, the sentence).

        jupyterhub-usage-quotas 0.2 refuses with a JupyterHub ``SpawnException`` of status 422 and
        reason ``compute-quota-exceeded``, and words used, limit and reset time (its ``retry_time``)
        from its enforcement output: ``error`` is that reason, ``reset`` that time (ISO 8601, UTC).
        """
        b = self.binding
        return {"error": QUOTA_ERROR, "resource": "gpu", "used": round(b.used, 4), "limit": round(b.limit, 4),
                "left": round(b.left, 4), "unit": self.unit, "reset": _iso(b.available_again),
                "period": b.spec.period, "rolling": b.spec.rolling, "scope": {b.scope: b.name},
                "timestamp": _iso(self.now)}


def _groups(row: Any, parsed: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """A usage row's groups (JSON); ``parsed``: the texts already parsed in this reading (rows share a
    few, and a reading of every user's standing goes over all of them)."""
    text = row.groups or "[]" if isinstance(row.groups, str) else None
    if text is None:
        return ()
    found = parsed.get(text) if parsed is not None else None
    if found is None:
        try:
            listed = json.loads(text)
        except ValueError:
            listed = ()
        found = tuple(listed) if isinstance(listed, list) else ()
        if parsed is not None:
            parsed[text] = found
    return found


def counted(scope: str, name: str, row: Any) -> bool:
    """Whether a usage row counts in the budget of ``scope`` (``"user"`` or ``"group"``) ``name``."""
    return row.user == name if scope == "user" else name in _groups(row)


def _weighted_hours(rows: Iterable[Allocation], since: float, until: float, now: float,
                    weights: Sequence[tuple[str, float]]) -> tuple[float, float | None]:
    """(weighted GPU-hours in [since, until), the first counted moment or None)."""
    total, first = 0.0, None
    for part in shares(list(rows), since, until, now):
        total += part.held * weight(part.row.model, weights)
        start = max(part.row.started, since)
        first = start if first is None else min(first, start)
    return total / 3600.0, first


def _available_again(rows: list[Allocation], spec: BudgetSpec, used: float, now: float,
                     weights: Sequence[tuple[str, float]]) -> float | None:
    """When a spent budget has something left again if nothing more is used (see the module's words).

    Rolling: as the window's start moves on from ``now - length``, each counted span [a, b) stops
    counting at its rate (GPUs x weight per hour) while the start passes through it; the first
    moment the count falls below the limit, plus the window's length, is the answer (to the second).
    """
    if used < spec.hours or spec.hours <= 0:
        return None
    if not spec.rolling:
        return spec.window(now)[1]
    length = spec.length
    x = now - length
    points = []  # (time, change of the rate at which the count falls as the window's start passes)
    for part in shares(rows, x, now, now):
        a, b = max(part.row.started, x), min(part.row.ended if part.row.ended is not None else now, now)
        if b > a:
            rate = part.held * weight(part.row.model, weights) / (b - a) / 3600.0
            points += [(a, rate), (b, -rate)]
    points.sort()
    remaining, rate, i = used, 0.0, 0
    while True:
        while i < len(points) and points[i][0] <= x:
            rate += points[i][1]
            i += 1
        following = points[i][0] if i < len(points) else math.inf
        if rate > 1e-12 and remaining - rate * (following - x) < spec.hours - 1e-9:  # falls below inside this span
            return float(math.floor(x + (remaining - spec.hours) / rate + length) + 1)
        if following == math.inf:
            return float(math.floor(x + length) + 1)
        remaining -= rate * (following - x)
        x = following


@dataclass(frozen=True)
class BudgetPolicy:
    """The configured budgets (see the module's words); :meth:`standing` is where a user stands."""

    per_user: BudgetSpec | None = None
    per_group: Mapping[str, BudgetSpec] = field(default_factory=dict)
    overrides: Mapping[str, BudgetSpec | None] = field(default_factory=dict)
    weights: tuple[tuple[str, float], ...] = ()
    unit: str = "GPU-hours"
    exhausted: str = "refuse"
    low: float = 0.1

    @property
    def enabled(self) -> bool:
        return self.per_user is not None or bool(self.per_group) or any(v is not None for v in self.overrides.values())

    def applying(self, user: str, groups: Iterable[str]) -> list[tuple[str, str, BudgetSpec]]:
        """(scope, name, budget) of each budget that applies to ``user`` in ``groups``."""
        own = self.overrides[user] if user in self.overrides else self.per_user
        found = [("user", user, own)] if own is not None else []
        found += [("group", g, self.per_group[g]) for g in sorted(set(groups)) if g in self.per_group]
        return found

    def earliest(self, user: str, groups: Iterable[str], now: float) -> float | None:
        """The earliest period start of the budgets that apply: the usage rows to read start there."""
        starts = [spec.window(now)[0] for _, _, spec in self.applying(user, groups)]
        return min(starts) if starts else None

    def standing(self, user: str, groups: Iterable[str], rows: Iterable[Allocation], now: float) -> Standing:
        """Where ``user`` stands at ``now``, from usage ``rows`` (any superset of those that count)."""
        return self.standings({user: groups}, rows, now)[0]

    def standings(self, users: Mapping[str, Iterable[str]], rows: Iterable[Allocation], now: float) -> list[Standing]:
        """Where each of ``users`` (name -> groups) stands at ``now``, the rows sorted by user and group once."""
        by_user: dict[str, list[Allocation]] = {}
        by_group: dict[str, list[Allocation]] = {}
        parsed: dict[str, tuple[str, ...]] = {}
        for r in rows:
            by_user.setdefault(r.user, []).append(r)
            for g in _groups(r, parsed):
                by_group.setdefault(g, []).append(r)
        counted: dict[tuple[str, str, BudgetSpec], BudgetLine] = {}  # a group's line, once for all its members
        out = []
        for user, groups in users.items():
            lines = []
            for scope, name, spec in self.applying(user, groups):
                line = counted.get((scope, name, spec))
                if line is None:
                    mine = (by_user if scope == "user" else by_group).get(name, [])
                    line = counted[(scope, name, spec)] = self._line(scope, name, spec, mine, now)
                lines.append(line)
            out.append(Standing(user, self.unit, now, tuple(lines)))
        return out

    def _line(self, scope: str, name: str, spec: BudgetSpec, rows: list[Allocation], now: float) -> BudgetLine:
        since, until = spec.window(now)
        used, first = _weighted_hours(rows, since, until, now, self.weights)
        resets = until if not spec.rolling else (None if first is None else first + spec.length)
        return BudgetLine(scope, name, spec, used, since, until, resets,
                          _available_again(rows, spec, used, now, self.weights))

    def cost_per_hour(self, count: int, model: str) -> float:
        return cost_per_hour(count, model, self.weights)


def crossed_low(before: Standing | None, after: Standing, low: float) -> bool:
    """Whether ``after`` has at most ``low`` (a share of the limit) left where ``before`` had more, or
    ``before`` is unknown and ``after`` is low. A budget of 0 hours is never "low" (it is simply none)."""
    def is_low(standing: Standing | None) -> bool:
        b = standing.binding if standing is not None else None
        return b is not None and b.limit > 0 and b.left <= low * b.limit

    return is_low(after) and not is_low(before)
