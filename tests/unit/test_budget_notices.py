"""A running server whose user's GPU budget runs out: told it runs low, warned, then stopped or let finish;
nothing told twice, also after a hub restart."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from gpuspawner.hub.booking_notices import NOTICE_ID as BOOKING_NOTICE_ID
from gpuspawner.hub.budget_notices import (
    LEVELS,
    NOTICE_ID,
    BudgetNotices,
    Holder,
    Rule,
    Spend,
    notice,
    runs_out,
    stage,
)
from gpuspawner.hub.culler import NOTICE_ID as CULLER_NOTICE_ID
from gpuspawner.usage import END_REASON_WORDS, END_REASONS

NOW = datetime(2026, 11, 26, 14, 0, tzinfo=timezone.utc).timestamp()
MONDAY = datetime(2026, 11, 30, 0, 0, tzinfo=timezone.utc).timestamp()


def spend(left: float, burn: float = 4.0, low: bool = False, budget: str = "user ann") -> Spend:
    return Spend(budget, "Your GPU budget", f"{left:g} of 20 A100-hours left this week", left, MONDAY, burn, low)


def test_where_a_user_stands_comes_from_the_budget_that_runs_out_first():
    assert runs_out(spend(2.0, burn=4.0), NOW) == NOW + 1800  # 2 hours left, 4 an hour: half an hour
    assert runs_out(spend(2.0, burn=0.0), NOW) == math.inf
    assert runs_out(spend(-0.1), NOW) == NOW
    assert stage([], NOW, 900) is None
    assert stage([spend(10.0)], NOW, 900) is None
    assert stage([spend(10.0, low=True)], NOW, 900) == "low"
    assert stage([spend(1.0)], NOW, 900) == "warn"  # 15 minutes at 4 an hour
    assert stage([spend(1.0)], NOW, 0) is None  # no warning before zero
    assert stage([spend(10.0), spend(0.0, budget="group ml")], NOW, 900) == "zero"
    assert stage([spend(1.5, burn=1.0, low=True)], NOW, 900) == "low"  # low, but 90 minutes away


def test_the_sentences_say_when_it_runs_out_and_what_happens_then():
    budgets = [spend(1.0)]
    assert notice(budgets, NOW, Rule(at_zero="stop"), "warn") == (
        "Your GPU budget runs out in 15 minutes, at 14:15 UTC, at the GPUs you hold now: 1 of 20 A100-hours "
        "left this week. This server will be stopped then; save your work before.")
    assert notice(budgets, NOW, Rule(at_zero="finish"), "warn").endswith(
        "This server will be allowed to finish; new GPU servers will be refused until 2026-11-30 00:00 UTC.")
    assert notice([spend(3.0, low=True)], NOW, Rule(), "low") == (
        "Your GPU budget runs low: 3 of 20 A100-hours left this week. At the GPUs you hold now it runs out "
        "at 14:45 UTC.")
    assert notice([spend(3.0, burn=0, low=True)], NOW, Rule(), "low").endswith("left this week.")
    assert notice([spend(0.0)], NOW, Rule(at_zero="finish", new="queued behind everyone with budget left"),
                  "zero") == (
        "Your GPU budget is spent: 0 of 20 A100-hours left this week. This server is allowed to finish; new GPU "
        "servers will be queued behind everyone with budget left until 2026-11-30 00:00 UTC.")
    assert "took its GPUs after that and runs on" in notice([spend(0.0)], NOW, Rule(), "zero", after=True)
    assert "until an administrator raises it" in notice([replace(spend(0.0), reset=None)], NOW,
                                                        Rule(at_zero="finish"), "zero")
    assert len({NOTICE_ID, BOOKING_NOTICE_ID, CULLER_NOTICE_ID}) == 3  # replaces neither's notice
    assert "budget" in END_REASONS
    assert END_REASON_WORDS["budget"][0] == "Stopped: budget spent"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Server:
    """What a watcher does to servers and jobs, recorded; the servers' notice boards."""

    def __init__(self) -> None:
        self.boards: dict[str, dict] = {}  # owner -> the notice under NOTICE_ID
        self.stopped: list[str] = []
        self.takes = True

    async def post(self, h: Holder, message: str, level: str) -> bool:
        if self.takes:
            self.boards[h.owner] = {"message": message, "level": level, "posts": self.posted(h) + 1}
        return self.takes

    def posted(self, h: Holder) -> int:
        return self.boards.get(h.owner, {}).get("posts", 0)

    async def board(self, h: Holder) -> str | None:
        return self.boards.get(h.owner, {}).get("level")

    async def stop(self, h: Holder) -> None:
        self.stopped.append(h.owner)

    def watcher(self, clock: Clock) -> BudgetNotices:
        return BudgetNotices(self.post, self.board, self.stop, clock)


ANN = Holder("ann/", "ann", "", NOW - 600, url="http://127.0.0.1:9/user/ann/")
ANN_JOB = Holder("ann/job/7f", "ann", "7f", NOW - 300, is_job=True)
BOB = Holder("bob/", "bob", "", NOW - 60, url="http://127.0.0.1:9/user/bob/")


@pytest.mark.parametrize("at_zero", ["stop", "finish"])
def test_a_round_tells_each_stage_once_then_stops_or_lets_finish(at_zero):
    clock, servers = Clock(NOW), Server()
    watcher, rule = servers.watcher(clock), Rule(at_zero=at_zero)
    bob = [spend(15.0, burn=1.0)]

    async def go():
        await watcher.round([ANN, ANN_JOB, BOB], {"ann": [spend(3.0, low=True)], "bob": bob}, rule)
        await watcher.round([ANN, ANN_JOB, BOB], {"ann": [spend(2.9, low=True)], "bob": bob}, rule)
        assert servers.boards["ann/"]["level"] == LEVELS["low"] and servers.boards["ann/"]["posts"] == 1
        assert "bob/" not in servers.boards
        await watcher.round([ANN, ANN_JOB, BOB], {"ann": [spend(0.9, low=True)], "bob": bob}, rule)
        await watcher.round([ANN, ANN_JOB, BOB], {"ann": [spend(0.8, low=True)], "bob": bob}, rule)
        assert servers.boards["ann/"]["level"] == "warning" and servers.boards["ann/"]["posts"] == 2
        assert servers.stopped == []
        clock.now += 900
        await watcher.round([ANN, ANN_JOB, BOB], {"ann": [spend(-0.01, low=True)], "bob": bob}, rule)
        if at_zero == "stop":  # the server and the job; bob's budget is his own
            assert servers.stopped == ["ann/", "ann/job/7f"]
            assert servers.boards["ann/"]["level"] == "warning"
        else:
            assert servers.stopped == []
            assert servers.boards["ann/"]["level"] == "error" and servers.boards["ann/"]["posts"] == 3
            assert "allowed to finish" in servers.boards["ann/"]["message"]
            await watcher.round([ANN, ANN_JOB, BOB], {"ann": [spend(-0.05, low=True)], "bob": bob}, rule)
            assert servers.boards["ann/"]["posts"] == 3 and servers.stopped == []

    asyncio.run(go())


def test_after_a_restart_a_server_is_not_told_again_what_its_board_says():
    clock, servers = Clock(NOW), Server()
    budgets = {"ann": [spend(0.9, low=True)]}

    async def go():
        await servers.watcher(clock).round([ANN], budgets, Rule())
        assert servers.boards["ann/"]["posts"] == 1
        await servers.watcher(clock).round([ANN], budgets, Rule())  # a new hub process, the same server
        assert servers.boards["ann/"]["posts"] == 1
        # a new start of the server has an empty board: told afresh
        servers.boards.clear()
        await servers.watcher(clock).round([replace(ANN, since=NOW)], budgets, Rule())
        assert servers.boards["ann/"]["posts"] == 1

    asyncio.run(go())


def test_a_notice_not_taken_is_posted_again_and_a_server_not_up_waits():
    clock, servers = Clock(NOW), Server()
    watcher, budgets = servers.watcher(clock), {"ann": [spend(0.9)]}

    async def go():
        await watcher.round([replace(ANN, url=None)], budgets, Rule())
        assert servers.boards == {}
        servers.takes = False
        await watcher.round([ANN], budgets, Rule())
        servers.takes = True
        await watcher.round([ANN], budgets, Rule())
        await watcher.round([ANN], budgets, Rule())
        assert servers.boards["ann/"]["level"] == "warning" and servers.boards["ann/"]["posts"] == 1

    asyncio.run(go())


def test_a_budget_whole_again_is_told_again_when_it_next_runs_low():
    clock, servers = Clock(NOW), Server()
    watcher = servers.watcher(clock)

    async def go():
        await watcher.round([ANN], {"ann": [spend(0.9, low=True)]}, Rule())
        clock.now = MONDAY + 60  # a new week
        await watcher.round([ANN], {"ann": [spend(20.0)]}, Rule())
        await watcher.round([ANN], {"ann": [spend(1.0, low=True)]}, Rule())
        assert servers.boards["ann/"]["posts"] == 2 and servers.boards["ann/"]["level"] == "warning"

    asyncio.run(go())


def test_a_server_started_after_the_budget_was_spent_is_told_not_stopped():
    """With ``gpu_budget_exhausted = "queue-last"`` a spent user's server may start at the lowest priority."""
    clock, servers = Clock(NOW), Server()
    watcher, spent = servers.watcher(clock), {"ann": [spend(-0.2, low=True)]}

    async def go():
        await watcher.round([ANN], spent, Rule())
        assert servers.stopped == ["ann/"]
        clock.now += 30
        later = Holder("ann/second", "ann", "second", clock.now - 5, url="http://127.0.0.1:9/user/ann/second/")
        await watcher.round([later], spent, Rule())
        assert servers.stopped == ["ann/"]
        assert "took its GPUs after that and runs on" in servers.boards["ann/second"]["message"]

    asyncio.run(go())


def test_after_a_restart_the_servers_admitted_while_spent_are_still_told_not_stopped():
    from gpuspawner.hub.budget_notices import spent_at

    spent = [spend(-0.2, burn=4.0)]  # 0.2 over at 4 an hour: spent 3 minutes ago
    assert spent_at(spent, NOW) == NOW - 180
    assert spent_at([spend(-0.2, burn=0.0)], NOW) == NOW and spent_at([spend(1.0)], NOW) == NOW
    clock, servers = Clock(NOW), Server()
    late = Holder("ann/late", "ann", "late", NOW - 60, url="http://127.0.0.1:9/user/ann/late/")
    asyncio.run(servers.watcher(clock).round([ANN, late], {"ann": spent}, Rule()))  # a new hub's first round
    assert servers.stopped == ["ann/"]
    assert "took its GPUs after that and runs on" in servers.boards["ann/late"]["message"]


def test_the_settings_refuse_what_they_cannot_mean():
    from traitlets import TraitError

    from gpuspawner.backends.budget_at_zero import GPUBudgetAtZeroMixin

    assert GPUBudgetAtZeroMixin().gpu_budget_at_zero == "stop"
    assert GPUBudgetAtZeroMixin(gpu_budget_at_zero="finish").gpu_budget_at_zero == "finish"
    for bad in ("Stop", "kill", ""):
        with pytest.raises(TraitError, match="gpu_budget_at_zero must be 'stop' or 'finish'"):
            GPUBudgetAtZeroMixin(gpu_budget_at_zero=bad)
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(TraitError, match="gpu_budget_warn_before must be a finite number"):
            GPUBudgetAtZeroMixin(gpu_budget_warn_before=bad)


def test_the_watcher_reads_each_budget_with_the_rate_the_gpus_held_now_spend_it():
    import json
    from types import SimpleNamespace

    from gpuspawner.budgets import BudgetPolicy, BudgetSpec
    from gpuspawner.hub.budget_notices import spends_of

    def row(user, started, ended=None, count=1, model="a100-sxm4-80gb", groups=("ml",)):
        return SimpleNamespace(user=user, started=started, ended=ended, gpu_count=count, model=model,
                               groups=json.dumps(list(groups)), busy_seconds=0.0, idle_seconds=0.0)

    weights = (("a100*", 4.0),)
    policy = BudgetPolicy(per_user=BudgetSpec(3.0, "week"), per_group={"ml": BudgetSpec(100.0, "week")},
                          weights=weights, unit="T4-hours")
    rows = [row("ann", NOW - 5 * 3600, NOW - 4 * 3600, model="t4"),  # 1 T4-hour, ended
            row("ann", NOW - 900),  # an A100 held 15 minutes: 1 T4-hour so far, 4 an hour
            row("bob", NOW - 3600, count=2, model="t4")]  # bob's 2 T4s: only the group's
    standing = policy.standing("ann", ["ml"], rows, NOW)
    mine, group = spends_of(standing, [r for r in rows if r.ended is None], weights, 0.5)
    assert (mine.budget, mine.name, mine.left, mine.burn, mine.low) == ("user ann", "Your GPU budget", 1.0, 4.0, True)
    assert mine.standing == "1 of 3 T4-hours left this week"
    assert mine.reset == MONDAY
    assert (group.budget, group.name, group.burn, group.low) == ("group ml", "The GPU budget of group 'ml'", 6.0,
                                                                 False)
    assert group.standing == "96 of 100 T4-hours left this week (group 'ml')"
    assert stage([mine, group], NOW, 900) == "warn"  # 1 hour left at 4 an hour: 15 minutes
    assert notice([mine, group], NOW, Rule(), "warn").startswith("Your GPU budget runs out in 15 minutes, at 14:15 UTC")


def test_the_budgets_are_read_again_only_when_something_may_have_changed():
    from gpuspawner.hub.budget_notices import Readings

    reads = []

    def read(users, now):
        reads.append(now)
        return {"ann": [spend(2.0, burn=4.0)]}  # 30 minutes left at 4 an hour

    readings, ann = Readings(read, every=60), [ANN]
    assert readings.get(ann, NOW, 900)["ann"][0].left == 2.0
    carried = readings.get(ann, NOW + 5, 900)["ann"][0]  # 5 s later: carried at the pace read
    assert reads == [NOW] and carried.left == pytest.approx(2.0 - 4.0 * 5 / 3600)
    readings.get(ann, NOW + 10, 900)
    assert reads == [NOW]
    readings.get([ANN, BOB], NOW + 15, 900)  # the holders changed
    assert reads == [NOW, NOW + 15]
    readings.get([ANN, BOB], NOW + 75, 900)  # a minute passed
    assert reads == [NOW, NOW + 15, NOW + 75]
    # read 30 minutes before zero; carried to within the warning time (here 1,790 s), ann would be warned:
    # read again, so that the warning is on what is read
    readings.get([ANN, BOB], NOW + 80, 1790)
    assert reads[-1] == NOW + 75
    readings.get([ANN, BOB], NOW + 90, 1790)
    assert reads[-1] == NOW + 90


def test_a_server_that_cannot_be_reached_holds_up_no_other(caplog):
    clock, servers = Clock(NOW), Server()

    async def post(h, message, level):
        if h.owner == "ann/":
            raise ConnectionRefusedError("connection refused")
        return await servers.post(h, message, level)

    watcher = BudgetNotices(post, servers.board, servers.stop, clock)
    budgets = {"ann": [spend(0.9)], "bob": [spend(0.9)]}
    asyncio.run(watcher.round([ANN, BOB], budgets, Rule()))
    asyncio.run(watcher.round([ANN, BOB], budgets, Rule()))
    assert servers.boards["bob/"]["level"] == "warning"
    assert caplog.text.count("ann/: the budget watcher could not act on it (connection refused)") == 1
