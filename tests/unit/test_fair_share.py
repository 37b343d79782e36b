"""Fair-share queueing: recent use, the queue's order under it, its words, its setting and its replay."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings, strategies as st
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.backends.local.spawner import GPULocalProcessSpawner
from gpuspawner.backends.queue_order import GPUQueueOrderMixin
from gpuspawner.backends.startup import refusal_at_start
from gpuspawner.fairshare import FairShare, RecentUse, held_now, ordinal, use_now
from gpuspawner.gpu import GPU
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest
from gpuspawner.queue import GPUQueue, Waiter, known_for
from gpuspawner.replay import Policy, Session, TraceParams, gpus, main, synthetic_trace
from gpuspawner.replay.fairness import jain, measure
from gpuspawner.waits import WaitHistory, queue_estimate

HOUR = 3600.0
DAY = 24 * HOUR
A100 = "NVIDIA A100-SXM4-80GB"


def fixed(use: dict[str, float], half_life: float = 7 * DAY) -> FairShare:
    return FairShare(lambda users: {u: use.get(u, 0.0) for u in users}, half_life)


# ---------------------------------------------------------------- recent use


def test_recent_use_halves_each_half_life_and_counts_what_is_held_up_to_now():
    recent = RecentUse(DAY)
    recent.add("ann", 2, "a100", 0.0, HOUR)  # 2 GPU-hours, ended at 1 h
    fresh = recent.of("ann", HOUR)
    assert 1.97 < fresh < 2.0  # decayed a little while it was held
    assert recent.of("ann", HOUR + DAY) == pytest.approx(fresh / 2)
    assert recent.of("ann", HOUR + 2 * DAY) == pytest.approx(fresh / 4)
    assert recent.of("bob", HOUR) == 0.0  # no history
    # still held: 3 GPUs since 1 h, counted up to now, beside what ended
    assert recent.of("ann", 2 * HOUR, [(3, "a100", HOUR)]) == pytest.approx(recent.of("ann", 2 * HOUR) + 3, rel=0.01)
    # rows read newest first (the usage table's order) give the same as oldest first
    again = RecentUse(DAY)
    again.add("ann", 1, "t4", 5 * HOUR, 6 * HOUR)
    again.add("ann", 1, "t4", 0.0, HOUR)
    other = RecentUse(DAY)
    other.add("ann", 1, "t4", 0.0, HOUR)
    other.add("ann", 1, "t4", 5 * HOUR, 6 * HOUR)
    assert again.of("ann", 7 * HOUR) == pytest.approx(other.of("ann", 7 * HOUR))
    with pytest.raises(ValueError):
        RecentUse(0.0)


def test_the_hubs_history_is_read_once_and_each_release_adds_to_recent_use():
    reads, now = [], [10 * HOUR]
    rows = [("server/a100", "ann", HOUR, 2, "a100", 9 * HOUR)]  # the usage table's ended row, as waits reads it

    def read():
        reads.append(1)
        return rows

    history = WaitHistory(read, lambda uuid: "a100", clock=lambda: now[0])
    recent = history.recent_use(DAY)
    assert recent.of("ann", now[0]) == pytest.approx(2, rel=0.05)
    assert len(history.current()) == 1 and reads == [1]
    history.observe("release", "bob/", ("GPU-1",), now[0] - HOUR)  # bob held 1 GPU for the last hour
    assert history.recent_use(DAY) is recent and reads == [1]
    assert recent.of("bob", now[0]) == pytest.approx(1, rel=0.05)
    assert len(history.current()) == 2  # the wait estimates' history got the same release


def test_held_now_counts_each_users_holdings_from_the_ledger():
    clock = [0.0]
    ledger = Ledger(clock=lambda: clock[0])
    inventory = tuple(GPU("h", i, f"u{i}", A100) for i in range(3))
    ledger.reserve(inventory, GPURequest("ann/", 2))
    clock[0] = HOUR
    ledger.reserve(inventory, GPURequest("ann/job/7", 1))
    held = held_now(ledger.allocations(), ledger.since, lambda o: o.split("/")[0], lambda u: "a100", 2 * HOUR)
    assert sorted(held["ann"]) == [(1, "a100", HOUR), (2, "a100", 0.0)]
    recent = RecentUse(DAY)
    share = use_now(lambda: recent, DAY, lambda: held_now(ledger.allocations(), ledger.since,
                                                         lambda o: o.split("/")[0], lambda u: "a100", clock[0]),
                    lambda: clock[0])
    clock[0] = 2 * HOUR
    assert share.use(["ann", "bob"]) == pytest.approx({"ann": 2 * 2 + 1, "bob": 0.0}, rel=0.03)  # decayed a little


# ---------------------------------------------------------------- the order


@settings(max_examples=60, deadline=None)
@given(joins=st.lists(st.sampled_from("abcde"), min_size=1, max_size=14),
       use=st.dictionaries(st.sampled_from("abcde"), st.sampled_from([0.0, 0.5, 3.0, 12.5]), max_size=5))
def test_under_fair_share_the_order_is_total_by_use_then_todays_rule(joins, use):
    queue = GPUQueue()
    queue.fair_share = fixed(use)
    waiters = [queue.join(f"{u}/{n}", u, 1) for n, u in enumerate(joins)]
    order = queue.waiters()
    assert sorted(order, key=id) == sorted(waiters, key=id)  # every request once
    inventory = (GPU("h", 0, "u0", A100),)
    assert [queue.position(w, inventory) for w in order] == list(range(1, len(order) + 1))  # a total order
    for first, then in zip(order, order[1:], strict=False):
        u, v = use.get(first.user, 0.0), use.get(then.user, 0.0)
        assert u <= v  # less recent use first
        if u == v:  # ties: today's rule, a user's n-th request behind everyone's earlier ones, then arrival
            assert (first.rank, first.seq) < (then.rank, then.seq)
    no_history = [w for w in order if use.get(w.user, 0.0) == 0]
    assert order[:len(no_history)] == no_history  # a user with no history before any user with history
    by_arrival = GPUQueue()
    for n, u in enumerate(joins):
        by_arrival.join(f"{u}/{n}", u, 1)
    assert [w.owner for w in by_arrival.waiters()] == [w.owner for w in sorted(order, key=lambda w: (w.rank, w.seq))]


def test_a_later_request_of_a_user_with_less_use_passes_and_the_order_follows_use_now():
    use, clock = {"heavy": 5.0}, [0.0]
    queue = GPUQueue(clock=lambda: clock[0])
    queue.fair_share = fixed(use)
    heavy = queue.join("heavy/", "heavy", 1)
    light = queue.join("light/", "light", 1)
    assert queue.waiters() == [light, heavy]
    inventory = (GPU("h", 0, "u0", A100),)
    # the spawn form's "if you queue now": a request not yet queued goes where its user's use puts it
    # (behind its equals: light, with no use either, was there first)
    assert queue.ahead((), inventory, before=Waiter("new/", "new", 1, (), 0, -1)) == [light]
    use["mid"] = 1.0
    assert queue.ahead((), inventory, before=Waiter("mid/", "mid", 1, (), 0, -1)) == [light]
    use["mid"] = 6.0
    assert queue.ahead((), inventory, before=Waiter("mid/", "mid", 1, (), 0, -1)) == [light, heavy]
    use["light"] = 9.0  # light's server has held GPUs for long: at the next look heavy is first again
    queue.wake()
    assert queue.waiters() == [light, heavy]  # looked at once a second, however many look meanwhile
    clock[0] += 1.0
    queue.wake()
    assert queue.waiters() == [heavy, light]
    queue.fair_share = None  # by arrival, a request not queued goes behind everyone
    assert queue.ahead((), inventory, before=Waiter("new/", "new", 1, (), 0, -1)) == [heavy, light]


def test_the_wait_estimate_follows_the_fair_share_order():
    now = 100 * HOUR
    inventory = (GPU("h", 0, "u0", A100),)
    ledger = Ledger()
    ledger.reserve(inventory, GPURequest("old/job/1", 1))  # a job: ends by its time limit, 1 hour on
    queue = GPUQueue()
    queue.fair_share = fixed({"heavy": 5.0})
    heavy = queue.join("heavy/", "heavy", 1)
    light = queue.join("light/", "light", 1)
    for w in (heavy, light):
        w.joined = now

    def estimate(waiter):
        return queue_estimate(waiter, inventory, queue, ledger.allocations(), lambda owner: now, WaitHistory(list, str),
                              job_time_limit=HOUR, queue_timeout=3 * HOUR, now=now)

    assert estimate(light).likely == now + HOUR and "ahead of yours" not in estimate(light).basis
    assert "; 1 request ahead of yours;" in estimate(heavy).basis
    queue.fair_share = None  # by arrival heavy, who came first, is first
    queue.reorder()
    assert estimate(heavy).likely == now + HOUR and "; 1 request ahead of yours;" in estimate(light).basis


def test_the_place_and_its_rule_in_words():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]
    queue = GPUQueue()
    w = queue.join("ann/", "ann", 1)
    assert queue.why(w, 2) == ("2nd in the queue: first come, first served, each user's first request before "
                               "anyone's second")
    queue.fair_share = fixed({"ann": 12.54})
    queue.reorder()
    assert queue.why(w, 3) == ("3rd in the queue: fair share puts users with less recent GPU use first "
                               "(your recent use: 12.5 GPU-hours, use 7 days ago counting half)")
    queue.fair_share = fixed({"ann": 0.01}, half_life=36 * HOUR)
    queue.reorder()
    assert queue.why(w, 1).endswith("(your recent use: less than 0.1 GPU-hours, use 36 hours ago counting half)")


async def test_a_waiting_request_under_fair_share_is_told_its_place_and_why():
    ledger = Ledger()
    inventory = (GPU("h", 0, "u0", A100),)
    ledger.reserve(inventory, GPURequest("holder/", 1))
    queue = GPUQueue()
    queue.fair_share = fixed({"ann": 3.0}, half_life=DAY)
    reports: list[str] = []

    async def read():
        return inventory

    def place(current):
        return ledger.reserve(current, GPURequest("ann/", 1))

    queue.join("bob/", "bob", 1)
    ann = queue.join("ann/", "ann", 1)
    task = asyncio.ensure_future(queue.serve(ann, read, place, timeout=60, report=lambda p, t: reports.append(t),
                                             recheck=0.05, known=lambda w, g: known_for(w, g, {"u0": "holder/"}, {})))
    await asyncio.sleep(0.2)
    task.cancel()
    assert reports[0] == ("Waiting for a free GPU: 2nd in the queue: fair share puts users with less recent GPU use "
                          "first (your recent use: 3.0 GPU-hours, use 1 day ago counting half); 2 of 2 waiting for "
                          f"these GPUs; 1 of 1 {A100} held. No server here has a time limit, so no end time is known.")


def test_the_setting_is_checked_at_start():
    assert GPUQueueOrderMixin().gpu_queue_order == "arrival"
    assert GPUQueueOrderMixin(gpu_queue_order="fair-share").gpu_fair_share_half_life == 168.0
    with pytest.raises(TraitError, match="gpu_queue_order must be 'arrival' or 'fair-share', not 'lottery'"):
        GPUQueueOrderMixin(gpu_queue_order="lottery")
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(TraitError, match="gpu_fair_share_half_life must be a finite number of hours > 0"):
            GPUQueueOrderMixin(gpu_fair_share_half_life=bad)
    # a hub configured so stops at start, with the sentence (c.GPUSpawnerMixin.x, as documented)
    c = Config()
    c.GPUSpawnerMixin.gpu_queue_order = "fifo"
    assert refusal_at_start(GPULocalProcessSpawner, c) == (
        "GPULocalProcessSpawner: gpu_queue_order must be 'arrival' or 'fair-share', not 'fifo'")
    c.GPUSpawnerMixin.gpu_queue_order = "fair-share"
    assert refusal_at_start(GPULocalProcessSpawner, c) is None


# ---------------------------------------------------------------- the replay


def test_in_the_replay_fair_share_lets_a_light_user_pass_a_heavy_users_earlier_request():
    # one T4. heavy holds it 0..3600 and asks again at 600; light asks at 900. By arrival heavy's second
    # request starts at 3600 (wait 3000 s) and light's at 4200 (wait 3300 s); by fair share light (no use)
    # goes first at 3600 (wait 2700 s) and heavy at 4200 (wait 3600 s).
    trace = [Session(0, "heavy", 0, 1, ("t4",), [("active", 3600)]),
             Session(1, "heavy", 600, 1, ("t4",), [("active", 600)]),
             Session(2, "light", 900, 1, ("t4",), [("active", 600)])]
    arrival = Policy("arrival", queue=True, gpu_culler=None, queue_timeout=7200)
    fair = Policy("fair", queue=True, gpu_culler=None, queue_timeout=7200, queue_order="fair-share")
    by_arrival, by_share = measure([trace], gpus("t4=1"), [arrival, fair], hours=2)
    # light: the bottom quartile (1 user of 2), heavy: the top
    assert (by_arrival.light_median_min, by_arrival.heavy_median_min) == (55.0, 25.0)
    assert (by_share.light_median_min, by_share.heavy_median_min) == (45.0, 30.0)
    assert jain([1.0, 1.0]) == 1.0 and jain([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert by_arrival.jain == by_share.jain == pytest.approx(jain([1 + 1 / 6, 1 / 6]))


def test_the_heavy_user_mix_is_an_option_and_the_documented_day_is_unchanged():
    plain = synthetic_trace(TraceParams(), 16)
    assert synthetic_trace(TraceParams(heavy_users=0.0), 16) == plain
    mixed = synthetic_trace(TraceParams(heavy_users=0.2, heavy_demand=4.0), 16)
    per_user: dict[str, int] = {}
    for s in mixed:
        per_user[s.user] = per_user.get(s.user, 0) + 1
    heavy = [per_user.get(f"user{u:02d}", 0) for u in range(8)]  # a fifth of 40 users
    light = [per_user.get(f"user{u:02d}", 0) for u in range(8, 40)]
    assert sum(heavy) / 8 > 2.5 * sum(light) / 32


def test_the_replay_prints_fifo_and_fair_share_figures(capsys):
    main(["--fairness", "--days", "1", "--heavy-users", "0.2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Queue order, 16 GPUs, 1 day(s) (seeds 1-1), offered load ")
    assert "a 0.2 share of the users asking 4 times as often as the others" in out[0]
    assert all(t in out[1] for t in ("Jain's index, GPU-hours per user", "median wait light min",
                                     "median wait heavy min"))
    assert [line.split("  ")[0] for line in out[2:]] == ["gpuspawner, arrival (FIFO)", "gpuspawner, fair-share"]
