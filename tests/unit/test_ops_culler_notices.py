"""The culler's idle bookkeeping and the notices' input checks (pure parts)."""

from __future__ import annotations

import json

import pytest
from tornado import web

from gpuspawner.hub.culler import IdleTracker, parse_args
from gpuspawner.hub.judging import highest_utilization, kernel_activity, start_key
from gpuspawner.monitor.notices import NoticeBoard, parse_notice


def tracker() -> IdleTracker:
    return IdleTracker(threshold=10, idle_timeout=60, warn_before=20)


def test_idle_server_is_warned_then_stopped_after_the_warning_time():
    t = tracker()
    assert t.observe("a/", [(0, 3), (30, 4)], now=30) == ("idle", 30)
    assert t.observe("a/", [(40, 2)], now=40) == ("warn", 40)
    t.warned("a/", 40)
    assert t.observe("a/", [(55, 2)], now=55) == ("idle", 55)
    assert t.observe("a/", [(61, 2)], now=61) == ("stop", 61)
    t2 = tracker()
    t2.observe("a/", [(0, 1)], now=0)
    t2.observe("a/", [(45, 1)], now=45)
    t2.warned("a/", 45)
    assert t2.observe("a/", [(60, 1)], now=60)[0] == "idle"  # 15 s after the warning: not yet
    assert t2.observe("a/", [(66, 1)], now=66)[0] == "stop"


def test_any_busy_sample_starts_over_and_forgets_the_warning():
    t = tracker()
    t.observe("a/", [(0, 1), (45, 1)], now=45)
    t.warned("a/", 45)
    assert t.observe("a/", [(50, 80)], now=50) == ("busy", 0.0)
    assert t.observe("a/", [(55, 1), (70, 1)], now=70) == ("idle", 15)


def test_kernel_activity_counts_as_use_once_and_only_when_given():
    t = tracker()
    assert t.observe("a/", [(0, 1), (20, 1), (45, 1)], now=45, activity=[10]) == ("idle", 25)  # idle after it
    assert t.observe("a/", [(50, 1)], now=50, activity=[10]) == ("idle", 30)  # seen: counts once
    t.warned("a/", 50)
    assert t.observe("a/", [(55, 1)], now=55, activity=[52]) == ("idle", 0)  # new activity: starts over
    assert t.observe("a/", [(60, 1), (70, 1)], now=70, activity=[52]) == ("idle", 15)
    assert t.observe("a/", [(100, 1)], now=100) == ("warn", 45)  # the earlier warning was forgotten: no stop
    assert t.observe("a/", [(110, 1)], now=110, activity=[110]) == ("busy", 0.0)  # active at the last sample
    busy = "2026-11-26T10:00:05.5Z"
    kernels = [{"execution_state": "busy", "last_activity": busy}, {"execution_state": "idle"}, "junk"]
    assert kernel_activity(kernels, now=1e9) == [1e9, 1795687205.5]
    assert kernel_activity({"message": "no"}, now=1.0) == []


def test_each_start_of_a_server_is_tracked_apart():
    t = tracker()
    first = start_key({"owner": "a/", "since": 100.0})
    second = start_key({"owner": "a/", "since": 130.5})
    assert first != second and first == start_key({"owner": "a/", "since": 100.0, "state": "running"})
    t.observe(first, [(100, 1), (145, 1)], now=145)
    t.warned(first, 145)
    assert t.observe(first, [(166, 1)], now=166)[0] == "stop"
    # the next start of the same server: its own idle time, and a warning before any stop
    assert t.observe(second, [(131, 1), (167, 1)], now=167) == ("idle", 36)
    assert t.observe(second, [(175, 1)], now=175) == ("warn", 44)
    t.forget_except({second})
    assert t.observe(first, [(180, 1)], now=180) == ("idle", 0)


def test_old_and_unknown_samples_are_ignored():
    t = tracker()
    t.observe("a/", [(10, 1)], now=10)
    assert t.observe("a/", [(5, 99), (10, 99)], now=11) == ("idle", 0)  # already seen
    assert t.observe("a/", [(20, None)], now=20) == ("idle", 0)  # unknown time is not idle time
    assert highest_utilization({"gpus": [{"utilization_gpu": None}, {"utilization_gpu": 7}]}) == 7
    assert highest_utilization({"gpus": []}) is None


def test_culler_arguments_are_checked():
    assert parse_args(["--period", "2", "--idle-timeout", "10", "--warn-before", "5"]).period == 2
    assert parse_args([]).kernel_activity == "off" and parse_args(["--kernel-activity", "on"]).kernel_activity == "on"
    for bad in (["--period", "0"], ["--idle-timeout", "10", "--warn-before", "10"], ["--threshold", "0"],
                ["--kernel-activity", "yes"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


@pytest.mark.parametrize("settings, error, named", [
    ({"kernel_activity": "yes"}, ValueError, "kernel_activity"),
    ({"period": "soon"}, SystemExit, "--period"),
    ({"idle_timeout": 60, "warn_before": 90}, SystemExit, "--warn-before"),
])
def test_bad_culler_settings_stop_the_hubs_start_naming_them(settings, error, named, capsys):
    from traitlets.config import Config

    from gpuspawner.hub.setup import configure

    with pytest.raises(error) as e:
        configure(Config(), culler=settings)
    assert named in str(e.value) + capsys.readouterr().err


def test_notices_replace_by_id_and_are_bounded():
    board = NoticeBoard(limit=3)
    board.post("one", notice_id="x")
    board.post("two", notice_id="x")
    assert [n["message"] for n in board.all()] == ["two"]
    for n in range(5):
        board.post(f"n{n}")
    assert len(board.all()) == 3 and board.all()[-1]["message"] == "n4"
    assert not board.remove("x") and board.remove(board.all()[0]["id"])


@pytest.mark.parametrize("body, field", [
    (b"{", "body"), (b"[]", "body"), (json.dumps({"message": ""}).encode(), "message"),
    (json.dumps({"message": "x" * 3000}).encode(), "message"),
    (json.dumps({"message": "m", "level": "panic"}).encode(), "level"),
    (json.dumps({"message": "m", "id": "../x"}).encode(), "id"),
    (json.dumps({"message": "m", "html": 1}).encode(), "unknown"),
])
def test_bad_notices_are_refused_naming_the_field(body, field):
    with pytest.raises(web.HTTPError) as e:
        parse_notice(body)
    assert e.value.status_code == 400 and field in e.value.log_message % e.value.args


def test_a_good_notice():
    assert parse_notice(b'{"message": " stop soon ", "level": "info", "id": "gpu-culler"}') == {
        "message": "stop soon", "level": "info", "notice_id": "gpu-culler", "source": ""}
