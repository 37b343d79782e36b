"""The hub's bookings table (gpuspawner.db.BookingStore) and the release of unused windows (gpuspawner.hub.bookings)."""

from __future__ import annotations

from sqlalchemy import create_engine

from gpuspawner.bookings import WEEK, Booking
from gpuspawner.db import BookingStore
from gpuspawner.hub.bookings import booking_json, parse_body, resolve_model, status, unused

H = 3600.0
NOW = 1_795_000_000.0


def booking(**kw) -> Booking:
    values = dict(id="b-000001", user="ann", booked_by="ann", model="t4", count=1, start=NOW - H, end=NOW + H,
                  created=NOW - 2 * H)
    values.update(kw)
    return Booking(**values)


def test_a_window_nobody_uses_past_the_grace_is_released_and_one_in_use_is_not():
    b = booking()
    assert unused([b], {}, {}, NOW, grace=900) == [(b, NOW - H)]
    assert unused([b], {"ann": {"t4"}}, {}, NOW, grace=900) == []
    assert unused([b], {"ann": {"a100-sxm4-80gb"}}, {}, NOW, grace=900) == [(b, NOW - H)]  # another model
    assert unused([b], {}, {}, NOW - H + 600, grace=900) == []  # still within the grace
    group = booking(user="", group="class", booked_by="root")
    assert unused([group], {"cat": {"t4"}}, {"class": {"cat"}}, NOW, grace=900) == []
    assert unused([group], {"cat": {"t4"}}, {"class": {"dan"}}, NOW, grace=900) == [(group, NOW - H)]
    released = booking(state="released", released_at=NOW - H + 900)
    assert unused([released], {}, {}, NOW, grace=900) == []  # already given back
    assert status(released, NOW) == "released"
    weekly = booking(state="released", released_at=NOW - H + 900, repeat_weeks=2)
    assert status(weekly, NOW) == "upcoming"  # its next week's window still holds
    assert unused([weekly], {}, {}, NOW + WEEK, grace=900) == [(weekly, NOW - H + WEEK)]


def test_the_store_keeps_every_change_across_processes(tmp_path):
    url = f"sqlite:///{tmp_path}/hub.sqlite"
    store = BookingStore(create_engine(url))
    b = store.save(booking())
    store.change(b, state="released", released_at=NOW)
    store.admit("bob/", NOW + H, b.id)
    store.admit("cy/", NOW + H, b.id)
    store.forget("cy/")
    again = BookingStore(create_engine(url))
    assert again.all() == [booking(state="released", released_at=NOW)]
    assert again.admitted == {"bob/": (NOW + H, b.id)}


def test_a_booking_answers_with_its_windows_and_status():
    b = booking(start=NOW + H, end=NOW + 2 * H, repeat_weeks=2)
    data = booking_json(b, NOW)
    assert data["status"] == "upcoming" and data["window"] == "2026-11-18 12:06-13:06 UTC"
    assert data["windows"] == [{"start": NOW + H, "end": NOW + 2 * H},
                               {"start": NOW + H + WEEK, "end": NOW + 2 * H + WEEK}]
    assert booking_json(b, NOW + 3 * WEEK)["status"] == "ended"
    assert status(booking(state="cancelled"), NOW) == "cancelled" and status(booking(), NOW) == "active"


def test_a_body_names_its_fields_and_a_pattern_names_the_one_model_it_selects():
    b = parse_body({"model": "a100", "count": 2.0, "start": "2026-12-01T10:00:00Z", "end": 1796122800}, "ann", NOW)
    assert (b.user, b.booked_by, b.count, b.start, b.end) == ("ann", "ann", 2, 1796119200.0, 1796122800.0)
    assert parse_body({"model": "t4", "count": 1, "start": 1, "end": 2, "group": "class"}, "root", NOW).user == ""
    assert resolve_model("a100", ["a100-sxm4-80gb", "t4"]) == "a100-sxm4-80gb"
    assert resolve_model("h100", ["a100-sxm4-80gb"]) == "h100"  # check_new names it as unknown
