"""GPU usage accounting on a real hub: each allocation's record, its end reason and durations.

The servers' utilisation is scripted on the stand-in NVML library; the GPU idle
culler (a managed service of the hub) reads it from the servers' monitors and
reports it to the hub. The records are read back through ``/hub/api/gpus/usage``
as an admin tool would, and the hub's database is never read directly.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import time
from datetime import datetime

import pytest
import requests

from hub import login, pid_alive
from ops_hub import OpsHub
from test_local_hub import start
from test_ops_overview import user_token, wait_for

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2],
             "default_gpus": 1, "default": True}]
ONE_GPU = {"profile": "gpu", "gpus": 1, "gpu_model": "any"}
CULLER = {"period": 2, "threshold": 10, "idle_timeout": 12, "warn_before": 4}


def epoch(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def allocations(hub: OpsHub, **params) -> list[dict]:
    r = requests.get(hub.url + "/hub/api/gpus/usage", params={"by": "allocation", **params}, timeout=30,
                     headers={"Authorization": f"token {hub.reader_token}"})
    assert r.status_code == 200, r.text
    return r.json()["rows"]


def record(hub: OpsHub, owner: str, ended: bool = True) -> dict | None:
    rows = [r for r in allocations(hub) if r["owner"] == owner and (r["ended"] is not None) == ended]
    return rows[-1] if rows else None


@pytest.fixture
def culled_hub(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, culler=CULLER, groups={"vision": ["alice"]},
                 server_args=["--GPUMonitor.interval=0.5"])
    hub.start()
    try:
        yield hub
    finally:
        hub.close()


def test_stopped_culled_and_failed_records_with_busy_and_idle_time(culled_hub):
    hub = culled_hub
    hub.add_users("alice", "bob", "crash")
    before = time.time()
    alice = start(hub, "alice", ONE_GPU)
    bob = start(hub, "bob", ONE_GPU)
    hub.set_utilization({**dict.fromkeys(alice, 80), **dict.fromkeys(bob, 1)})
    scripted = time.time()  # before this, every GPU reads 0 %: idle

    # bob's idle GPU is culled; the record says so, and its time was idle, none busy
    assert wait_for(lambda: not hub.user("bob")["servers"], timeout=120), hub.log()
    bob_record = wait_for(lambda: record(hub, "bob/"), timeout=30)
    assert bob_record, allocations(hub)
    assert bob_record["end_reason"] == "culled"
    assert bob_record["uuids"] == sorted(bob) and bob_record["gpu_count"] == 1 and bob_record["kind"] == "server"
    assert bob_record["model"] in ("a100-sxm4-80gb", "t4") and bob_record["host"]
    assert bob_record["idle_gpu_hours"] * 3600 >= CULLER["idle_timeout"] - 2 * CULLER["period"]
    assert bob_record["busy_gpu_hours"] == 0
    held = epoch(bob_record["ended"]) - epoch(bob_record["started"])
    assert before - 1 <= epoch(bob_record["started"]) and held >= CULLER["idle_timeout"]
    assert abs(bob_record["gpu_hours"] * 3600 - held) <= 2  # rounding of the ISO times

    # alice's busy server is still held: an open record, counted as busy so far
    time.sleep(2 * CULLER["period"])
    alice_open = record(hub, "alice/", ended=False)
    assert alice_open and alice_open["end_reason"] is None and alice_open["groups"] == ["vision"]
    assert alice_open["busy_gpu_hours"] * 3600 >= 2 * CULLER["period"]
    assert alice_open["idle_gpu_hours"] * 3600 <= scripted - epoch(alice_open["started"]) + 2

    hub.stop_server("alice")
    alice_record = record(hub, "alice/")
    assert alice_record["end_reason"] == "stopped" and alice_record["started"] == alice_open["started"]

    # a server whose process dies at start: its GPUs were held for the attempt, which failed
    r = hub.spawn("crash", ONE_GPU)
    assert r.status_code in (201, 202, 500), r.text
    crash_record = wait_for(lambda: record(hub, "crash/"), timeout=90)
    assert crash_record and crash_record["end_reason"] == "failed", allocations(hub)

    # per group: alice's time counts for "vision", bob's for no group
    r = requests.get(hub.url + "/hub/api/gpus/usage", params={"by": "group"}, timeout=30,
                     headers={"Authorization": f"token {hub.reader_token}"})
    groups = {row["key"]: row for row in r.json()["rows"]}
    assert set(groups) == {"vision", "(no group)"}
    assert groups["vision"]["busy_gpu_hours"] > 0 and groups["(no group)"]["idle_gpu_hours"] > 0
    assert r.json()["top_idle"][0]["owner"] == "bob/"

    # Prometheus: GPU-seconds per user, busy and idle
    metrics = requests.get(hub.url + "/hub/metrics", timeout=30,
                           headers={"Authorization": f"token {hub.reader_token}"}).text
    assert 'gpuspawner_gpu_seconds_total{state="idle",user="bob"}' in metrics
    assert 'gpuspawner_gpu_seconds_total{state="busy",user="alice"}' in metrics


def test_usage_api_access_parameters_and_csv(culled_hub):
    hub = culled_hub
    hub.add_users("alice", "boss")
    start(hub, "alice", ONE_GPU)
    hub.stop_server("alice")
    url = hub.url + "/hub/api/gpus/usage"

    # a user without the scope reads her own usage only (test_finding_things.py), and cannot report
    alice_web = login(hub, "alice")
    alice_token = user_token(hub, alice_web, "alice")
    auth = {"Authorization": f"token {alice_token}"}
    assert requests.get(url, params={"user": "boss"}, headers=auth, timeout=30).status_code == 403
    report = requests.post(url + "/report", json={"owner": "alice/", "end_reason": "culled"}, headers=auth, timeout=30)
    assert report.status_code == 403
    # the reader service has custom:gpus:read only: reads, cannot report
    reader = {"Authorization": f"token {hub.reader_token}"}
    assert requests.post(url + "/report", json={"owner": "alice/"}, headers=reader, timeout=30).status_code == 403
    # an admin reads the page (through admin-ui)
    boss = login(hub, "boss")
    page = boss.get(hub.url + "/hub/gpus/usage", timeout=30)
    assert page.status_code == 200 and "Per user" in page.text and "<svg" in page.text and "alice" in page.text

    for params, words in [({"by": "owner"}, "by='owner': use one of user, group, model, server, allocation"),
                          ({"since": "yesterday"}, "since='yesterday'"),
                          ({"since": "2026-11-02", "until": "2026-11-01"}, "must be before"),
                          ({"format": "xml"}, "format='xml'")]:
        r = requests.get(url, params=params, headers=reader, timeout=30)
        assert r.status_code == 400 and words in r.json()["message"], (params, r.text)

    # a period before anything was held: nothing
    r = requests.get(url, params={"since": "2001-01-01", "until": "2001-01-02"}, headers=reader, timeout=30)
    assert r.json()["rows"] == [] and r.json()["total"]["gpu_hours"] == 0

    for by in ("user", "allocation"):
        r = requests.get(url, params={"format": "csv", "by": by}, headers=reader, timeout=30)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert len(rows) == 1 and float(rows[0]["gpu_hours"]) > 0
        if by == "allocation":
            assert rows[0]["owner"] == "alice/" and rows[0]["end_reason"] == "stopped" and rows[0]["uuids"]
        else:
            assert rows[0]["key"] == "alice" and rows[0]["allocations"] == "1"


def test_hub_killed_server_gone_is_crashed_survivor_keeps_its_record(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES)
    hub.start()
    try:
        hub.add_users("carol", "dave")
        start(hub, "carol", ONE_GPU)
        start(hub, "dave", ONE_GPU)
        carol_pid = hub.user("carol")["servers"][""]["state"]["pid"]
        dave_open = record(hub, "dave/", ended=False)
        carol_open = record(hub, "carol/", ended=False)
        assert dave_open and carol_open

        hub.stop(signal.SIGKILL)  # no cleanup at all
        os.kill(carol_pid, signal.SIGKILL)  # carol's server dies while the hub is down
        assert wait_for(lambda: not pid_alive(carol_pid), timeout=30)
        time.sleep(1)
        hub.start()

        carol = wait_for(lambda: record(hub, "carol/"), timeout=60)
        assert carol and carol["end_reason"] == "crashed", allocations(hub)
        assert carol["started"] == carol_open["started"]
        assert [r["owner"] for r in allocations(hub)].count("carol/") == 1
        # dave's server was adopted: the same record, still open, then stopped
        assert record(hub, "dave/", ended=False)["started"] == dave_open["started"]
        hub.stop_server("dave")
        dave = record(hub, "dave/")
        assert dave["end_reason"] == "stopped" and dave["id"] == dave_open["id"]
        assert dave["started"] == dave_open["started"]
    finally:
        hub.close()
