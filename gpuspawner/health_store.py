"""The GPUs out of service for their health, kept in the hub's database so that a restarted hub keeps them out.

Table ``gpuspawner_gpu_outages`` (on :class:`gpuspawner.db.Base`, created at hub start), one row per
GPU out of service (:class:`gpuspawner.health.Outage`), written whole after each change.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Boolean, Column, Float, Unicode
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from .db import Base
from .health import Outage


class OutageRow(Base):
    __tablename__ = "gpuspawner_gpu_outages"
    uuid = Column(Unicode(255), primary_key=True)
    reason = Column(Unicode(1000), nullable=False)
    since = Column(Float, nullable=False)
    manual = Column(Boolean, nullable=False, default=False)


class HealthStore:
    """Reads and writes what is out of service (on the hub's event loop, as the other stores)."""

    def __init__(self, engine: Engine) -> None:
        OutageRow.__table__.create(engine, checkfirst=True)
        self._sessions = sessionmaker(bind=engine, expire_on_commit=False)

    def load(self) -> list[Outage]:
        """What was out of service; whether it has cleared is found again by the next check."""
        with self._sessions() as session:
            return [Outage(r.uuid, r.reason, r.since, None, bool(r.manual)) for r in session.query(OutageRow).all()]

    def replace(self, outages: Iterable[Outage]) -> None:
        with self._sessions() as session, session.begin():
            session.query(OutageRow).delete()
            session.add_all(OutageRow(uuid=o.uuid, reason=o.reason, since=o.since, manual=o.manual) for o in outages)
