"""GPU usage reports: ``/hub/api/gpus/usage`` (JSON, CSV) and the culler's
``POST /hub/api/gpus/usage/report`` (the page, ``/hub/gpus/usage``, is in :mod:`.usage_page`).

Reading follows the overview's rule (:meth:`~.handlers._Overview.viewer`): readers of
everyone's GPUs (``custom:gpus:read``, or ``admin-ui`` which admins hold) read everyone's
usage, or one user's with ``user=``; any other user reads their own only (naming someone
else in ``user=`` is a 403, whoever it names). Reporting needs ``custom:gpus:report``
(the culler's role has it) or ``admin:servers``. The rows come from :mod:`gpuspawner.usage`.

An allocation counts in a period for the part of it inside the period
(:func:`gpuspawner.usage.shares`, the one rule, which budgets count by too).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from jupyterhub.apihandlers import APIHandler
from sqlalchemy import or_, select
from tornado import web

from ..inputs import OptionsError, check_json, dumps, field_name, read_json, shown
from ..owner import Owner, OwnerError
from ..state import hub_state_of_app
from ..usage import END_REASONS, Allocation, Share, shares
from ..waits import wait_history
from .handlers import _Overview

REPORT_SCOPE = "custom:gpus:report"
REPORT_ADMIN_SCOPE = "admin:servers"
GROUPINGS = ("user", "group", "model", "server", "allocation")  # server: each server or job (its owner)
DEFAULT_PERIOD = 7 * 24 * 3600.0
NO_GROUP = "(no group)"
TOP_IDLE = 10
#: columns of the grouped CSV (and keys of each JSON row), in order
SUMMARY_FIELDS = ("key", "gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "unsampled_gpu_hours", "allocations")
#: columns of ``by=allocation`` CSV (and keys of each JSON row), in order
ALLOCATION_FIELDS = ("id", "owner", "user", "kind", "job_id", "groups", "model", "host", "gpu_count", "uuids",
                     "started", "ended", "end_reason", "gpu_hours", "busy_gpu_hours", "idle_gpu_hours",
                     "unsampled_gpu_hours")


class BadParameter(ValueError):
    """A query parameter that cannot be used; its text is the 400's message."""


def parse_time(text: str, name: str) -> float:
    """Seconds since the epoch from ``text``: a number (epoch seconds) or ISO 8601 (UTC unless it says)."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise BadParameter(
                f"{name}={shown(text)} is not a time: use ISO 8601 (2026-11-01 or 2026-11-01T08:00:00Z) "
                "or seconds since the epoch") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        try:
            return parsed.timestamp()
        except (OverflowError, ValueError):
            raise BadParameter(f"{name}={shown(text)} is not a time this hub can count from") from None
    try:
        if not math.isfinite(value):
            raise ValueError
        datetime.fromtimestamp(value, timezone.utc)  # the answers name it as a date: it must be one
    except (OverflowError, OSError, ValueError):
        raise BadParameter(f"{name}={shown(text)} is not a time: seconds since the epoch, "
                           "from 0 to year 9999") from None
    return value


def iso(epoch: float | None, timespec: str = "seconds") -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


def _keys(row: Allocation, by: str) -> list[str]:
    if by == "user":
        return [row.user]
    if by == "model":
        return [row.model or "unknown"]
    if by == "server":
        return [row.owner]
    return json.loads(row.groups or "[]") or [NO_GROUP]  # a member of several groups counts in each


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 4)


def summarise(parts: list[Share], by: str) -> list[dict]:
    """Rows of :data:`SUMMARY_FIELDS`, the most GPU-hours first."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0])
    for part in parts:
        for key in _keys(part.row, by):
            t = totals[key]
            t[0] += part.held
            t[1] += part.busy
            t[2] += part.idle
            t[3] += part.unsampled
            t[4] += 1
    rows = [{"key": key, "gpu_hours": _hours(t[0]), "busy_gpu_hours": _hours(t[1]), "idle_gpu_hours": _hours(t[2]),
             "unsampled_gpu_hours": _hours(t[3]), "allocations": int(t[4])} for key, t in totals.items()]
    return sorted(rows, key=lambda r: (-r["gpu_hours"], r["key"]))


def allocation_rows(parts: list[Share]) -> list[dict]:
    """Rows of :data:`ALLOCATION_FIELDS`, oldest first."""
    out = []
    for part in sorted(parts, key=lambda p: (p.row.started, p.row.id)):
        row = part.row
        out.append({
            "id": row.id, "owner": row.owner, "user": row.user, "kind": row.kind, "job_id": Owner.parse(row.owner).job,
            "groups": json.loads(row.groups or "[]"), "model": row.model, "host": row.host,
            "gpu_count": row.gpu_count, "uuids": [g["uuid"] for g in json.loads(row.gpus or "[]")],
            "started": iso(row.started, "milliseconds"), "ended": iso(row.ended, "milliseconds"),
            "end_reason": row.end_reason,
            "gpu_hours": _hours(part.held), "busy_gpu_hours": _hours(part.busy), "idle_gpu_hours": _hours(part.idle),
            "unsampled_gpu_hours": _hours(part.unsampled),
        })
    return out


def top_idle(parts: list[Share], limit: int = TOP_IDLE) -> list[dict]:
    """The owners (servers and jobs) with the most idle GPU-hours in the period."""
    idle: dict[str, list] = {}
    for part in parts:
        entry = idle.setdefault(part.row.owner, [part.row.user, part.row.kind, 0.0, 0.0])
        entry[2] += part.idle
        entry[3] += part.held
    ranked = sorted(((o, e) for o, e in idle.items() if e[2] > 0), key=lambda item: (-item[1][2], item[0]))
    return [{"owner": o, "user": e[0], "kind": e[1], "idle_gpu_hours": _hours(e[2]), "gpu_hours": _hours(e[3])}
            for o, e in ranked[:limit]]


class _Usage(_Overview):
    """Shared by the usage page and API handler."""

    def whose(self) -> str | None:
        """The user whose usage this request reads (``user=``, or the viewer's own); None: everyone's."""
        viewer = self.viewer()
        asked = self.get_argument("user", "")
        if viewer is not None:
            if asked and asked != viewer:
                raise web.HTTPError(403, "You can see your own GPU usage only: leave user= out.")
            return viewer
        if len(asked) > 255:
            raise BadParameter(f"user={shown(asked, 40)}: a user name has at most 255 characters")
        return asked or None

    def period(self) -> tuple[float, float]:
        now = time.time()
        until_text = self.get_argument("until", "")
        until = parse_time(until_text, "until") if until_text else now
        since_text = self.get_argument("since", "")
        since = parse_time(since_text, "since") if since_text else until - DEFAULT_PERIOD
        if since >= until:
            raise BadParameter(f"since ({iso(since)}) must be before until ({iso(until)})")
        return since, until

    def parts(self, user: str | None) -> tuple[float, float, list[Share]]:
        """The period asked for and each allocation's part of it (only ``user``'s, unless None)."""
        since, until = self.period()
        self.hub_state.usage.attach(self.db)
        query = select(Allocation).where(Allocation.started < until,
                                         or_(Allocation.ended.is_(None), Allocation.ended >= since))
        if user is not None:
            query = query.where(Allocation.user == user)
        return since, until, shares(list(self.db.execute(query).scalars()), since, until, time.time())


def check_grouping(by: str) -> str:
    if by not in GROUPINGS:
        raise BadParameter(f"by={shown(by, 40)}: use one of {', '.join(GROUPINGS)}")
    return by


def answer(since: float, until: float, by: str, parts: list[Share], user: str | None) -> dict:
    """The usage answer (JSON) for a period: ``rows`` grouped ``by``, totals, top idle holders."""
    total = summarise(parts, "user")
    return {
        "since": iso(since), "until": iso(until), "by": by, "user": user,
        "rows": allocation_rows(parts) if by == "allocation" else summarise(parts, by),
        "total": {k: round(sum(r[k] for r in total), 4) for k in SUMMARY_FIELDS[1:]},
        "top_idle": top_idle(parts),
    }


def to_csv(data: dict) -> str:
    """The ``rows`` of a usage answer as CSV (lists joined with ``;``)."""
    fields = ALLOCATION_FIELDS if data["by"] == "allocation" else SUMMARY_FIELDS
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\r\n")
    writer.writeheader()
    for row in data["rows"]:
        writer.writerow({k: ";".join(v) if isinstance(v, list) else ("" if v is None else v) for k, v in row.items()})
    return out.getvalue()


class UsageAPIHandler(_Usage, APIHandler):
    """``GET /hub/api/gpus/usage?since=&until=&by=&format=``."""

    async def get(self) -> None:
        fmt = self.get_argument("format", "json")
        try:
            user = self.whose()
            if fmt not in ("json", "csv"):
                raise BadParameter(f"format={shown(fmt, 40)}: use json or csv")
            by = check_grouping(self.get_argument("by", "user"))
            since, until, parts = self.parts(user)
            data = answer(since, until, by, parts, user)
        except BadParameter as e:
            raise web.HTTPError(400, "%s", str(e)) from e
        self.set_header("Cache-Control", "no-store")
        if fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            name = f"gpu-usage-{data['by']}-{data['since'][:10]}-{data['until'][:10]}.csv"
            self.set_header("Content-Disposition", f'attachment; filename="{name}"')
            self.finish(to_csv(data))
        else:
            self.finish(dumps(data))


#: keys of a usage report
REPORT_KEYS = ("owner", "threshold", "samples", "end_reason")
#: the most samples one report may carry (the culler sends a few per server and period)
MAX_SAMPLES = 10_000
#: seconds a sample's time may lie ahead of the hub's clock (the culler's clock may differ a little)
CLOCK_SLACK = 300.0


@dataclass(frozen=True)
class Report:
    """A checked usage report: ``owner``'s utilisation samples (time, highest %) and why it ends, if it does."""

    owner: str
    threshold: float
    samples: list[tuple[float, float | None]]
    end_reason: str | None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_report(body: object, now: float) -> Report:
    """Check a ``POST /hub/api/gpus/usage/report`` body; :class:`OptionsError` names the bad field.

    ``{"owner": "user/server", "threshold": 5, "samples": [[time, utilisation or null], ...],
    "end_reason": ...}``: times are seconds since the epoch, not ahead of ``now`` (by more
    than :data:`CLOCK_SLACK`); utilisation and threshold are percentages, 0 to 100.
    """
    if not isinstance(body, Mapping):
        raise OptionsError("body", 'must be a JSON object {"owner": "user/server", "threshold": 5, '
                                   '"samples": [[time, utilisation or null], ...], "end_reason": ...}')
    check_json(body)
    unknown = [k for k in body if k not in REPORT_KEYS]
    if unknown:
        raise OptionsError(field_name(unknown[0]), f"unknown key; allowed: {', '.join(REPORT_KEYS)}")
    owner = body.get("owner")
    try:
        Owner.parse(owner)
    except OwnerError:
        owner = None
    if owner is None or len(owner) > 512:
        raise OptionsError("owner", "must name the server or job reported on: 'user/server' or 'user/job/ID'")
    threshold = body.get("threshold", 5.0)
    if not _number(threshold) or not 0 <= threshold <= 100:
        raise OptionsError("threshold", "must be a utilisation in percent, 0 to 100")
    given = body.get("samples")
    given = [] if given is None else given
    if not isinstance(given, list) or len(given) > MAX_SAMPLES:
        raise OptionsError("samples", f"must be a list of at most {MAX_SAMPLES} [time, utilisation or null] pairs")
    samples = []
    for n, sample in enumerate(given):
        if not isinstance(sample, list) or len(sample) != 2:
            raise OptionsError(f"samples[{n}]", "must be a pair [time, utilisation or null]")
        at, utilisation = sample
        if not _number(at) or not 0 < at <= now + CLOCK_SLACK:
            raise OptionsError(f"samples[{n}]", f"time {shown(at)} must be seconds since the epoch, not in the future")
        if utilisation is not None and (not _number(utilisation) or not 0 <= utilisation <= 100):
            raise OptionsError(f"samples[{n}]", f"utilisation {shown(utilisation)} must be a percentage "
                                                "(0 to 100) or null")
        samples.append((float(at), None if utilisation is None else float(utilisation)))
    reason = body.get("end_reason")
    if reason is not None and (not isinstance(reason, str) or reason not in END_REASONS):
        raise OptionsError("end_reason", f"must be one of {', '.join(END_REASONS)}, or null")
    return Report(owner, float(threshold), samples, reason)


class UsageReportHandler(_Overview, APIHandler):
    """``POST /hub/api/gpus/usage/report``: utilisation samples and end reasons (the culler's)."""

    async def post(self) -> None:
        if not self.current_user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if REPORT_SCOPE not in self.expanded_scopes and REPORT_ADMIN_SCOPE not in self.expanded_scopes:
            raise web.HTTPError(403, f"Reporting GPU usage needs the scope {REPORT_SCOPE} (or {REPORT_ADMIN_SCOPE}).")
        try:
            body = read_json(self.request.body)
            report = parse_report({} if body is None else body, time.time())
        except OptionsError as e:
            raise web.HTTPError(400, "%s", str(e)) from None
        usage = self.hub_state.usage
        usage.attach(self.db)
        known = usage.sample(report.owner, report.samples, report.threshold)
        wait_history(self.hub_state).samples(report.owner, report.samples, report.threshold)  # idle: wait estimates
        if report.end_reason is not None:
            known = usage.end_reason(report.owner, report.end_reason) and known
        self.finish(dumps({"owner": report.owner, "recorded": known}))


def attach_recorder(settings: dict) -> None:
    """Record usage in the hub's database from now on (``settings``: the hub's tornado settings).

    The recorder writes through the hub's own session (``settings["db"]``, the one
    JupyterHub's handlers use): one writer per process on SQLite.
    """
    hub_state_of_app(settings).usage.attach(settings["db"])


def handlers() -> list[tuple[str, type]]:
    return [(r"/api/gpus/usage", UsageAPIHandler), (r"/api/gpus/usage/report", UsageReportHandler)]
