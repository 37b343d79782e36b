"""A server admitted until a booking's window: told once, warned once, stopped at the window's start."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timezone

from gpuspawner.hub.booking_notices import NOTICE_ID, BookingNotices, Until, due, shown, told, warned
from gpuspawner.hub.culler import NOTICE_ID as CULLER_NOTICE_ID
from gpuspawner.hub.usage_page import history
from gpuspawner.usage import END_REASON_WORDS

WINDOW = datetime(2026, 11, 27, 10, 0, tzinfo=timezone.utc).timestamp()


def server(url: str | None = "http://127.0.0.1:9000/user/ada/", since: float = 1.0, until: float = WINDOW) -> Until:
    return Until("ada/", "ada", "", since, until, "b-3f9a2c", "group class-ml", "2 x a100", url, warn_before=600)


def test_due_tells_once_warns_once_and_stops_at_the_window():
    warn = 600
    assert due(WINDOW - 3600, WINDOW, warn, False, False) == "tell"
    assert due(WINDOW - 3600, WINDOW, warn, True, False) is None
    assert due(WINDOW - 600, WINDOW, warn, True, False) == "warn"
    assert due(WINDOW - 1, WINDOW, warn, True, True) is None
    assert due(WINDOW - 300, WINDOW, warn, False, False) == "warn"  # started inside the warning time: warned
    assert due(WINDOW, WINDOW, warn, True, True) == "stop"
    assert due(WINDOW + 30, WINDOW, warn, False, False) == "stop"
    assert due(WINDOW - 1, WINDOW, 0, True, False) is None  # no second warning


def test_the_sentences_name_the_time_the_booking_and_whom_it_is_for():
    s = server()
    assert told(s, WINDOW - 7200) == (
        "This server may keep its GPUs until 10:00 UTC: from then 2 x a100 are booked by group class-ml "
        "(booking b-3f9a2c). It will be stopped then; save your work before.")
    assert told(s, WINDOW - 86400).startswith("This server may keep its GPUs until 2026-11-27 10:00 UTC")
    assert warned(s, WINDOW - 600) == (
        "This server will be stopped in 10 minutes, at 10:00 UTC: its GPUs are booked from then by "
        "group class-ml (booking b-3f9a2c). Save your work now.")
    assert NOTICE_ID != CULLER_NOTICE_ID  # a booking's notice never replaces the culler's
    words, meaning = END_REASON_WORDS["booking"]
    assert words == "Stopped: GPUs booked" and "booking" in meaning


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_round_posts_each_notice_once_retries_one_not_taken_and_stops_at_the_start():
    clock, posted, stopped = Clock(WINDOW - 3600), [], []
    takes = [False, True, True]  # the server takes the first notice only at the second try

    async def post(s, message, level):
        posted.append({"message": message, "level": level})
        return takes.pop(0)

    async def stop(s):
        stopped.append(s.owner)

    notices = BookingNotices(post, stop, clock)

    async def go():
        await notices.round([server(url=None)])  # not up yet: nothing to post to
        assert posted == []
        await notices.round([server()])
        await notices.round([server()])
        await notices.round([server()])
        assert [n["level"] for n in posted] == ["info", "info"]  # told; the second try taken, no third
        assert all("10:00 UTC" in n["message"] for n in posted)
        clock.now = WINDOW - 590
        await notices.round([server()])
        await notices.round([server()])
        assert [n["level"] for n in posted] == ["info", "info", "warning"]
        assert "stopped in 10 minutes" in posted[-1]["message"]
        assert stopped == []
        clock.now = WINDOW + 2
        await notices.round([server()])
        assert stopped == ["ada/"]
        # a new start of the same server (after the window) is told afresh
        clock.now = WINDOW + 3600
        takes.append(True)
        await notices.round([server(since=WINDOW + 3500, until=WINDOW + 7 * 86400)])
        assert posted[-1]["level"] == "info" and "2026-12-04 10:00 UTC" in posted[-1]["message"]

    asyncio.run(go())


def test_a_restarted_hub_does_not_tell_a_server_what_it_shows_already():
    """The hub's memory of what it told is lost with the hub; the server's notice board is not."""
    clock, posted = Clock(WINDOW - 3600), []
    board: list[dict] = []  # the server's notices, kept across the hub's restart

    async def post(s, message, level):
        posted.append(level)
        board[:] = [{"id": NOTICE_ID, "level": level, "message": message, "source": "gpu-bookings"}]
        return True

    async def stop(s):
        pass

    async def showing(s):
        return shown({"notices": board}, s)

    async def go():
        await BookingNotices(post, stop, clock, shown=showing).round([server()])
        assert posted == ["info"]
        await BookingNotices(post, stop, clock, shown=showing).round([server()])  # the hub restarted
        assert posted == ["info"]
        clock.now = WINDOW - 590
        restarted = BookingNotices(post, stop, clock, shown=showing)
        await restarted.round([server()])
        assert posted == ["info", "warning"]
        await BookingNotices(post, stop, clock, shown=showing).round([server()])  # and again
        assert posted == ["info", "warning"]
        board[:] = []  # the server was restarted too and shows nothing: told afresh
        await BookingNotices(post, stop, clock, shown=showing).round([server()])
        assert posted == ["info", "warning", "warning"]

    asyncio.run(go())


def test_what_a_server_shows_is_matched_to_its_booking_and_window():
    s = server()
    mine = {"id": NOTICE_ID, "level": "info", "message": told(s, WINDOW - 3600)}
    assert shown({"notices": [mine]}, s) == {"tell"}
    assert shown({"notices": [dict(mine, level="warning", message=warned(s, WINDOW - 600))]}, s) == {"tell", "warn"}
    earlier = server(until=WINDOW - 2 * 3600)  # another time: not what it was told
    assert shown({"notices": [mine]}, earlier) == set()
    other = dataclasses.replace(s, booking="b-000000")
    assert shown({"notices": [mine]}, other) == set()
    assert shown({"notices": [dict(mine, id=CULLER_NOTICE_ID)]}, s) == set()
    for junk in (None, [], {"notices": "x"}, {"notices": [None, 3, {"id": NOTICE_ID, "message": 7}]}):
        assert shown(junk, s) == set()


def test_the_usage_page_says_a_booking_stopped_it():
    from gpuspawner.hub.usage import shares
    from gpuspawner.usage import Allocation

    row = Allocation(id=1, owner="ada/", user="ada", kind="server", groups="[]", gpu_count=2, model="a100", host="",
                     gpus="[]", started=WINDOW - 3600, ended=WINDOW, end_reason="booking", busy_seconds=0.0,
                     idle_seconds=0.0)
    (shown,) = history(shares([row], WINDOW - 7200, WINDOW + 10, WINDOW + 10))
    assert shown["how"] == "Stopped: GPUs booked"


def test_the_servers_admitted_are_read_from_the_store_and_a_cancelled_booking_binds_no_one(tmp_path):
    from types import SimpleNamespace

    from sqlalchemy import create_engine

    from gpuspawner.bookings import Booking
    from gpuspawner.db import BookingStore
    from gpuspawner.hub.booking_notices import servers_until
    from gpuspawner.ledger import Ledger

    store = BookingStore(create_engine(f"sqlite:///{tmp_path / 'hub.sqlite'}"))
    store.save(Booking(id="b-1", group="class-ml", booked_by="admin", model="t4", count=2, start=WINDOW,
                       end=WINDOW + 7200))
    store.save(Booking(id="b-2", user="cat", booked_by="cat", model="any", count=1, start=WINDOW, end=WINDOW + 60,
                       state="cancelled"))
    ledger = Ledger()
    ledger.adopt("ada/", ["GPU-1"])
    for owner, booking in (("ada/", "b-1"), ("bob/", "b-1"), ("cy/", "b-2"), ("ada/job/7f", "b-1")):
        store.admit(owner, WINDOW, booking)

    def user(ready: bool, active: bool = True):
        server = SimpleNamespace(url="http://127.0.0.1:9/user/x/")
        return SimpleNamespace(spawners={"": SimpleNamespace(active=active, ready=ready, server=server)})

    users = {"ada": user(ready=True), "bob": user(ready=False), "cy": user(ready=True)}
    found = servers_until(store, users, SimpleNamespace(ledger=ledger))
    assert [(s.owner, s.url, s.by, s.what, s.booking) for s in found] == [
        ("ada/", "http://127.0.0.1:9/user/x/", "group class-ml", "2 x t4", "b-1"),
        ("bob/", None, "group class-ml", "2 x t4", "b-1"),  # starting: no notice yet, but stopped at the window
    ]  # cy's booking was cancelled; a job ends by its time limit
    assert found[0].since == ledger.since("ada/")
    users["ada"] = user(ready=False, active=False)  # stopped meanwhile
    assert [s.owner for s in servers_until(store, users, SimpleNamespace(ledger=ledger))] == ["bob/"]
