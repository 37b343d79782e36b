"""Each user's notification settings in the hub's database (table ``gpuspawner_notify_settings``).

Declared on gpuspawner's own base (:mod:`gpuspawner.db`), beside JupyterHub's tables, created at the
hub's start if missing. As :class:`~gpuspawner.db.BookingStore`: read once, every change committed
before it is kept in memory (and before the REST API answers), reads from memory (every notification
reads its user's settings).
"""

from __future__ import annotations

import json

from sqlalchemy import Column, Text, Unicode
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from ..db import Base
from ..notifications import Preferences


class NotifySettingsRow(Base):
    """One user's choices: address, webhook, and per channel the events on (JSON: ``{channel: [event]}``)."""

    __tablename__ = "gpuspawner_notify_settings"
    user = Column(Unicode(255), primary_key=True)
    email = Column(Unicode(255), nullable=False, default="")
    webhook = Column(Text, nullable=False, default="")
    events = Column(Text, nullable=False, default="{}")


class NotifyStore:
    """The users' notification settings: :meth:`get` (None for a user who never chose), :meth:`put`."""

    def __init__(self, engine: Engine) -> None:
        NotifySettingsRow.__table__.create(engine, checkfirst=True)
        self._sessions = sessionmaker(bind=engine, expire_on_commit=False)
        with self._sessions() as session:
            self._users = {row.user: _preferences(row) for row in session.query(NotifySettingsRow).all()}

    def get(self, user: str) -> Preferences | None:
        return self._users.get(user)

    def put(self, user: str, chosen: Preferences) -> Preferences:
        """Write ``user``'s settings, commit, then keep them."""
        events = json.dumps({c: sorted(e) for c, e in sorted(chosen.events.items())})
        with self._sessions() as session, session.begin():
            session.merge(NotifySettingsRow(user=user, email=chosen.email, webhook=chosen.webhook, events=events))
        self._users[user] = chosen
        return chosen


def _preferences(row: NotifySettingsRow) -> Preferences:
    try:
        events = json.loads(row.events or "{}")
    except ValueError:
        events = {}
    return Preferences(row.email or "", row.webhook or "",
                       {c: frozenset(e) for c, e in events.items() if isinstance(e, list)})
