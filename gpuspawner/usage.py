"""GPU usage accounting: one row per allocation, in the hub's own database.

Every holder of GPUs goes through the hub's :class:`~gpuspawner.ledger.Ledger`
(servers, notebook jobs, allocations adopted after a restart), and the
:class:`UsageRecorder` of the hub's :class:`~gpuspawner.state.HubState`
observes it: a hold opens a row, a release closes it with the reason it was
told (``stopped`` by default). Each event is recorded with its own time, also
when it happens before the recorder is attached to the hub's database (the
hub attaches it as soon as it is up, see :mod:`gpuspawner.hub.setup`; events
before that wait, with their times, and are written then). Rows live in the table
``gpuspawner_allocations`` of JupyterHub's own database, written through the
hub's SQLAlchemy session (so SQLite never sees two writers of one process),
with a declarative base of their own: JupyterHub's schema is not touched.

End reasons (:data:`END_REASONS`):

- ``stopped``: the server was stopped by its user, an admin or the API;
- ``culled``: stopped by the GPU idle culler, which tells the hub before it stops
  the server (``POST /hub/api/gpus/usage/report``);
- ``failed``: a server's start failed, or it exited on its own while the hub ran;
  a notebook job that failed (its notebook raised, its process exited non-zero,
  its backend ended it, or it could not be started);
- ``crashed``: the hub found, when it came back, that the server (or job) was gone
  (its end is then its last utilisation sample, or the time the hub found out);
  a job whose outcome the hub learns afterwards gets that outcome instead;
- ``completed``: a notebook job that ran to its end;
- ``cancelled``: a notebook job cancelled by its user, an admin or the API;
- ``timed_out``: a notebook job stopped at its time limit (the hub's or its backend's);
- ``booking``: a server stopped when a booking of its GPUs began;
- ``budget``: a server stopped, or a notebook job cancelled, when its user's GPU budget was spent
  (``gpu_budget_at_zero = "stop"``; :mod:`gpuspawner.hub.budget_notices`).

A job's row has the owner ``user/job/<id>``, where ``<id>`` is the job's id in
the job API (and in JupyterLab's job list, which uses the same id).

Busy and idle: the culler reports each round the samples it read from the
server's monitor (time, highest utilisation of the server's GPUs). The time
between two consecutive samples counts as *busy* when the later one is at or
above the culler's threshold, *idle* when below (the culler's own rule), and
as neither when it is unknown or longer than :data:`MAX_GAP` seconds.

Schema versions: :func:`migrate` brings the tables to :data:`SCHEMA_VERSION`
one step at a time and records the version in ``gpuspawner_schema``; it runs
at every hub start and does nothing when the tables are current. Its DDL is
plain SQLAlchemy Core, valid on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Column, Float, Index, Integer, Text, Unicode, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from .db import Base
from .owner import Owner

__all__ = ["Allocation", "Share", "UsageRecorder", "shares", "migrate", "END_REASONS", "END_REASON_WORDS",
           "SCHEMA_VERSION"]

log = logging.getLogger("gpuspawner.usage")

SCHEMA_VERSION = 1
#: why an allocation ended: servers' reasons, then notebook jobs' (a job's final state)
END_REASONS = ("stopped", "culled", "failed", "crashed", "completed", "cancelled", "timed_out", "booking",
               "budget")
#: how the usage page says each end reason (None: still held): (words, what it means)
END_REASON_WORDS: dict[str | None, tuple[str, str]] = {
    None: ("Running", "still holds its GPUs"),
    "stopped": ("Stopped", "stopped by its user, an administrator or the REST API"),
    "culled": ("Stopped: GPUs idle", "stopped by the GPU idle culler because its GPUs stayed idle"),
    "failed": ("Failed", "its start failed or it exited on its own; for a job, its notebook or its process failed"),
    "crashed": ("Lost", "the hub found it gone when it came back after a crash or restart"),
    "completed": ("Completed", "the job ran to its end"),
    "cancelled": ("Cancelled", "the job was cancelled by its user, an administrator or the REST API"),
    "timed_out": ("Timed out", "the job was stopped at its time limit"),
    "booking": ("Stopped: GPUs booked", "stopped when a booking of its GPUs began (it was told so at its start, "
                                        "and warned before)"),
    "budget": ("Stopped: budget spent", "stopped when its user's GPU budget was spent (warned before)"),
}
#: Longest gap (seconds) between two utilisation samples that still counts as busy or idle.
MAX_GAP = 300.0
#: Seconds a reason told before a stop (the culler's) stays valid for that owner's release.
REASON_TTL = 600.0

class Allocation(Base):
    """One allocation: an owner holding GPUs from ``started`` to ``ended``."""

    __tablename__ = "gpuspawner_allocations"
    id = Column(Integer, primary_key=True, autoincrement=True)
    owner = Column(Unicode(255), nullable=False)  # ledger key: user/server-name or user/job/<id>
    user = Column(Unicode(255), nullable=False)
    kind = Column(Unicode(16), nullable=False)  # server or job
    groups = Column(Text, nullable=False, default="[]")  # JSON list of JupyterHub group names
    gpu_count = Column(Integer, nullable=False)
    model = Column(Unicode(255), nullable=False, default="")  # slug (a cluster resource for gpu-kube)
    host = Column(Unicode(255), nullable=False, default="")
    gpus = Column(Text, nullable=False, default="[]")  # JSON [{uuid, name, model, host, index}]
    started = Column(Float, nullable=False)  # seconds since the epoch
    ended = Column(Float, nullable=True)  # None while held
    end_reason = Column(Unicode(16), nullable=True)
    busy_seconds = Column(Float, nullable=False, default=0.0)
    idle_seconds = Column(Float, nullable=False, default=0.0)
    last_sample = Column(Float, nullable=True)  # time of the newest utilisation sample counted

    __table_args__ = (
        Index("ix_gpuspawner_allocations_period", "started", "ended"),
        Index("ix_gpuspawner_allocations_owner", "owner", "ended"),
    )

    def as_dict(self) -> dict:
        return {
            "id": self.id, "owner": self.owner, "user": self.user, "kind": self.kind,
            "groups": json.loads(self.groups or "[]"), "gpu_count": self.gpu_count, "model": self.model,
            "host": self.host, "gpus": json.loads(self.gpus or "[]"), "started": self.started,
            "ended": self.ended, "end_reason": self.end_reason, "busy_seconds": self.busy_seconds,
            "idle_seconds": self.idle_seconds,
        }


@dataclass
class Share:
    """One allocation's part of a period, in GPU-seconds."""

    row: Allocation
    held: float
    busy: float
    idle: float

    @property
    def unsampled(self) -> float:
        return max(0.0, self.held - self.busy - self.idle)


def shares(rows: list[Allocation], since: float, until: float, now: float) -> list[Share]:
    """Each allocation's GPU-seconds inside [since, until): the one rule usage reports and budgets count by.

    An allocation counts for the part of it inside the period: GPU count x overlap. Its busy
    and idle time are spread evenly over its duration (the records keep totals per
    allocation), so a period that covers a third of an allocation gets a third of its busy
    and idle time. An allocation still held counts up to ``now``.
    """
    out = []
    for row in rows:
        end = row.ended if row.ended is not None else now
        overlap = min(end, until) - max(row.started, since)
        if overlap <= 0:
            continue
        duration = end - row.started
        fraction = overlap / duration if duration > 0 else 0.0
        count = row.gpu_count
        out.append(Share(row, overlap * count, row.busy_seconds * count * fraction,
                         row.idle_seconds * count * fraction))
    return out


class SchemaVersion(Base):
    """The version of gpuspawner's tables in this database (one row, ``name = "usage"``)."""

    __tablename__ = "gpuspawner_schema"
    name = Column(Unicode(64), primary_key=True)
    version = Column(Integer, nullable=False)


def _v1(conn: Connection) -> None:
    Allocation.__table__.create(conn, checkfirst=True)


#: version -> the step that brings version - 1 to it
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _v1}


def migrate(conn: Connection) -> int:
    """Bring gpuspawner's tables to :data:`SCHEMA_VERSION` (idempotent); return the version found."""
    SchemaVersion.__table__.create(conn, checkfirst=True)
    table = SchemaVersion.__table__
    found = conn.execute(select(table.c.version).where(table.c.name == "usage")).scalar()
    current = found or 0
    if current > SCHEMA_VERSION:
        raise RuntimeError(f"the hub database's usage tables are version {current}, newer than this "
                           f"gpuspawner's {SCHEMA_VERSION}; upgrade gpuspawner")
    for version in range(current + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[version](conn)
        log.info("usage tables migrated to version %d", version)
    if found is None:
        conn.execute(table.insert().values(name="usage", version=SCHEMA_VERSION))
    elif current != SCHEMA_VERSION:
        conn.execute(table.update().where(table.c.name == "usage").values(version=SCHEMA_VERSION))
    return current


@dataclass
class _Reason:
    reason: str
    at: float


@dataclass(frozen=True)
class _Waiting:
    """An event from before :meth:`UsageRecorder.attach`: a ledger event, or a reason told."""

    event: str  # "hold" | "release" | "reason"
    owner: str
    at: float  # when it happened
    uuids: tuple[str, ...] = ()
    since: float = 0.0
    reason: str = ""


GPUInfo = Callable[[str], dict]  # uuid -> {uuid, name, model, host, index}
Groups = Callable[[Session, str], list[str]]  # (session, user) -> group names


def _hub_groups(session: Session, user: str) -> list[str]:
    from jupyterhub import orm

    found = session.query(orm.User).filter_by(name=user).one_or_none()
    return sorted(g.name for g in found.groups) if found is not None else []


class UsageRecorder:
    """Keeps ``gpuspawner_allocations`` in step with the ledger (see the module docstring)."""

    def __init__(self, gpu_info: GPUInfo, clock: Callable[[], float] = time.time,
                 groups: Groups = _hub_groups) -> None:
        self._gpu_info = gpu_info
        self._clock = clock
        self._groups = groups
        self.session: Session | None = None
        self._waiting: list[_Waiting] = []  # events before attach(), in order
        self._open: dict[str, int] = {}  # owner -> id of its open row
        self._reasons: dict[str, _Reason] = {}
        self._reconciling = 0
        self._gone: dict[str, float] = {}  # owner -> when a reconciliation released it
        self._from_before: set[str] = set()  # owners of rows left open by a previous hub process
        self._found_gone: dict[str, int] = {}  # owner -> its row a reconciliation closed as crashed
        #: (user, "busy" | "idle") -> GPU-seconds counted by this hub process (Prometheus)
        self.gpu_seconds: dict[tuple[str, str], float] = defaultdict(float)

    # ------------------------------------------------------------ database

    def attach(self, session: Session) -> None:
        """Use the hub's session from now on: migrate, load the open rows, record what waited."""
        if self.session is not None:
            return
        migrate(session.connection())  # the hub's own connection: no second writer on SQLite
        session.commit()
        self.session = session
        for row in session.execute(select(Allocation).where(Allocation.ended.is_(None))).scalars():
            if row.owner in self._open:  # two open rows for one owner: keep the newest
                self._close_row(session.get(Allocation, self._open[row.owner]), row.started, "crashed")
            self._open[row.owner] = row.id
            self._from_before.add(row.owner)
        session.commit()
        waiting, self._waiting = self._waiting, []
        for w in waiting:
            if w.event == "reason":
                self._reasons[w.owner] = _Reason(w.reason, w.at)
            else:
                self._record(w.event, w.owner, w.uuids, w.since, w.at)

    # ------------------------------------------------------------ the ledger's events

    def observe(self, event: str, owner: str, uuids: tuple[str, ...], since: float) -> None:
        """The ledger's observer (see :data:`gpuspawner.ledger.Observer`)."""
        at = self._clock()
        if self.session is None:  # written with its own time once the hub's database is attached
            self._waiting.append(_Waiting(event, owner, at, uuids, since))
            return
        self._record(event, owner, uuids, since, at)

    def _record(self, event: str, owner: str, uuids: tuple[str, ...], since: float, at: float) -> None:
        try:
            if event == "hold":
                self._hold(owner, uuids, since)
            else:
                self._release(owner, at)
        except Exception:  # accounting must never break a spawn or a stop
            log.exception("usage: could not record %s of %s", event, owner)
            self.session.rollback()

    def _hold(self, owner: str, uuids: tuple[str, ...], since: float) -> None:
        session = self.session
        self._gone.pop(owner, None)
        self._found_gone.pop(owner, None)
        gpus = [self._gpu_info(u) for u in uuids]
        row = session.get(Allocation, self._open[owner]) if owner in self._open else None
        if row is not None:  # adopted after a restart, or more GPUs for the same holding
            if row.gpu_count != len(gpus):
                row.gpus, row.gpu_count = json.dumps(gpus), len(gpus)
                session.commit()
            return
        told = self._reasons.get(owner)
        if told is not None and told.at < since:  # a reason told for an earlier holding
            del self._reasons[owner]
        user, kind = (parsed := Owner.parse(owner)).user, parsed.kind
        row = Allocation(
            owner=owner, user=user, kind=kind, groups=json.dumps(self._groups(session, user)),
            gpu_count=len(gpus), model=gpus[0]["model"] if gpus else "", host=gpus[0]["host"] if gpus else "",
            gpus=json.dumps(gpus), started=since, busy_seconds=0.0, idle_seconds=0.0,
        )
        session.add(row)
        session.commit()
        self._open[owner] = row.id

    def _release(self, owner: str, at: float) -> None:
        if self._reconciling:
            self._gone[owner] = at  # crashed, unless the reconciliation adopts it again
            return
        told = self._reasons.pop(owner, None)
        reason = told.reason if told and at - told.at <= REASON_TTL else "stopped"
        self._close(owner, at, reason)

    def _close(self, owner: str, at: float, reason: str) -> None:
        row_id = self._open.pop(owner, None)
        self._from_before.discard(owner)
        if row_id is None:
            return
        row = self.session.get(Allocation, row_id)
        if reason == "crashed" and row.last_sample is not None:
            at = row.last_sample
        self._close_row(row, at, reason)
        self.session.commit()

    @staticmethod
    def _close_row(row: Allocation | None, at: float, reason: str) -> None:
        if row is not None:
            row.ended, row.end_reason = max(at, row.started), reason

    # ------------------------------------------------------------ reasons and reconciliation

    def end_reason(self, owner: str, reason: str, replaces_crashed: bool = False) -> bool:
        """Say why ``owner``'s holding is about to end; False when it holds nothing recorded.

        Before the recorder is attached, a holding that waits to be written counts.
        ``replaces_crashed``: the caller knows how it really ended (a notebook job's
        outcome, read after a restart), so when a reconciliation closed ``owner``'s row
        as ``crashed`` (gone while the hub was down), ``reason`` replaces ``crashed``;
        its end time stays.
        """
        if reason not in END_REASONS:
            raise ValueError(f"end reason must be one of {', '.join(END_REASONS)}, not {reason!r}")
        if self.session is None:  # told in order with the ledger's events that wait for attach()
            if not self._waits_holding(owner):
                return False
            self._waiting.append(_Waiting("reason", owner, self._clock(), reason=reason))
            return True
        if owner not in self._open:
            return replaces_crashed and self._correct_crashed(owner, reason)
        self._reasons[owner] = _Reason(reason, self._clock())
        return True

    def _waits_holding(self, owner: str) -> bool:
        """Whether ``owner``'s last ledger event waiting for attach() is a hold."""
        last = next((w.event for w in reversed(self._waiting) if w.owner == owner and w.event != "reason"), None)
        return last == "hold"

    def _correct_crashed(self, owner: str, reason: str) -> bool:
        row_id = self._found_gone.pop(owner, None)
        row = self.session.get(Allocation, row_id) if row_id is not None else None
        if row is None or row.end_reason != "crashed":
            return False
        row.end_reason = reason
        self.session.commit()
        return True

    @contextmanager
    def reconciling(self, held: Callable[[], dict[str, tuple[str, ...]]], reason: str = "crashed") -> Iterator[None]:
        """While the hub rebuilds its ledger from the runtime: releases followed by an adoption
        of the same owner keep its row; what stays released, and the rows a previous hub
        process left open whose owner holds nothing afterwards, end as ``reason``: ``crashed``
        at hub start, ``failed`` for a workload found gone while the hub ran."""
        self._reconciling += 1
        try:
            yield
        finally:
            self._reconciling -= 1
            if not self._reconciling and self.session is not None:
                holding = held()
                for owner in list(self._from_before):
                    if owner not in holding and owner not in self._gone:
                        self._gone[owner] = self._clock()
                gone, self._gone = self._gone, {}
                for owner, at in gone.items():
                    if owner not in holding:
                        row_id = self._open.get(owner)
                        self._close(owner, at, reason)
                        if row_id is not None:
                            self._found_gone[owner] = row_id
                self._from_before.clear()

    # ------------------------------------------------------------ utilisation

    def sample(self, owner: str, samples: list[tuple[float, float | None]], threshold: float) -> bool:
        """Count (time, highest utilisation %) samples of ``owner``'s GPUs as busy or idle time.

        Samples already counted (not newer than the last one) are skipped, so
        overlapping reports count once. False when ``owner`` holds nothing recorded.
        """
        if self.session is None or owner not in self._open:
            return False
        row = self.session.get(Allocation, self._open[owner])
        last = row.last_sample
        busy = idle = 0.0
        for at, utilization in sorted(samples, key=lambda s: s[0]):
            if at < row.started or (last is not None and at <= last):
                continue
            if last is not None and utilization is not None and at - last <= MAX_GAP:
                if utilization >= threshold:
                    busy += at - last
                else:
                    idle += at - last
            last = at
        if last != row.last_sample:
            row.busy_seconds += busy
            row.idle_seconds += idle
            row.last_sample = last
            self.session.commit()
            self.gpu_seconds[(row.user, "busy")] += busy * row.gpu_count
            self.gpu_seconds[(row.user, "idle")] += idle * row.gpu_count
        return True
