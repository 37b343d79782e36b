"""The bookings core (gpuspawner.bookings): what may be booked, and who may take GPUs before a window.

Properties checked against a brute-force oracle that looks at every moment a window starts or ends.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from gpuspawner.bookings import (
    ANY,
    PAST_SLACK,
    WEEK,
    Booking,
    BookingError,
    BookingLimits,
    booked_at,
    check_new,
    held_windows,
    rule,
    windows,
)

NOW = 1_795_000_000.0  # 2026-11-18 (a Wednesday), 11:06:40 UTC
H = 3600.0
CAPACITY = {"a100": 4, "t4": 2}
LIMITS = BookingLimits(hours_per_week=40, max_ahead=14 * 24 * H, max_window=8 * H, grace=900)


def booking(n: int = 0, **kw) -> Booking:
    values = dict(id=f"b-{n:06x}", user="ann", booked_by="ann", model="a100", count=1,
                  start=NOW + H, end=NOW + 3 * H, created=NOW)
    values.update(kw)
    return Booking(**values)


def accepted(wanted: list[Booking]) -> list[Booking]:
    """The bookings check_new takes, each checked against those taken before it (as the hub books)."""
    taken: list[Booking] = []
    for b in wanted:
        try:
            check_new(b, taken, LIMITS, CAPACITY, NOW, is_admin=True)
        except BookingError:
            continue
        taken.append(b)
    return taken


def moments(bookings, since, until):
    """Every moment the booked amount can change inside [since, until), and since itself."""
    out = {since}
    for b in bookings:
        for s, e in held_windows(b, since, until):
            out.update(t for t in (s, e) if since <= t < until)
    return sorted(out)


def booked(bookings, t, model=None):
    """GPUs booked at t (of model; None: all), counted the plain way."""
    total = 0
    for b in bookings:
        if model is not None and b.model != model:
            continue
        if any(s <= t < e for s, e in held_windows(b, t - 1, t + 1)):
            total += b.count
    return total


def fits(bookings, capacity, t, model, extra=0, kept=0, kept_all=0):
    """Whether, at t, the bookings plus extra GPUs of model fit in the model's GPUs and in all GPUs."""
    total = sum(capacity.values())
    if booked(bookings, t, model) and booked(bookings, t, model) + kept + extra > capacity.get(model, 0):
        return False
    return not (booked(bookings, t) and booked(bookings, t) + kept_all + extra > total)


starts = st.integers(0, 24 * 4).map(lambda q: NOW + q * 900)  # quarter hours over the next day
lengths = st.integers(1, 16).map(lambda q: q * 900.0)
candidates = st.builds(
    lambda n, user, group, model, count, start, length, repeat: booking(
        n, user="" if group else user, group=group, booked_by="root", model=model, count=count,
        start=start, end=start + length, repeat_weeks=repeat),
    st.integers(0, 2**24), st.sampled_from(["ann", "bob", "cy"]), st.sampled_from(["", "", "class"]),
    st.sampled_from(["a100", "t4", ANY]), st.integers(1, 4), starts, lengths, st.sampled_from([0, 0, 2, 3]))


@settings(max_examples=150, deadline=None)
@given(st.lists(candidates, max_size=12))
def test_accepted_bookings_never_hold_more_gpus_than_a_model_has(wanted):
    taken = accepted(wanted)
    for t in moments(taken, NOW, NOW + 4 * WEEK):
        for model, gpus in CAPACITY.items():
            assert booked(taken, t, model) <= gpus
        assert booked(taken, t) <= sum(CAPACITY.values())


def test_a_booking_that_would_overfill_a_window_names_the_bookings_there():
    class_ = booking(1, user="", group="class-ml", booked_by="root", count=3)
    with pytest.raises(BookingError) as e:
        check_new(booking(2, count=2, start=NOW + 2 * H, end=NOW + 4 * H), [class_], LIMITS, CAPACITY, NOW, False)
    assert e.value.field == "count"
    assert "Only 1 of the 4 a100 GPUs are free to book" in str(e.value)
    assert "3 a100 GPUs are booked" in str(e.value) and "for group class-ml (booked by root)" in str(e.value)
    check_new(booking(3, count=1, start=NOW + 2 * H, end=NOW + 4 * H), [class_], LIMITS, CAPACITY, NOW, False)
    check_new(booking(4, count=4, start=NOW + 3 * H, end=NOW + 4 * H), [class_], LIMITS, CAPACITY, NOW, False)
    cancelled = dataclasses.replace(class_, state="cancelled")
    check_new(booking(5, count=4), [cancelled], LIMITS, CAPACITY, NOW, False)


#: bad bookings, each with the field its refusal names: (changes, is_admin, field)
BAD = [
    (dict(user="", group=""), True, "user"),
    (dict(user="ann", group="class"), True, "user"),
    (dict(user="", group="class"), False, "group"),
    (dict(user="bob"), False, "user"),
    (dict(model="h100"), False, "model"),
    (dict(model=ANY, count=7), False, "count"),
    (dict(count=0), False, "count"),
    (dict(count=5), True, "count"),
    (dict(count=-1), False, "count"),
    (dict(repeat_weeks=-1), True, "repeat_weeks"),
    (dict(repeat_weeks=53), True, "repeat_weeks"),
    (dict(start=NOW - PAST_SLACK - 1, end=NOW + H), True, "start"),
    (dict(end=NOW + H), True, "end"),
    (dict(end=NOW + 0.5 * H), True, "end"),
    (dict(start=NOW + H, end=NOW + 10 * H), False, "end"),
    (dict(start=NOW + 15 * 24 * H, end=NOW + 15 * 24 * H + H), False, "start"),
    (dict(start=NOW + H, end=NOW + 9 * 24 * H, repeat_weeks=2), True, "end"),
    (dict(model=ANY, count=6, start=NOW + H, end=NOW + 8 * H, repeat_weeks=2), False, "count"),  # 42 GPU-hours
]


@pytest.mark.parametrize("changes, is_admin, field", BAD)
def test_every_bad_booking_is_refused_naming_its_field(changes, is_admin, field):
    with pytest.raises(BookingError) as e:
        check_new(booking(**changes), [], LIMITS, CAPACITY, NOW, is_admin)
    assert e.value.field == field
    assert str(e.value).endswith(".") and "{" not in str(e.value)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["a100", "t4", ANY]), st.integers(1, 2), st.integers(0, 13 * 24 * 4),
       st.integers(1, 32), st.sampled_from(["ann", ""]))
def test_good_bookings_within_the_limits_are_taken(model, count, quarter, length, user):
    start = NOW + quarter * 900
    b = booking(model=model, count=count, start=start, end=start + length * 900, user=user,
                group="" if user else "class", booked_by="ann" if user else "root")
    check_new(b, [], LIMITS, CAPACITY, NOW, is_admin=not user)


def test_limits_bind_users_not_administrators():
    long = booking(start=NOW + H, end=NOW + 20 * H)
    with pytest.raises(BookingError):
        check_new(long, [], LIMITS, CAPACITY, NOW, is_admin=False)
    check_new(dataclasses.replace(long, user="bob"), [], LIMITS, CAPACITY, NOW, is_admin=True)


def test_weekly_hours_count_each_holder_apart_and_every_weekly_window():
    a = booking(1, count=4, start=NOW + H, end=NOW + 8 * H)  # 28 GPU-hours
    check_new(booking(2, count=1, start=NOW + 9 * H, end=NOW + 17 * H, model="t4"), [a], LIMITS, CAPACITY, NOW, False)
    with pytest.raises(BookingError) as e:
        check_new(booking(3, count=2, start=NOW + 9 * H, end=NOW + 16 * H, model="t4"), [a], LIMITS, CAPACITY, NOW,
                  False)
    assert "42 GPU-hours for ann in the week of 2026-11-16" in str(e.value)
    check_new(booking(4, user="bob", booked_by="bob", count=2, start=NOW + 9 * H, end=NOW + 16 * H),
              [a], LIMITS, CAPACITY, NOW, False)


def test_weekly_windows_repeat_and_a_released_window_frees_its_gpus():
    b = booking(start=NOW + H, end=NOW + 3 * H, repeat_weeks=3)
    assert windows(b, NOW, NOW + 4 * WEEK) == [(NOW + H + k * WEEK, NOW + 3 * H + k * WEEK) for k in range(3)]
    assert windows(b, NOW + WEEK + 2 * H, NOW + WEEK + 2.5 * H) == [(NOW + H + WEEK, NOW + 3 * H + WEEK)]
    released = dataclasses.replace(b, state="released", released_at=NOW + 1.25 * H)
    assert held_windows(released, NOW, NOW + 2 * WEEK) == [(NOW + H, NOW + 1.25 * H),
                                                          (NOW + H + WEEK, NOW + 3 * H + WEEK)]
    assert booked_at([released], NOW + 2 * H) == {}
    assert booked_at([released], NOW + 2 * H + WEEK) == {"a100": [(released, 1)]}


# ------------------------------------------------------------------ the placement rule

CLASS = booking(9, user="", group="class-ml", booked_by="root", count=3, start=NOW + H, end=NOW + 3 * H)


def test_a_job_that_ends_before_the_window_is_ok_a_server_must_leave_by_it():
    assert rule([CLASS], CAPACITY, "bob", [], "a100", 2, NOW, ends_by=NOW + H).kind == "ok"
    verdict = rule([CLASS], CAPACITY, "bob", [], "a100", 2, NOW, ends_by=None)
    assert (verdict.kind, verdict.until, verdict.booking) == ("until", NOW + H, CLASS)
    assert "stopped at 2026-11-18 12:06 UTC" in verdict.message
    assert rule([CLASS], CAPACITY, "bob", [], "a100", 1, NOW, ends_by=None).kind == "ok"  # 1 stays unbooked


def test_during_a_window_others_are_refused_with_the_booking_and_the_booked_take_it():
    verdict = rule([CLASS], CAPACITY, "bob", [], "a100", 2, NOW + 2 * H, ends_by=None)
    assert verdict.kind == "refused" and verdict.booking == CLASS
    assert verdict.message.startswith("3 a100 GPUs are booked 2026-11-18 12:06-14:06 UTC for group class-ml "
                                      "(booked by root). Only 1 of 4 a100 GPUs is not booked now.")
    assert rule([CLASS], CAPACITY, "ann", ["class-ml"], "a100", 3, NOW + 2 * H, ends_by=None).kind == "ok"
    assert rule([CLASS], CAPACITY, "bob", [], "t4", 2, NOW + 2 * H, ends_by=None).kind == "ok"


requests = st.tuples(st.sampled_from(["ann", "bob", "cy"]), st.sampled_from([(), ("class",)]),
                     st.sampled_from(["a100", "t4"]), st.integers(1, 3), st.integers(0, 8 * 4),
                     st.one_of(st.none(), st.integers(1, 24 * 4)), st.integers(0, 2), st.integers(0, 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(candidates, max_size=8), requests)
def test_rule_never_lets_a_non_booker_hold_a_gpu_into_a_window_it_cannot_leave_in_time(wanted, request):
    taken = accepted(wanted)
    user, groups, model, count, at, length, kept_model, kept_other = request
    now = NOW + at * 900
    ends_by = None if length is None else now + length * 900
    held = {model: kept_model, "t4" if model == "a100" else "a100": kept_other}
    verdict = rule(taken, CAPACITY, user, groups, model, count, now, ends_by, held)
    mine = sum(b.count for b in taken if b.is_for(user, groups) and b.model in (model, ANY)
               and any(s <= now < e for s, e in held_windows(b, now, now + 1)))
    if mine >= count:
        assert verdict.kind == "ok"
        return
    others = [b for b in taken if not b.is_for(user, groups)]
    keeps_until = verdict.until if verdict.kind == "until" else ends_by if ends_by is not None else now + 10 * WEEK
    kept_all = kept_model + kept_other
    for t in moments(others, now, keeps_until):
        if verdict.kind != "refused":  # whatever it is let take, it may keep while the bookings fit
            assert fits(others, CAPACITY, t, model, count, kept_model, kept_all), (verdict, t)
    if verdict.kind == "until":
        assert now < verdict.until and not fits(others, CAPACITY, verdict.until, model, count, kept_model, kept_all)
        assert verdict.booking in others and "will be stopped at" in verdict.message
    if verdict.kind == "refused":
        assert not fits(others, CAPACITY, now, model, count, kept_model, kept_all)
        assert verdict.booking in others and "booked by" in verdict.message
