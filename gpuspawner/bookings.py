"""GPU bookings: N GPUs of a model for a window ahead, for a user or a group. Pure: no I/O, no clock.

A :class:`Booking` holds ``count`` GPUs of ``model`` (a model slug as profiles use it, or
``"any"``) in its windows: ``[start, end)``, and for ``repeat_weeks = N > 1`` the same window
each week, N windows in all. :func:`check_new` decides whether a new booking may be taken
(limits from :class:`BookingLimits`, the hub's GPUs per model); :func:`rule` decides whether
someone may take GPUs now, given the bookings ahead (the placement rule):

- ``ok``: within the holder's own booking, or enough GPUs stay unbooked for the whole time the
  holder could keep them (a job whose time limit ends before the next window);
- ``until``: the holder may take them now but must give them back at ``until`` (the start of a
  window that needs them): a server is told so, warned again, and stopped then;
- ``refused``: a window that needs them is on now; the verdict names the booking.

Capacity: at any time, the bookings of a model hold at most the model's GPUs, and all
bookings together (``"any"`` ones included) at most all the hub's GPUs.

A booking whose window went unused past the grace period is *released* (``state =
"released"``, ``released_at``): that window's GPUs are free from ``released_at`` on; a
repeating booking's later windows still hold. A ``cancelled`` booking holds nothing.
Every sentence a user reads about bookings is in :data:`WORDS`.
"""

from __future__ import annotations

import math
import secrets
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timezone

from .gpu import slug_matches

__all__ = ["ANY", "MAX_REPEAT", "PAST_SLACK", "STATES", "WEEK", "WORDS", "Booking", "BookingError", "BookingLimits",
           "Verdict", "as_record", "booked_at", "check_new", "for_job", "held_windows", "holding", "kept", "moment",
           "new_id", "rule", "span", "verdicts", "windows"]

ANY = "any"
WEEK = 7 * 24 * 3600.0
#: seconds a new booking's start may lie behind now (a form filled in for "now" takes a while to send)
PAST_SLACK = 300.0
#: the most weekly windows one booking may have
MAX_REPEAT = 52
STATES = ("booked", "released", "cancelled")
#: epoch seconds of Monday 1970-01-05 00:00 UTC: weeks for ``hours_per_week`` run Monday to Sunday, UTC
_MONDAY = 4 * 24 * 3600.0

#: Every sentence about bookings: key -> (the field it is about, template for :meth:`str.format`).
WORDS: dict[str, tuple[str, str]] = {
    "who": ("user", "Book for one user or for one group: give user or group, not both."),
    "group_admin": ("group", "Only administrators book GPUs for a group."),
    "for_other": ("user", "Only administrators book GPUs for another user; leave user out to book for yourself."),
    "model": ("model", "{model} is not a GPU model of this hub; models here: {models}."),
    "count": ("count", "{count} GPUs cannot be booked: this hub has {most} {model} GPUs; book 1 to {most}."),
    "past": ("start", "The booking would start in the past ({start}); start it now or later."),
    "order": ("end", "The booking would end ({end}) before it starts ({start}); the end must come after the start."),
    "window": ("end", "The booking would last {length}; a booking lasts at most {most}."),
    "ahead": ("start", "The booking would start {length} from now; bookings start at most {most} ahead."),
    "repeat": ("repeat_weeks", "repeat_weeks must be a whole number from 0 to {most}, not {value}."),
    "hours": ("count", "That would book {total:g} GPU-hours for {holder} in the week of {week}; "
                       "at most {most:g} GPU-hours a week may be booked."),
    "full": ("count", "Only {free} of the {total} {model} GPUs are free to book {window}: "
                      "{others}. Pick another time, model or count."),
    "booked": ("", "{count} {model} {gpus} {are} booked {window} for {holder} (booked by {booked_by})."),
    "refused": ("", "{booking} Only {free} of {total} {model} {gpus} {are} not booked now. "
                    "Pick another model or start after {end}."),
    "until": ("", "{booking} You may use them until then: this server will be stopped at {at}."),
    "job_until": ("", "{booking} A notebook job here could run past {at}: pick another model, or start it "
                      "after {end}."),
}


class BookingError(ValueError):
    """A booking that cannot be taken: ``key`` of :data:`WORDS`, ``field`` it is about, the sentence."""

    def __init__(self, key: str, **values: object) -> None:
        self.field, template = WORDS[key]
        self.key = key
        self.values = values
        super().__init__(template.format(**values))


@dataclass(frozen=True, kw_only=True)
class Booking:
    """``count`` GPUs of ``model`` for ``user`` or ``group`` in the windows from ``start``-``end`` (see module)."""

    id: str
    user: str = ""
    group: str = ""
    booked_by: str
    model: str
    count: int
    start: float
    end: float
    repeat_weeks: int = 0
    created: float = 0.0
    state: str = "booked"
    released_at: float | None = None
    note: str = ""

    @property
    def holder(self) -> str:
        """Whom it is for, as sentences name it: the user, or ``group NAME``."""
        return self.user or f"group {self.group}"

    def is_for(self, user: str, groups: Iterable[str]) -> bool:
        """Whether ``user`` (a member of ``groups``) may use this booking's GPUs."""
        return (bool(self.user) and self.user == user) or (bool(self.group) and self.group in set(groups))

    @property
    def last_end(self) -> float:
        return self.end + (max(self.repeat_weeks, 1) - 1) * WEEK


@dataclass(frozen=True)
class BookingLimits:
    """What non-administrators may book (from the hub's ``gpu_booking_*`` settings)."""

    hours_per_week: float = 40.0  # GPU-hours of windows per user (or group) in a week, Monday to Sunday UTC
    max_ahead: float = 30 * 24 * 3600.0  # a first window starts at most this many seconds from now
    max_window: float = 12 * 3600.0  # one window lasts at most this many seconds
    grace: float = 15 * 60.0  # seconds an unused window waits before it is released
    group_admin_only: bool = True  # only administrators book for groups


@dataclass(frozen=True)
class Verdict:
    """The placement rule's answer: ``kind`` ok | until | refused; ``until`` and ``booking`` where they apply."""

    kind: str
    until: float | None = None
    booking: Booking | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.kind != "refused"


def new_id() -> str:
    return "b-" + secrets.token_hex(3)


def windows(b: Booking, since: float, until: float) -> list[tuple[float, float]]:
    """``b``'s windows (its calendar, whatever its state) that overlap ``[since, until)``."""
    n = max(b.repeat_weeks, 1)
    length = b.end - b.start
    first = max(0, math.floor((since - b.end) / WEEK)) if math.isfinite(since) else 0
    out = []
    for k in range(first, n):
        s = b.start + k * WEEK
        if s >= until:
            break
        if s + length > since:
            out.append((s, s + length))
    return out


def held_windows(b: Booking, since: float, until: float) -> list[tuple[float, float]]:
    """The parts of ``b``'s windows in ``[since, until)`` that hold GPUs: none when cancelled; a released
    window ends at ``released_at``."""
    if b.state == "cancelled":
        return []
    out = []
    for s, e in windows(b, since, until):
        if b.released_at is not None and s <= b.released_at < e:
            e = b.released_at
        if e > max(s, since):
            out.append((s, e))
    return out


def holding(b: Booking, t: float) -> tuple[float, float] | None:
    """The window of ``b`` that holds GPUs at ``t``, if one does."""
    return next(((s, e) for s, e in held_windows(b, t, t + 1) if s <= t < e), None)


def booked_at(bookings: Iterable[Booking], t: float) -> dict[str, list[tuple[Booking, int]]]:
    """What is booked at ``t``: model -> [(booking, GPUs)]."""
    out: dict[str, list[tuple[Booking, int]]] = defaultdict(list)
    for b in bookings:
        if holding(b, t):
            out[b.model].append((b, b.count))
    return dict(out)


def span(start: float, end: float) -> str:
    """A window as sentences say it: ``2026-11-27 10:00-12:00 UTC`` (the end's date where it differs)."""
    s = datetime.fromtimestamp(start, timezone.utc)
    e = datetime.fromtimestamp(end, timezone.utc)
    tail = e.strftime("%H:%M") if e.date() == s.date() else e.strftime("%Y-%m-%d %H:%M")
    return f"{s.strftime('%Y-%m-%d %H:%M')}-{tail} UTC"


def moment(t: float) -> str:
    """A time as sentences say it: ``2026-11-27 10:00 UTC``."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _length(seconds: float) -> str:
    if seconds >= 2 * 24 * 3600:
        return f"{seconds / 86400:g} days"
    if seconds >= 3600:
        return f"{round(seconds / 3600, 2):g} hours"
    return f"{round(seconds / 60, 1):g} minutes"


# ------------------------------------------------------------------ capacity over time


def _demand(bookings: Iterable[Booking], since: float, until: float) -> list[tuple[float, float, Booking]]:
    return [(s, e, b) for b in bookings for s, e in held_windows(b, since, until)]


def _peaks(parts: list[tuple[float, float, Booking]], since: float, until: float,
           model: str | None) -> list[tuple[float, int, list[Booking]]]:
    """(time, GPUs booked then, bookings holding then) at ``since`` and at each window start inside
    ``[since, until)``, counting the bookings of ``model`` (None: all of them)."""
    points = sorted({since} | {s for s, _, _ in parts if since < s < until})
    out = []
    for t in points:
        on = [b for s, e, b in parts if s <= t < e and (model is None or b.model == model)]
        out.append((t, sum(b.count for b in on), on))
    return out


def _totals(capacity: Mapping[str, int]) -> int:
    return sum(n for m, n in capacity.items() if m != ANY)


# ------------------------------------------------------------------ new bookings


def check_new(b: Booking, existing: Iterable[Booking], limits: BookingLimits, capacity: Mapping[str, int],
              now: float, is_admin: bool) -> None:
    """Raise :class:`BookingError` unless ``b`` may be taken (see :data:`WORDS` for every reason).

    ``capacity``: model slug -> the hub's GPUs of it. Administrators are held to no limit of
    ``limits`` (they set them), only to the hub's GPUs and the calendar.
    """
    if bool(b.user) == bool(b.group):
        raise BookingError("who")
    if b.group and limits.group_admin_only and not is_admin:
        raise BookingError("group_admin")
    if b.user and b.user != b.booked_by and not is_admin:
        raise BookingError("for_other")
    models = {m: n for m, n in capacity.items() if m != ANY and n > 0}
    if b.model != ANY and b.model not in models:
        raise BookingError("model", model=repr(b.model), models=", ".join(sorted(models)) or "none")
    most = _totals(models) if b.model == ANY else models[b.model]
    if not 1 <= b.count <= most:
        raise BookingError("count", count=b.count, most=most, model=b.model if b.model != ANY else "")
    if not (isinstance(b.repeat_weeks, int) and 0 <= b.repeat_weeks <= MAX_REPEAT):
        raise BookingError("repeat", most=MAX_REPEAT, value=b.repeat_weeks)
    if b.start < now - PAST_SLACK:
        raise BookingError("past", start=moment(b.start))
    if b.end <= b.start:
        raise BookingError("order", start=moment(b.start), end=moment(b.end))
    if b.repeat_weeks > 1 and b.end - b.start > WEEK:
        raise BookingError("window", length=_length(b.end - b.start), most=_length(WEEK))
    if not is_admin:
        if b.end - b.start > limits.max_window:
            raise BookingError("window", length=_length(b.end - b.start), most=_length(limits.max_window))
        if b.start - now > limits.max_ahead:
            raise BookingError("ahead", length=_length(b.start - now), most=_length(limits.max_ahead))
    active = [o for o in existing if o.state != "cancelled"]
    if not is_admin:
        _check_hours(b, active, limits.hours_per_week)
    _check_capacity(b, active, models)


def _week(t: float) -> int:
    return math.floor((t - _MONDAY) / WEEK)


def _gpu_hours_by_week(bookings: Iterable[Booking]) -> dict[int, float]:
    hours: dict[int, float] = defaultdict(float)
    for b in bookings:
        for s, e in held_windows(b, -math.inf, math.inf):
            week = _week(s)
            while s < e:
                cut = min(e, _MONDAY + (week + 1) * WEEK)
                hours[week] += (cut - s) / 3600 * b.count
                s, week = cut, week + 1
    return hours


def _check_hours(b: Booking, active: list[Booking], most: float) -> None:
    mine = [o for o in active if (o.user, o.group) == (b.user, b.group)]
    before = _gpu_hours_by_week(mine)
    after = _gpu_hours_by_week([*mine, b])
    for week, total in sorted(after.items()):
        if total > most + 1e-9 and total > before.get(week, 0.0) + 1e-9:
            monday = datetime.fromtimestamp(_MONDAY + week * WEEK, timezone.utc).strftime("%Y-%m-%d")
            raise BookingError("hours", total=round(total, 2), holder=b.holder, week=monday, most=most)


def _check_capacity(b: Booking, active: list[Booking], models: Mapping[str, int]) -> None:
    for s, e in held_windows(b, -math.inf, math.inf):
        parts = _demand(active, s, e)
        pools = [(None, _totals(models))] + ([(b.model, models[b.model])] if b.model != ANY else [])
        for model, total in pools:
            for _, booked, on in _peaks(parts, s, e, model):
                if booked + b.count > total:
                    others = "; ".join(_booking_words(o, s, e) for o in on)
                    raise BookingError("full", free=max(total - booked, 0), total=total,
                                       model=model or "", window=span(s, e), others=others)


def _booking_words(b: Booking, since: float, until: float) -> str:
    w = held_windows(b, since, until) or windows(b, since, until) or [(b.start, b.end)]
    many = b.count != 1
    return WORDS["booked"][1].format(count=b.count, model=b.model if b.model != ANY else "",
                                     gpus="GPUs" if many else "GPU", are="are" if many else "is",
                                     window=span(*w[0]), holder=b.holder, booked_by=b.booked_by)


# ------------------------------------------------------------------ the placement rule


def rule(bookings: Sequence[Booking], model_gpus: Mapping[str, int], user: str, groups: Iterable[str], model: str,
         count: int, now: float, ends_by: float | None, held: Mapping[str, int] | None = None) -> Verdict:
    """May ``user`` (in ``groups``) take ``count`` GPUs of ``model`` now, to keep until ``ends_by`` (None: no end)?

    ``model_gpus``: the hub's GPUs per model. ``held``: GPUs per model that others hold now and
    may keep through any window (neither inside a booking nor told to leave). At every moment
    the holder could keep them, what is booked for others plus ``held`` plus ``count`` must fit
    in the model's GPUs (and all bookings in all GPUs): else ``until`` the first window that
    does not fit, or ``refused`` when that window is on now.
    """
    groups = set(groups)
    held = held or {}
    if not count:
        return Verdict("ok")
    mine_now = [b for b in bookings if b.is_for(user, groups) and b.model in (model, ANY)
                and holding(b, now)]
    if sum(b.count for b in mine_now) >= count:
        return Verdict("ok", booking=mine_now[0])
    others = [b for b in bookings if not b.is_for(user, groups)]
    horizon = ends_by if ends_by is not None else max((b.last_end for b in others), default=now) + 1
    if horizon <= now:
        return Verdict("ok")
    parts = _demand(others, now, horizon)
    pools = [(model, model_gpus.get(model, 0), held.get(model, 0)),
             (None, _totals(model_gpus), sum(n for m, n in held.items() if m != ANY))]
    first: tuple[float, int, int, str | None, list[Booking]] | None = None
    for pool, total, kept in pools:
        for t, booked, on in _peaks(parts, now, horizon, pool):
            if booked and booked + kept + count > total:
                if first is None or t < first[0]:
                    first = (t, total - kept - booked, total, pool, on)
                break
    if first is None:
        return Verdict("ok")
    t, free, total, pool, on = first
    blocker = max(on, key=lambda b: b.count)
    booking = _booking_words(blocker, t, t + 1)
    if t <= now:
        end = max(holding(b, now)[1] for b in on)
        many = total != 1
        return Verdict("refused", booking=blocker, message=WORDS["refused"][1].format(
            booking=booking, free=max(free, 0), total=total, model=pool or "", gpus="GPUs" if many else "GPU",
            are="are" if max(free, 0) != 1 else "is", end=moment(end)))
    return Verdict("until", until=t, booking=blocker,
                   message=WORDS["until"][1].format(booking=booking, at=moment(t)))


def for_job(verdict: Verdict) -> Verdict:
    """The rule's verdict for a notebook job, which cannot be told to leave: ``until`` becomes ``refused``."""
    if verdict.kind != "until":
        return verdict
    b = verdict.booking
    return Verdict("refused", booking=b, message=WORDS["job_until"][1].format(
        booking=_booking_words(b, verdict.until, verdict.until + 1), at=moment(verdict.until),
        end=moment(holding(b, verdict.until)[1])))


def verdicts(bookings: Sequence[Booking], capacity: Mapping[str, int], user: str, groups: Iterable[str],
             patterns: Sequence[str], count: int, now: float, ends_by: float | None,
             held: Mapping[str, int] | None = None, job: bool = False) -> dict[str, Verdict]:
    """Model -> :func:`rule`'s verdict for each model of ``capacity`` that ``patterns`` select (all for
    none or ``any``); a ``job`` is refused where a server would be admitted ``until`` (:func:`for_job`)."""
    out = {}
    for model in capacity:
        if patterns and not any(slug_matches(p, model) for p in patterns):
            continue
        verdict = rule(bookings, capacity, user, groups, model, count, now, ends_by, held)
        out[model] = for_job(verdict) if job else verdict
    return out


def kept(bookings: Iterable[Booking], holders: Iterable[tuple[str, Iterable[str], str]], now: float) -> dict[str, int]:
    """GPUs per model that holders may keep through any window: ``holders`` is one (user, their groups,
    model) per GPU held (leave out the holders told to leave); a GPU held inside its holder's own
    booking on now does not count (the booking counts it)."""
    on = [b for b in bookings if holding(b, now)]
    out: dict[str, int] = {}
    inside: dict[tuple, bool] = {}  # (user, groups, model) -> held inside a booking (asked once)
    for user, groups, model in holders:
        key = (user, frozenset(groups), model)
        if key not in inside:
            inside[key] = any(b.is_for(user, groups) and b.model in (model, ANY) for b in on)
        if not inside[key]:
            out[model] = out.get(model, 0) + 1
    return out


# ------------------------------------------------------------------ records


def as_record(b: Booking) -> dict:
    """The booking's fields as a plain dict (the store's row, the REST answer's base)."""
    return {f: getattr(b, f) for f in _FIELDS}


_FIELDS = tuple(f.name for f in fields(Booking))
