"""The wait estimator's core (gpuspawner/estimate.py): its properties, its history and its sentences."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st

from gpuspawner.estimate import SAMPLES, Ask, Estimate, History, Holder, Holding, estimate, for_gpus, latest_end
from gpuspawner.gpu import GPU

A100, T4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"
HOUR = 3600.0
GROUP = "node1/" + A100


def later(x: float | None) -> float:
    return math.inf if x is None else x


def no_earlier(after: Estimate, before: Estimate) -> bool:
    return all(later(getattr(after, k)) >= later(getattr(before, k)) for k in ("low", "likely", "high"))


# ----------------------------------------------------------------- properties (one group of GPUs)

lengths = st.lists(st.floats(60, 8 * HOUR), max_size=30)
holders = st.lists(st.tuples(st.integers(1, 2), st.floats(0, 4 * HOUR), st.none() | st.floats(0, 6 * HOUR)),
                   max_size=5)
aheads = st.lists(st.integers(1, 2), max_size=3)


def state(held, ahead_counts, free=0, ask_count=1):
    """now = 4 hours; each holder ran ``ran`` seconds and ends by ``latest`` seconds from now, if given."""
    now = 4 * HOUR
    rows = [Holder(f"u{i}/", count, now - ran, GROUP, f"u{i}", "p", None if lat is None else now + lat, "job")
            for i, (count, ran, lat) in enumerate(held)]
    ahead = [Ask(f"w{i}/", count, f"w{i}", "p") for i, count in enumerate(ahead_counts)]
    return Ask("me/", ask_count, "me", "p"), now, {GROUP: free}, rows, ahead


@settings(max_examples=60, deadline=None)
@given(lengths, holders, aheads, st.integers(0, 2), st.integers(1, 2))
def test_the_interval_holds_the_likely_start_its_median_scenario_and_the_same_state_gives_the_same_estimate(
        history, held, ahead_counts, free, count):
    ask, now, free_gpus, rows, ahead = state(held, ahead_counts, free, count)
    est = estimate(ask, now, free_gpus, rows, ahead, History(("p", "x", s) for s in history))
    assert later(est.low) <= later(est.likely) <= later(est.high)
    assert len(est.starts) == SAMPLES and list(est.starts) == sorted(est.starts)
    assert later(est.likely) == est.starts[SAMPLES // 2 - 1]  # the replay's calibrated reference draws on them
    assert est.likely is None or est.low >= now
    assert est == estimate(ask, now, free_gpus, rows, ahead, History(("p", "x", s) for s in history))
    assert "no estimate" not in est.sentence(now).lower()


@settings(max_examples=60, deadline=None)
@given(lengths, holders, aheads, st.integers(1, 2), st.integers(1, 2))
def test_one_more_request_ahead_never_makes_it_earlier(history, held, ahead_counts, extra, count):
    h = History(("p", "x", s) for s in history)
    ask, now, free, rows, ahead = state(held, ahead_counts, 0, count)
    before = estimate(ask, now, free, rows, ahead, h)
    for at in range(len(ahead) + 1):  # wherever it joins ahead
        more = [*ahead[:at], Ask("new/", extra, "new", "p"), *ahead[at:]]
        assert no_earlier(estimate(ask, now, free, rows, more, h), before)


@settings(max_examples=60, deadline=None)
@given(lengths, holders, aheads, st.integers(1, 2), st.floats(0, 4 * HOUR), st.integers(1, 2))
def test_one_more_holder_of_a_free_gpu_never_makes_it_earlier(history, held, ahead_counts, free, ran, count):
    h = History(("p", "x", s) for s in history)
    ask, now, free_gpus, rows, ahead = state(held, ahead_counts, free, count)
    before = estimate(ask, now, free_gpus, rows, ahead, h)
    took = Holder("new/", 1, now - ran, GROUP, "new", "p")
    after = estimate(ask, now, {GROUP: free - 1}, [*rows, took], ahead, h)
    assert no_earlier(after, before)


@settings(max_examples=60, deadline=None)
@given(lengths, st.integers(1, 4), st.floats(0, 4 * HOUR), st.floats(-HOUR, 6 * HOUR), st.integers(1, 4))
def test_the_only_holders_latest_end_bounds_the_estimate(history, held, ran, latest, count):
    now = 4 * HOUR
    only = Holder("u/", held, now - ran, GROUP, "u", "p", now + latest, "idle")
    est = estimate(Ask("me/", min(count, held)), now, {GROUP: 0}, [only], [], History(("p", "x", s) for s in history))
    assert est.high is not None and est.high <= max(now, now + latest)


def test_a_holders_latest_end_is_its_time_limit_or_the_idle_culler_whichever_is_first():
    assert latest_end(100.0) == (None, "")
    assert latest_end(100.0, limit=HOUR) == (100 + HOUR, "job")
    assert latest_end(100.0, limit=HOUR, limit_kind="walltime", idle_since=600.0, idle_timeout=480.0) == (
        1080.0, "idle")
    assert latest_end(100.0, limit=600.0, idle_since=600.0, idle_timeout=480.0) == (700.0, "job")


# ----------------------------------------------------------------- the history

def test_a_holder_is_judged_by_the_sessions_longer_than_it_has_run():
    # half the hub's sessions last 10 minutes, half 2 hours: a session that has run 20 minutes is
    # one of the long ones, so it ends about 2 hours after its start, not at a median of the two
    history = History([("p", "x", 600.0)] * 10 + [("p", "x", 2 * HOUR)] * 10)
    fresh = Holder("u/", 1, 0.0, GROUP, "u", "p")
    running = Holder("u/", 1, -1200.0, GROUP, "u", "p")
    est = estimate(Ask("me/", 1), 0.0, {}, [running], [], history)
    assert (est.low, est.likely, est.high) == (2 * HOUR - 1200,) * 3
    short = estimate(Ask("me/", 1), 0.0, {}, [fresh], [], history)
    assert (short.low, short.high) == (600.0, 2 * HOUR)


def test_the_requests_ahead_start_first_and_hold_their_gpus_for_their_own_length():
    # 2 GPUs held until 1 hour; a request for both is ahead of mine, and sessions last an hour:
    # it takes them at 1 hour and gives them back at 2
    history = History([("p", "x", HOUR)] * 10)
    est = estimate(Ask("me/", 1), 0.0, {GROUP: 0}, [Holder("cy/", 2, 0.0, GROUP, "cy", "p")],
                   [Ask("ann/", 2, "ann", "p")], history)
    assert (est.low, est.likely, est.high) == (2 * HOUR,) * 3
    # unless it gives up first (the queue's limit, at 30 minutes): then at 1 hour
    gives_up = [Ask("ann/", 2, "ann", "p", gives_up=HOUR / 2)]
    est = estimate(Ask("me/", 1), 0.0, {GROUP: 0}, [Holder("cy/", 2, 0.0, GROUP, "cy", "p")], gives_up, history)
    assert est.likely == HOUR


def test_the_history_falls_back_from_user_to_profile_to_hub():
    rows = [("gpu", "ann", 60.0)] * 10 + [("gpu", "bob", 120.0)] * 3 + [("cpu", "cy", 240.0)] * 2
    history = History(rows)
    assert history.lengths("gpu", "ann", 0)[2] == "mine"
    assert history.lengths("gpu", "bob", 0)[2] == "profile"  # 3 of his own are too few
    assert history.lengths("gpu", "ann", 90)[2] == "hub"  # of this profile, only bob's 3 ran longer
    assert history.lengths("cpu", "cy", 300)[2] == ""  # nothing recorded ran that long


# ----------------------------------------------------------------- the sentences

def test_with_no_history_it_says_so_and_gives_the_time_limit_it_knows():
    job = Holder("dee/job/7f3e", 2, 0.0, GROUP, "dee", "p", 2 * HOUR, "job")
    est = estimate(Ask("me/", 1), 0.0, {GROUP: 0}, [job], [], History([]))
    assert (est.low, est.likely, est.high) == (2 * HOUR,) * 3
    assert est.sentence(0.0) == (
        "About 02:00 UTC. No session has ended on this hub yet, so nothing tells how long sessions last; "
        "every holder must give its GPUs back by a known time, the first by 02:00 UTC (a notebook job's time "
        "limit).")


def test_with_nothing_known_it_gives_no_time_and_says_why():
    server = Holder("cy/", 2, 0.0, GROUP, "cy", "p")
    est = estimate(Ask("me/", 1), 0.0, {GROUP: 0}, [server], [Ask("ann/", 1)], History([]))
    assert (est.low, est.likely, est.high) == (None, None, None)
    assert est.sentence(0.0) == (
        "No start time can be given yet. No session has ended on this hub yet, so nothing tells how long "
        "sessions last; 1 request ahead of yours; no holder of these GPUs has a time limit.")


def test_with_history_it_says_what_it_went_by_and_the_interval():
    history = History([("p", "cy", float(m * 60)) for m in range(30, 150, 4)])  # 30 of cy's own: 30..146 min
    est = estimate(Ask("me/", 1), 0.0, {GROUP: 0}, [Holder("cy/", 1, 0.0, GROUP, "cy", "p")], [], history)
    assert 1800 <= est.low < est.likely < est.high <= 146 * 60
    assert est.when(0.0).startswith("About 01:") and ", likely between 00:" in est.when(0.0)
    assert est.basis == (
        "Going by the 30 sessions recorded on this hub (each holder judged by its user's own sessions of its "
        "profile), given how long each holder has run; no holder of these GPUs has a time limit")
    idle = Holder("eve/", 1, -HOUR, GROUP, "eve", "p", 1800.0, "idle")
    two = estimate(Ask("me/", 2), 0.0, {GROUP: 0}, [Holder("cy/", 1, 0.0, GROUP, "cy", "p"), idle],
                   [Ask("ann/", 1), Ask("bob/", 1)], History([]))
    assert two.likely is None and two.basis.endswith(
        "; 2 requests ahead of yours; 1 of the 2 holders must give their GPUs back by a known time, the first by "
        "00:30 UTC (the idle culler stops GPUs left idle)")
    beyond = estimate(Ask("me/", 1), 10 * HOUR, {}, [Holder("cy/", 1, 0.0, GROUP, "cy", "p")], [], history)
    assert (beyond.likely, beyond.when(10 * HOUR)) == (None, "No start time can be given yet")
    assert beyond.basis == ("No session recorded lasted as long as 1 of the holders have already run; no holder "
                            "of these GPUs has a time limit")


# ----------------------------------------------------------------- from the inventory, as the queue calls it

def gpus() -> tuple[GPU, ...]:
    return tuple(GPU(host, i, f"{host}-{i}", name) for host, name in (("a", A100), ("t", T4)) for i in range(2))


def test_a_request_ahead_waits_for_its_own_model_and_the_one_behind_waits_for_it():
    # both A100s held until 1 hour; the T4s are free, but an A100 request is ahead of mine (any
    # model): the queue serves it first, so mine starts when an A100 frees, not at once
    history = History([("p", "x", HOUR)] * 10)
    holders = {"a-0": "cy/", "a-1": "cy/"}
    holdings = {"cy/": Holding(0.0, "cy", "p")}
    ahead = [Ask("ann/", 1, "ann", "p", models=("a100",))]
    est = for_gpus(Ask("me/", 1, "me", "p"), 0.0, gpus(), holders, holdings, ahead, history)
    assert (est.low, est.likely, est.high) == (HOUR, HOUR, HOUR)
    alone = for_gpus(Ask("me/", 1, "me", "p", models=("t4",)), 0.0, gpus(), holders, holdings, [], history)
    assert alone.likely == 0.0


def test_a_user_at_the_quota_waits_for_their_own_gpus_elsewhere():
    history = History([("p", "x", HOUR)] * 10)
    holders = {"a-0": "me/a", "a-1": "me/a"}  # mine, on the A100s; the T4s are free
    holdings = {"me/a": Holding(-HOUR / 2, "me", "p")}
    ask = Ask("me/b", 1, "me", "p", models=("t4",))
    assert for_gpus(ask, 0.0, gpus(), holders, holdings, [], history, quota=2).likely == HOUR / 2
    assert for_gpus(ask, 0.0, gpus(), holders, holdings, [], history, quota=3).likely == 0.0


# ----------------------------------------------------------------- only the ends that can matter

@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.floats(0, 4 * HOUR), st.none() | st.floats(0, 6 * HOUR),
                          st.integers(0, 2)), min_size=40, max_size=80),
       st.lists(st.integers(1, 3), max_size=4), st.integers(1, 3), lengths)
def test_simulating_only_the_ends_that_can_matter_gives_the_same_estimate_as_simulating_all(
        held, ahead_counts, count, history):
    import gpuspawner.estimate as module

    now = 4 * HOUR
    rows = [Holder(f"u{i}/", n, now - ran, f"node{g}/{A100}", f"u{i % 7}", "p", None if lat is None else now + lat,
                   "job") for i, (n, ran, lat, g) in enumerate(held)]
    ahead = [Ask(f"w{i}/", n, f"w{i}", "p") for i, n in enumerate(ahead_counts)]
    h = History(("p", f"u{i % 7}", s) for i, s in enumerate(history))
    ask = Ask("me/", count, "me", "p")
    saved = module._AHEAD, module._SPARE

    def with_horizon(spare_ahead: int, spare: int):
        module._AHEAD, module._SPARE = spare_ahead, spare
        try:
            return estimate(ask, now, {}, rows, ahead, h)
        finally:
            module._AHEAD, module._SPARE = saved

    whole = with_horizon(0, 10**9)  # every scenario with every holder
    assert with_horizon(*saved) == whole
    assert with_horizon(0, 1) == whole  # a horizon most scenarios pass: those run again whole
