"""The replay on a small fixed trace whose outcome is worked out by hand (2 x T4 on one host, 2 hours)."""

from __future__ import annotations

import pytest

from gpuspawner.estimate import Estimate, History
from gpuspawner.replay import Policy, Session, TraceParams, choices, gpus, main, offered_load, replay, synthetic_trace
from gpuspawner.replay.estimates import calibrated, measure
from gpuspawner.replay.tail import describe, tail

CULLER = {"period": 60, "threshold": 5, "idle_timeout": 600, "warn_before": 300}


def trace() -> list[Session]:
    return [
        Session(0, "a", 0, 2, ("any",), [("active", 1800)]),  # both GPUs, busy 0..1800
        Session(1, "b", 600, 1, ("t4",), [("active", 1200)]),  # must wait for a's
        Session(2, "c", 900, 1, ("any",), [("active", 600)], stops=False),  # walks away, leaves it idle
    ]


def test_queue_and_gpu_culler():
    # a: 0..1800 (2 GPUs, busy). b and c queue; a's release serves b then c at 1800 (waits 1200 and 900 s).
    # b busy 1800..3000. c busy 1800..2400, then idle: the culler's first idle sample is at 2460,
    # it warns when 300 s idle (2760) and stops when 600 s idle and 300 s after the warning (3060).
    # Held 3600 + 1200 + 600 + 660 = 6060 GPU-s, 660 idle (10.9 %); busy 5400 of 2 x 7200 (37.5 %).
    r = replay([trace()], gpus("t4=2"), Policy("q", queue=True, gpu_culler=CULLER), hours=2)
    assert (r.held_idle_pct, r.utilisation_pct) == (10.9, 37.5)
    assert (r.median_wait_min, r.p95_wait_min, r.served) == (15.0, 20.0, 3)
    assert (r.refusals, r.gave_up, r.culled_warned, r.culled_unwarned, r.came_back) == (0, 0, 1, 0, 0)


def test_refusals_and_retries_without_queue():
    # b refused at 600 and 1200, placed at 1800 (a's release comes first); c refused at 900 and 1500,
    # placed at 2100 (retries every 10 minutes): waits 0, 1200, 1200. c busy 2100..2700, idle from the
    # sample at 2760, warned at 3060, stopped at 3360: 660 idle GPU-s again.
    r = replay([trace()], gpus("t4=2"), Policy("no queue", queue=False, gpu_culler=CULLER), hours=2)
    assert (r.refusals, r.gave_up, r.served) == (4, 0, 3)
    assert (r.median_wait_min, r.p95_wait_min) == (20.0, 20.0)
    assert (r.held_idle_pct, r.culled_warned) == (10.9, 1)


def test_kernel_culler_stops_without_warning():
    # as without a queue, but JupyterHub's idle culler: c's kernel was last active at 2700 (the round
    # at 2700 runs before its span ends), stopped at the round 600 s later (3300): 600 idle GPU-s.
    policy = Policy("jupyterhub", queue=False, gpu_culler=None, kernel_cull_after=600)
    r = replay([trace()], gpus("t4=2"), policy, hours=2)
    assert (r.culled_warned, r.culled_unwarned) == (0, 1)
    assert r.held_idle_pct == 10.0  # 600 / (3600 + 1200 + 600 + 600)


def test_a_culled_user_who_comes_back_asks_again():
    # d: busy 10 min, away 30 min, busy 10 min. The GPU culler (10 min) stops it during the break;
    # d comes back at 2400 and gets a GPU at once for the last 10 minutes.
    d = Session(0, "d", 0, 1, ("any",), [("active", 600), ("away", 1800), ("active", 600)])
    r = replay([[d]], gpus("t4=2"), Policy("q", queue=True, gpu_culler=CULLER), hours=1)
    assert (r.culled_warned, r.came_back, r.served, r.median_wait_min) == (1, 1, 2, 0.0)


def test_synthetic_trace_offers_the_load_asked():
    params = TraceParams(load=0.7, seed=3)
    sessions = synthetic_trace(params, 16)
    assert 0.7 <= offered_load(sessions, 16, 24) < 0.7 + max(s.count * s.planned for s in sessions) / (16 * 86400)
    assert sessions == synthetic_trace(params, 16), "the same seed gives the same trace"
    with pytest.raises(ValueError, match="use MODEL=COUNT"):
        gpus("h100=4")


def test_hosts_of_the_size_asked_and_one_gpu_requests_packed_so_a_two_gpu_request_finds_a_whole_host():
    assert [g.host for g in gpus("t4=5", per_host=2)] == ["t4-node1"] * 2 + ["t4-node2"] * 2 + ["t4-node3"]
    # a and b take one T4 each (b beside a: best fit), so c's 2 T4s at 600 find the other host empty.
    sessions = [Session(0, "a", 0, 1, ("t4",), [("active", 3600)]), Session(1, "b", 60, 1, ("t4",), [("active", 3600)]),
                Session(2, "c", 600, 2, ("t4",), [("active", 600)])]
    r = replay([sessions], gpus("t4=4", per_host=2), Policy("q", queue=True, gpu_culler=CULLER), hours=1)
    assert (r.served, r.p95_wait_min, r.refusals) == (3, 0.0, 0)


def test_a_request_that_leaves_the_queue_lets_the_next_one_place_at_once():
    # one of 2 T4s held by a all along; b asks for 2 at 60 and waits; c asks for 1 at 300, free, but
    # behind b. b's wait ends at 60 + 1200 (it gives up, no retries): leaving wakes the queue, as in
    # GPUQueue.leave, so c places then (waits 960 s), not at the next release or arrival (the queue's
    # backfill off: with it, c starts at once beside b, tests/unit/test_queue_backfill.py)
    sessions = [Session(0, "a", 0, 1, ("t4",), [("active", 7200)]),
                Session(1, "b", 60, 2, ("t4",), [("active", 600)]),
                Session(2, "c", 300, 1, ("t4",), [("active", 600)])]
    policy = Policy("q", queue=True, gpu_culler=None, queue_timeout=1200, retries=0, backfill="off")
    r = replay([sessions], gpus("t4=2"), policy, hours=2)
    assert (r.served, r.gave_up, r.median_wait_min, r.p95_wait_min) == (2, 1, 8.0, 16.0)


def test_the_estimate_at_enqueue_is_measured_against_the_real_start():
    # a holds both T4s from 0; every recorded session lasted 30 minutes, so b, asking at 600, is told
    # 1800 (a has run 10 minutes: only sessions longer than that count), and starts at 1800
    history = History([("server:any", "x", 1800.0)] * 10)
    result, figures = measure([trace()[:2]], gpus("t4=2"), Policy("q", queue=True, gpu_culler=CULLER), history,
                              load=0.5, hours=1)
    assert (figures.waited, figures.unserved, figures.median_error_min, figures.median_wait_min) == (1, 0, 0.0, 20.0)
    assert (figures.in_interval_pct, figures.within_goal_pct, figures.p95_wait_min) == (100.0, 100.0, 20.0)
    assert figures.held_idle_pct == result.held_idle_pct


def test_a_request_told_it_would_outwait_the_queues_limit_is_counted_as_foretold():
    # a holds both T4s for 2 hours and sessions here last 10: b, asking at 600, is told about 10 hours
    # later, past its 30-minute limit, which it then reaches
    a = Session(0, "a", 0, 2, ("any",), [("active", 7200)])
    b = Session(1, "b", 600, 1, ("t4",), [("active", 600)])
    history = History([("server:any", "x", 36000.0)] * 10)
    policy = Policy("q", queue=True, gpu_culler=CULLER, queue_timeout=1800, retries=0)
    _result, figures = measure([[a, b]], gpus("t4=2"), policy, history, load=0.5, hours=1)
    assert (figures.waited, figures.unserved, figures.foretold_pct) == (0, 1, 100.0)


def test_an_idle_holder_is_estimated_to_end_when_the_culler_stops_it():
    # a holds both T4s, busy 10 minutes, then walks away; sessions here last 10 hours, but the culler's
    # first idle sample is at 660 and it stops a at 660 + 600 (warned at 960): b, asking at 900, is told 1260
    a = Session(0, "a", 0, 2, ("any",), [("active", 600)], stops=False)
    b = Session(1, "b", 900, 1, ("t4",), [("active", 600)])
    history = History([("server:any", "x", 36000.0)] * 10)
    _result, figures = measure([[a, b]], gpus("t4=2"), Policy("q", queue=True, gpu_culler=CULLER), history,
                               load=0.5, hours=1)
    assert (figures.waited, figures.median_wait_min, figures.median_error_min, figures.in_interval_pct) == (
        1, 6.0, 0.0, 100.0)


def test_an_estimate_later_than_the_start_is_counted_late_and_the_calibrated_reference_is_its_own_world():
    # a holds both T4s, busy until it stops at 1800, but every recorded session lasted an hour: b, asking
    # at 600, is told 3600 in every scenario and starts at 1800: 30 minutes late on a 20-minute wait.
    # Were the world as the estimate says (b starts at 3600, within the 2-hour limit), it would be exact.
    a = Session(0, "a", 0, 2, ("any",), [("active", 1800)])
    b = Session(1, "b", 600, 1, ("t4",), [("active", 600)])
    history = History([("server:any", "x", 3600.0)] * 10)
    policy = Policy("q", queue=True, gpu_culler=CULLER, queue_timeout=7200)
    _result, figures = measure([[a, b]], gpus("t4=2"), policy, history, load=0.5, hours=2)
    assert (figures.waited, figures.median_error_min, figures.median_relative_pct) == (1, 30.0, 150.0)
    assert (figures.late, figures.early, figures.calibrated_pct) == (1, 0, 0.0)


def test_the_calibrated_reference_scores_each_scenario_start_within_the_limit():
    # joined at 100, told 700; scenarios start at 400, 700, 1000 and 3100 (past the 30-minute limit: not
    # served, not scored): errors 300 of a 300-second wait, 0, and 300 of 900: median 33.3 %.
    # An estimate with no likely start is not scored.
    told = Estimate(700.0, 400.0, 3100.0, "", starts=(400.0, 700.0, 1000.0, 3100.0))
    unknown = Estimate(None, None, None, "", starts=(float("inf"),) * 4)
    assert calibrated([(told, 100.0), (unknown, 100.0)], limit=1800) == 33.3


def test_the_replay_prints_the_estimate_figures(capsys):
    main(["--estimates", "--days", "1", "--estimate-loads", "0.85"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Wait estimates, policy gpuspawner, 16 GPUs, 1 day(s) per load: the estimator draws "
                             "on the history of seeds 1001-1001 and is measured on seeds 1-1: held out.")
    titles = ["median error min", "median wait min", "in interval %", "missed late", "missed early",
              "if calibrated: median error % of wait", "p95 wait min", "held-idle %", "culled, came back"]
    assert all(t in out[1] for t in titles)
    assert out[2].split()[0] == "86" and len(out) == 3  # offered load 86 % on that day


def test_the_tail_says_what_held_each_long_wait_up():
    # 8 T4s on two hosts of 4: a holds 3 on the first all along, b 3 on the second until 1200; c asks for 2
    # at 60 (one free on each host: too few on one host), reaches the queue's 10-minute limit at 660, asks
    # again at 1260 (between tries meanwhile) and starts then: 1200 s, half each
    sessions = [Session(0, "a", 0, 3, ("t4",), [("active", 7200)]),
                Session(1, "b", 10, 3, ("t4",), [("active", 1190)]),
                Session(2, "c", 60, 2, ("t4",), [("active", 600)])]
    policy = Policy("q", queue=True, gpu_culler=None, queue_timeout=600, retries=1)
    served, long = tail([sessions], gpus("t4=8"), policy, hours=1, over=600)
    assert served == 3 and [(w.owner, w.wait, w.tries) for w in long] == [("c/s2", 1200.0, 2)]
    assert dict(long[0].states) == {"free, too few on one host": 600.0, "between tries": 600.0}
    text = describe(served, long, "q", over=600).splitlines()
    assert text[0] == ("Who waits longest (q): 1 of 3 served requests waited over 10 minutes (33.3 %; 2 GPUs: 1); "
                       "0 of them were culled users who came back.")
    assert text[1] == ("While they waited, the GPUs they could use were: busy 0 %, held idle 0 %, free, kept 0 %, "
                       "free, too few on one host 50 %, between tries 50 %.")
    assert text[2] == "    20.0 min  2 x t4, 2 tries: free, too few on one host 50 %, between tries 50 %"


def test_the_replay_prints_the_tail(capsys):
    main(["--days", "1", "--timeouts", "8", "--tail"])
    out = capsys.readouterr().out
    assert "\nWho waits longest (gpuspawner): " in out and "\nWhile they waited, the GPUs they could use were: " in out


def test_a_user_told_a_long_wait_comes_back_at_the_estimate_and_the_move_is_counted():
    # a holds both T4s 0..3600 and sessions here last an hour: b, asking at 600 with 20 minutes' patience,
    # is told 3600 and comes back then instead of queueing; a's release comes first and b starts at once.
    # As is, b waits in the queue 600..3600. Asked -> started is 50 minutes either way.
    a = Session(0, "a", 0, 2, ("any",), [("active", 3600)])
    b = Session(1, "b", 600, 1, ("t4",), [("active", 600)])
    history = History([("server:any", "x", 3600.0)] * 10)
    policy = Policy("q", queue=True, gpu_culler=CULLER, queue_timeout=3600)
    plain, chose, _book = choices.measure([[a, b]], history, gpus("t4=2"), [policy], patience=1200, hours=2)
    assert (plain.policy, plain.p95_queued_min, plain.p95_asked_min, plain.later) == ("q", 50.0, 50.0, 0)
    assert (chose.policy, chose.p95_queued_min, chose.p95_asked_min, chose.later) == ("q, users choose", 0.0, 50.0, 1)
    assert (chose.other_model, chose.gave_up, chose.held_idle_pct) == (0, 0, plain.held_idle_pct)


def test_a_user_whose_request_allows_any_model_takes_the_one_told_sooner():
    # A100s all held by b, T4s 3 of 4 by a, both past every recorded session (1500 s): no end is known.
    # w, asking for an A100 at 600, is told 1500 and queues (its limit: 2 hours); u asks for any GPU at 1800:
    # behind w (strict order) it is told w's limit, 2 hours on, but a T4 alone now (w does not want T4s):
    # u takes a T4 at once. As is, u waits behind w past the hour replayed.
    sessions = [Session(0, "a", 0, 3, ("t4",), [("active", 7200)]),
                Session(1, "b", 0, 4, ("a100",), [("active", 7200)]),
                Session(2, "w", 600, 1, ("a100",), [("active", 600)]),
                Session(3, "u", 1800, 1, ("any",), [("active", 600)])]
    history = History([("server:a100", "x", 1500.0)] * 10 + [("server:t4", "x", 1500.0)] * 10)
    policy = Policy("q", queue=True, gpu_culler=CULLER, queue_timeout=7200)
    plain, chose, _book = choices.measure([sessions], history, gpus("a100=4,t4=4"), [policy], patience=1200, hours=1)
    assert (plain.other_model, plain.median_asked_min) == (0, 0.0)  # a and b only: w and u still wait
    assert (chose.other_model, chose.later, chose.p95_queued_min, chose.p95_asked_min) == (1, 0, 0.0, 0.0)


def test_the_replay_prints_what_users_choose(capsys):
    main(["--choices", "--days", "1", "--patience", "15"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Users choosing by the estimates: 16 GPUs, 1 day(s) (seeds 1-1), offered load ")
    assert "patience 15 minutes" in out[0]
    titles = ["held-idle %", "p95 wait, queued min", "p95 asked -> started min", "took another model",
              "came back at the estimate", "booked a window", "started at the window", "culled, came back"]
    assert all(t in out[1] for t in titles)
    assert [line.split("  ")[0] for line in out[2:]] == [
        "gpuspawner", "gpuspawner, users choose", "gpuspawner, users choose or book",
        "gpuspawner, backfill first-fit", "gpuspawner, backfill first-fit, users choose",
        "gpuspawner, backfill first-fit, users choose or book"]


def test_the_estimates_are_measured_under_the_backfill_rule_asked(capsys):
    main(["--estimates", "--days", "1", "--estimate-loads", "0.85", "--backfill", "first-fit"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Wait estimates, policy gpuspawner, backfill first-fit, 16 GPUs, 1 day(s) per load")


def test_a_user_told_a_long_wait_books_the_window_it_names_and_starts_there_at_once():
    # As in the test above, b is told 3600 for a T4; instead of coming back it books one T4 from 3600 for its
    # planned 10 minutes (the hub's check_new takes it), asks a minute into the window and is placed at once:
    # a gave its T4s back at 3600. Asked -> started 51 minutes; its wait in a queue, none.
    a = Session(0, "a", 0, 2, ("any",), [("active", 3600)])
    b = Session(1, "b", 600, 1, ("t4",), [("active", 600)])
    history = History([("server:any", "x", 3600.0)] * 10)
    policy = Policy("q", queue=True, gpu_culler=CULLER, queue_timeout=3600)
    *_, book = choices.measure([[a, b]], history, gpus("t4=2"), [policy], patience=1200, hours=2)
    assert (book.policy, book.booked, book.honoured, book.later) == ("q, users choose or book", 1, "1 of 1", 0)
    assert (book.p95_queued_min, book.p95_asked_min, book.gave_up) == (0.0, 51.0, 0)


def test_a_booking_does_not_move_a_holder_admitted_before_it_was_made():
    # a holds both T4s until 7200, past every recorded session: b books 3600-4200 (what it is told), but a was
    # admitted with no end before the booking existed and keeps them. b is refused at 3660; on its retry at 4260
    # the window is over, it queues and starts when a leaves at 7200: the booking was not honoured.
    a = Session(0, "a", 0, 2, ("any",), [("active", 7200)])
    b = Session(1, "b", 600, 1, ("t4",), [("active", 600)])
    history = History([("server:any", "x", 3600.0)] * 10)
    policy = Policy("q", queue=True, gpu_culler=CULLER, queue_timeout=3600)
    *_, book = choices.measure([[a, b]], history, gpus("t4=2"), [policy], patience=1200, hours=2)
    assert (book.booked, book.honoured, book.p95_asked_min) == (1, "0 of 1", 110.0)


def test_a_booked_window_its_user_no_longer_holds_gpus_in_is_released_after_the_grace_period():
    # b books T4s from 3600 to 6600 (its planned 50 minutes), starts at 3660, pauses at 4260 and is culled at 4920
    # (10 minutes idle, in 60 s samples): the hub releases the window then (past its 15 minutes' grace), and b,
    # back at 6060 for its last 10 minutes, finds it released and places as anyone does.
    a = Session(0, "a", 0, 2, ("any",), [("active", 3600)])
    b = Session(1, "b", 600, 1, ("t4",), [("active", 600), ("away", 1800), ("active", 600)])
    history = History([("server:any", "x", 3600.0)] * 10)
    policy = Policy("q", queue=True, gpu_culler=CULLER, queue_timeout=3600)
    run = choices._Booking([a, b], gpus("t4=2"), policy, 2, history, 1200).run()
    assert [(x.start, x.end, x.state, x.released_at) for x in run.bookings] == [(3600, 6600, "released", 4920)]
    assert (run.honoured, run.came_back, run.gave_up) == (1, 1, 0)
