"""The replay's booking load (gpuspawner.replay.bookings): bookings honoured at their start, through the hub's rule."""

from __future__ import annotations

from gpuspawner.replay import main
from gpuspawner.replay.bookings import booking_load, measure
from gpuspawner.replay.simulation import default_policies
from gpuspawner.replay.trace import TraceParams, gpus, synthetic_trace

INVENTORY = gpus("a100=8,t4=8")
POLICY = next(p for p in default_policies(()) if p.name == "gpuspawner")


def test_the_load_books_half_the_a100s_for_a_class_and_two_deadline_runs():
    load = booking_load(INVENTORY, seed=0)
    assert [(b.booking.id, b.booking.count, len(b.sessions)) for b in load] == [
        ("b-class", 4, 4), ("b-t4", 2, 1), ("b-a100", 2, 1)]
    for b in load:
        assert all(b.booking.start <= s.arrive <= b.booking.start + 600 for s in b.sessions)


def test_booked_sessions_are_served_at_their_start_and_unbooked_ones_often_are_not():
    days = [synthetic_trace(TraceParams(seed=seed, load=0.85), len(INVENTORY)) for seed in (1, 2)]
    plain, asked, booked = measure(days, INVENTORY, POLICY)
    assert (plain.booked_sessions, asked.booked_sessions, booked.booked_sessions) == (0, 12, 12)
    assert booked.honoured_pct == 100
    assert asked.honoured_pct < 50  # the same requests without bookings mostly wait
    assert booked.stopped_for_booking > 0  # servers admitted until a window were stopped at its start
    assert plain.stopped_for_booking == asked.stopped_for_booking == 0


def test_the_command_line_prints_the_booking_figures(capsys):
    main(["--bookings", "--days", "1", "--load", "0.85", "--markdown"])
    out = capsys.readouterr().out
    assert "| booked | 6 | 100 |" in out and "| asked, not booked | 6 |" in out
