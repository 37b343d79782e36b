"""The hub's job records, in the hub's own database (JupyterHub's SQLAlchemy engine).

One table, ``gpuspawner_jobs``, created at hub start if missing (plain
``CREATE TABLE``; SQLite and PostgreSQL alike). A record is written *before*
anything runs and again at every change of state, so a hub that restarts finds
every job it had: queued ones (their request), running ones (where they run)
and finished ones (their outcome).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Column, Float, Integer, String, Text, create_engine, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from ..db import Base

#: job states; the first three are "active" (the job holds or waits for GPUs)
ACTIVE = ("queued", "starting", "running")
FINISHED = ("completed", "failed", "cancelled", "timed_out")
STATES = ACTIVE + FINISHED


class JobRow(Base):
    __tablename__ = "gpuspawner_jobs"

    id = Column(String(32), primary_key=True)
    user = Column(String(255), nullable=False, index=True)
    name = Column(String(256), nullable=False)
    state = Column(String(16), nullable=False, index=True)
    reason = Column(Text, nullable=False, default="")
    spec = Column(Text, nullable=False)  # JobSpec.to_dict() as JSON
    gpus = Column(Text, nullable=False, default="[]")  # GPU.to_dict() records
    handle = Column(Text, nullable=False, default="{}")  # where it runs: {"pid": N} / {"container": ID} ...
    created = Column(Float, nullable=False)
    started = Column(Float)
    ended = Column(Float)
    exit_code = Column(Integer)


@dataclass(frozen=True)
class JobRecord:
    id: str
    user: str
    name: str
    state: str
    spec: dict
    created: float
    reason: str = ""
    gpus: tuple[dict, ...] = ()
    handle: dict = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def changed(self, **values: Any) -> JobRecord:
        return replace(self, **values)


def _record(row: JobRow) -> JobRecord:
    return JobRecord(
        id=row.id, user=row.user, name=row.name, state=row.state, spec=json.loads(row.spec),
        created=row.created, reason=row.reason or "", gpus=tuple(json.loads(row.gpus or "[]")),
        handle=json.loads(row.handle or "{}"), started=row.started, ended=row.ended, exit_code=row.exit_code,
    )


class JobExists(Exception):
    """:meth:`JobStore.add` of a record whose id is taken."""


class JobStore:
    """Job records in the hub's database; every call is one short transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        JobRow.__table__.create(engine, checkfirst=True)
        self._sessions = sessionmaker(bind=engine, expire_on_commit=False)

    @classmethod
    def at(cls, url: str) -> JobStore:
        return cls(create_engine(url))

    def add(self, record: JobRecord) -> None:
        """Write a new job's first record; :class:`JobExists` when its id is taken (nothing written)."""
        try:
            self._write(record, new=True)
        except IntegrityError as e:
            raise JobExists(record.id) from e

    def save(self, record: JobRecord) -> None:
        self._write(record, new=False)

    def _write(self, record: JobRecord, new: bool) -> None:
        with self._sessions() as session, session.begin():
            row = JobRow(id=record.id) if new else (session.get(JobRow, record.id) or JobRow(id=record.id))
            row.user, row.name, row.state, row.reason = record.user, record.name, record.state, record.reason
            row.spec = json.dumps(record.spec)
            row.gpus = json.dumps(list(record.gpus))
            row.handle = json.dumps(record.handle)
            row.created, row.started, row.ended, row.exit_code = (
                record.created, record.started, record.ended, record.exit_code)
            session.add(row)

    def get(self, job_id: str) -> JobRecord | None:
        with self._sessions() as session:
            row = session.get(JobRow, job_id)
            return _record(row) if row is not None else None

    def list(self, user: str | None = None, active_only: bool = False, limit: int = 1000) -> list[JobRecord]:
        query = select(JobRow).order_by(JobRow.created.desc()).limit(limit)
        if user is not None:
            query = query.where(JobRow.user == user)
        if active_only:
            query = query.where(JobRow.state.in_(ACTIVE))
        with self._sessions() as session:
            return [_record(row) for row in session.scalars(query)]

    def delete(self, job_id: str) -> None:
        with self._sessions() as session, session.begin():
            row = session.get(JobRow, job_id)
            if row is not None:
                session.delete(row)

    def counts(self) -> dict[str, int]:
        """Jobs per state (every state listed, 0 where none)."""
        counts = dict.fromkeys(STATES, 0)
        with self._sessions() as session:
            for (state,) in session.execute(select(JobRow.state)):
                counts[state] = counts.get(state, 0) + 1
        return counts


def now() -> float:
    return time.time()
