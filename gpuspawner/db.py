"""gpuspawner's own tables in the hub's database: the one declarative base they all use.

JupyterHub's ORM has its base; gpuspawner's tables (usage accounting in
:mod:`gpuspawner.usage`, notebook GPU jobs in :mod:`gpuspawner.jobmodel.store`, GPU bookings
here: :class:`BookingStore`) are
declared on this one, on the same engine, and created by their modules at hub
start (``checkfirst``), so they never touch JupyterHub's own schema.
"""

from dataclasses import replace

from sqlalchemy import Column, Float, Integer, String, Text, Unicode
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, sessionmaker

from .bookings import Booking, as_record


class Base(DeclarativeBase):
    """gpuspawner's tables (their metadata, separate from JupyterHub's)."""


# ------------------------------------------------------------------ bookings (gpuspawner.bookings)


class BookingRow(Base):
    """One GPU booking (:class:`gpuspawner.bookings.Booking`): its fields, one column each."""

    __tablename__ = "gpuspawner_bookings"
    id = Column(String(32), primary_key=True)
    user = Column(Unicode(255), nullable=False, default="")
    group = Column("group_name", Unicode(255), nullable=False, default="")
    booked_by = Column(Unicode(255), nullable=False)
    model = Column(Unicode(255), nullable=False)
    count = Column(Integer, nullable=False)
    start = Column(Float, nullable=False)  # seconds since the epoch: the first window
    end = Column("end_time", Float, nullable=False)
    repeat_weeks = Column(Integer, nullable=False, default=0)
    created = Column(Float, nullable=False)
    state = Column(String(16), nullable=False)  # booked | released | cancelled
    released_at = Column(Float, nullable=True)
    note = Column(Text, nullable=False, default="")


class BookingHoldRow(Base):
    """A server let take GPUs before a booked window on condition that it gives them back by ``until``."""

    __tablename__ = "gpuspawner_booking_holds"
    owner = Column(Unicode(255), primary_key=True)  # the ledger's owner: user/server-name
    until = Column(Float, nullable=False)
    booking = Column(String(32), nullable=False)


class BookingStore:
    """The hub's bookings: read from ``gpuspawner_bookings`` once, at start; every change is committed
    before it is kept in memory (and before the REST API answers), so a hub killed at any moment
    comes back with every booking it confirmed. Reads are from memory (the placement rule runs per spawn).

    ``admitted``: owner -> (until, booking id) of the servers let take GPUs before a window on
    condition that they give them back by ``until`` (table ``gpuspawner_booking_holds``; change
    it through :meth:`admit` and :meth:`forget`).
    """

    def __init__(self, engine: Engine) -> None:
        BookingRow.__table__.create(engine, checkfirst=True)
        BookingHoldRow.__table__.create(engine, checkfirst=True)
        self._sessions = sessionmaker(bind=engine, expire_on_commit=False)
        with self._sessions() as session:
            self._bookings = {row.id: _booking(row) for row in session.query(BookingRow).all()}
            holds = session.query(BookingHoldRow).all()
            self.admitted: dict[str, tuple[float, str]] = {h.owner: (h.until, h.booking) for h in holds}

    def all(self) -> list[Booking]:
        return sorted(self._bookings.values(), key=lambda b: (b.start, b.id))

    def get(self, booking_id: str) -> Booking | None:
        return self._bookings.get(booking_id)

    def save(self, booking: Booking) -> Booking:
        """Write ``booking`` (new or changed), commit, then keep it."""
        with self._sessions() as session, session.begin():
            row = session.get(BookingRow, booking.id) or BookingRow(id=booking.id)
            for name, value in as_record(booking).items():
                setattr(row, name, value)
            session.add(row)
        self._bookings[booking.id] = booking
        return booking

    def change(self, booking: Booking, **values: object) -> Booking:
        return self.save(replace(booking, **values))

    def admit(self, owner: str, until: float, booking_id: str) -> None:
        """``owner`` holds GPUs until ``until``, when booking ``booking_id`` needs them."""
        with self._sessions() as session, session.begin():
            session.merge(BookingHoldRow(owner=owner, until=until, booking=booking_id))
        self.admitted[owner] = (until, booking_id)

    def forget(self, owner: str) -> None:
        """``owner`` gave its GPUs back (or never held under a condition): nothing to keep."""
        if self.admitted.pop(owner, None) is not None:
            with self._sessions() as session, session.begin():
                session.query(BookingHoldRow).filter_by(owner=owner).delete()


def _booking(row: BookingRow) -> Booking:
    return Booking(id=row.id, user=row.user, group=row.group, booked_by=row.booked_by, model=row.model,
                   count=row.count, start=row.start, end=row.end, repeat_weeks=row.repeat_weeks,
                   created=row.created, state=row.state, released_at=row.released_at, note=row.note or "")
