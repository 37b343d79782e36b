"""GPU usage accounting: one row per allocation, in the hub's own database.

Every holder of GPUs goes through the hub's :class:`~gpuspawner.ledger.Ledger`
(servers, notebook jobs, allocations adopted after a restart), and the
:class:`UsageRecorder` of the hub's :class:`~gpuspawner.state.HubState`
observes it: a hold opens a row, a release closes it with the reason it was
told (``stopped`` by default). Rows live in the table
``gpuspawner_allocations`` of JupyterHub's own database, written through the
hub's SQLAlchemy session (so SQLite never sees two writers of one process),
with a declarative base of their own: JupyterHub's schema is not touched.

End reasons:

- ``stopped``: the server (or job) was stopped by its user, an admin or the API;
- ``culled``: stopped by the GPU idle culler, which tells the hub before it stops
  the server (``POST /hub/api/gpus/usage/report``);
- ``failed``: its start failed, or it exited on its own while the hub ran;
- ``crashed``: the hub found, when it came back, that the server was gone
  (its end is then its last utilisation sample, or the time the hub found out).

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

__all__ = ["Allocation", "UsageRecorder", "migrate", "owner_kind", "END_REASONS", "SCHEMA_VERSION"]

log = logging.getLogger("gpuspawner.usage")

SCHEMA_VERSION = 1
END_REASONS = ("stopped", "culled", "failed", "crashed")
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


def owner_kind(owner: str) -> str:
    """``job`` for ``user/job/<id>``, else ``server``."""
    return "job" if owner.split("/", 1)[-1].startswith("job/") else "server"


@dataclass
class _Reason:
    reason: str
    at: float


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
        self._waiting: list[tuple[str, str, tuple[str, ...], float]] = []  # events before attach()
        self._open: dict[str, int] = {}  # owner -> id of its open row
        self._reasons: dict[str, _Reason] = {}
        self._reconciling = 0
        self._gone: dict[str, float] = {}  # owner -> when a reconciliation released it
        self._from_before: set[str] = set()  # owners of rows left open by a previous hub process
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
        for event in waiting:
            self.observe(*event)

    # ------------------------------------------------------------ the ledger's events

    def observe(self, event: str, owner: str, uuids: tuple[str, ...], since: float) -> None:
        """The ledger's observer (see :data:`gpuspawner.ledger.Observer`)."""
        if self.session is None:
            self._waiting.append((event, owner, uuids, since))
            return
        try:
            if event == "hold":
                self._hold(owner, uuids, since)
            else:
                self._release(owner)
        except Exception:  # accounting must never break a spawn or a stop
            log.exception("usage: could not record %s of %s", event, owner)
            self.session.rollback()

    def _hold(self, owner: str, uuids: tuple[str, ...], since: float) -> None:
        session = self.session
        self._gone.pop(owner, None)
        gpus = [self._gpu_info(u) for u in uuids]
        row = session.get(Allocation, self._open[owner]) if owner in self._open else None
        if row is not None:  # adopted after a restart, or more GPUs for the same holding
            if row.gpu_count != len(gpus):
                row.gpus, row.gpu_count = json.dumps(gpus), len(gpus)
                session.commit()
            return
        self._reasons.pop(owner, None)  # a reason told for an earlier holding
        user = owner.split("/", 1)[0]
        row = Allocation(
            owner=owner, user=user, kind=owner_kind(owner), groups=json.dumps(self._groups(session, user)),
            gpu_count=len(gpus), model=gpus[0]["model"] if gpus else "", host=gpus[0]["host"] if gpus else "",
            gpus=json.dumps(gpus), started=since, busy_seconds=0.0, idle_seconds=0.0,
        )
        session.add(row)
        session.commit()
        self._open[owner] = row.id

    def _release(self, owner: str) -> None:
        if self._reconciling:
            self._gone[owner] = self._clock()  # crashed, unless the reconciliation adopts it again
            return
        told = self._reasons.pop(owner, None)
        now = self._clock()
        reason = told.reason if told and now - told.at <= REASON_TTL else "stopped"
        self._close(owner, now, reason)

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

    def end_reason(self, owner: str, reason: str) -> bool:
        """Say why ``owner``'s holding is about to end; False when it holds nothing recorded."""
        if reason not in END_REASONS:
            raise ValueError(f"end reason must be one of {', '.join(END_REASONS)}, not {reason!r}")
        if owner not in self._open:
            return False
        self._reasons[owner] = _Reason(reason, self._clock())
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
                        self._close(owner, at, reason)
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
