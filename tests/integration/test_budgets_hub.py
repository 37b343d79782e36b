"""GPU-hour budgets on a real hub (gpu-local, 2 simulated A100s and 2 T4s): what a user and an admin see.

The hub's usage records are made here (rows of ``gpuspawner_allocations`` in the hub's own
database, as the recorder writes them), so every figure the hub shows can be checked against
them: alice has spent her rolling 7-day budget of 10 T4-hours (2 A100-hours at 4 each, 2
T4-hours), bob has used 3 of his.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from datetime import datetime

import pytest
import requests

from hub import login, xsrf_token
from ops_hub import OpsHub
from test_ops_overview import user_token, wait_for

pytestmark = pytest.mark.integration

H = 3600.0
PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "One GPU", "gpu_models": ["any"], "gpu_counts": [1], "default": True},
    {"slug": "gpu-queued", "display_name": "One GPU, queued", "gpu_models": ["a100"], "gpu_counts": [1],
     "queue": True},
]
BUDGETS = {"gpu_budget_per_user": 10, "gpu_budget_rolling": True, "gpu_budget_period": "week",
           "gpu_budget_weights": {"a100*": 4}, "gpu_budget_unit": "T4-hours", "gpu_queue_timeout": 120,
           "gpu_queue_recheck": 1}


def add_row(hub: OpsHub, user: str, started: float, ended: float | None, count: int, model: str) -> None:
    """One allocation as the usage recorder writes it (the table exists once the hub is up)."""
    with sqlite3.connect(hub.dir / "hub.sqlite", timeout=30) as db:
        db.execute("INSERT INTO gpuspawner_allocations (owner, user, kind, groups, gpu_count, model, host, gpus, "
                   "started, ended, end_reason, busy_seconds, idle_seconds) VALUES (?, ?, 'server', '[]', ?, ?, "
                   "'localhost', '[]', ?, ?, ?, 0, 0)",
                   (f"{user}/old", user, count, model, started, ended, "stopped" if ended else None))


def rows_of(hub: OpsHub, user: str) -> int:
    with sqlite3.connect(hub.dir / "hub.sqlite", timeout=30) as db:
        return db.execute("SELECT COUNT(*) FROM gpuspawner_allocations WHERE user = ?", (user,)).fetchone()[0]


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def budget_hub(tmp_path_factory, fakenvml_libdir):
    hub = OpsHub(tmp_path_factory.mktemp("budgets"), fakenvml_libdir, PROFILES, mixin=BUDGETS)
    hub.start()
    hub.add_users("alice", "bob", "boss")
    assert wait_for(lambda: hub.dir.joinpath("hub.sqlite").exists() and _has_table(hub))
    now = time.time()
    add_row(hub, "alice", now - 3 * H, now - 1 * H, 1, "a100-sxm4-80gb")  # 2 h x 4 = 8
    add_row(hub, "alice", now - 2 * H, now - 1 * H, 2, "t4")  # 2 x 1 h = 2: 10 of 10, spent
    add_row(hub, "bob", now - 4 * H, now - 1 * H, 1, "t4")  # 3 of 10
    hub.rows_made_at = now
    try:
        yield hub
    finally:
        for name in ("alice", "bob"):
            for sname in hub.user(name)["servers"]:
                hub.api("DELETE", f"/users/{name}/servers/{sname}" if sname else f"/users/{name}/server")
        hub.close()


def _has_table(hub: OpsHub) -> bool:
    with sqlite3.connect(hub.dir / "hub.sqlite", timeout=30) as db:
        return bool(db.execute("SELECT name FROM sqlite_master WHERE name = 'gpuspawner_allocations'").fetchone())


def test_a_spent_budget_refuses_gpus_with_422_and_a_sentence_and_cpu_still_starts(budget_hub):
    hub = budget_hub
    before = rows_of(hub, "alice")
    r = hub.spawn("alice", {"profile": "gpu"})
    assert r.status_code == 422 and r.reason == "compute-quota-exceeded", r.text
    body = r.json()
    assert body["error"] == "compute-quota-exceeded"
    assert (body["used"], body["limit"], body["left"], body["unit"]) == (10, 10, 0, "T4-hours")
    assert (body["period"], body["rolling"], body["scope"]) == ("week", True, {"user": "alice"})
    # the oldest use (3 h ago, 4 T4-hours an hour) leaves the 7-day window first: then less than 10 is counted
    assert abs(epoch(body["reset"]) - (hub.rows_made_at - 3 * H + 7 * 24 * H)) < 120
    assert body["message"].startswith("Your GPU budget is spent: you have used 10 of 10 T4-hours in the last 7 days.")
    assert "GPU profiles open again at " in body["message"] and "CPU-only profiles still start" in body["message"]
    # nothing held, nothing recorded, no server kept
    holders = [g["holder"] for g in hub.overview().json()["gpus"] if g["holder"]]
    assert holders == [] and rows_of(hub, "alice") == before and hub.user("alice")["servers"] == {}
    # a notebook GPU job is refused the same way, before anything is looked at
    job = hub.api("POST", "/users/alice/gpu-jobs", json={"profile": "gpu", "notebook": "any.ipynb"})
    assert job.status_code == 422 and job.json()["error"] == "compute-quota-exceeded", job.text
    # CPU-only still starts
    r = hub.spawn("alice", {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice")
    hub.stop_server("alice")


def test_the_form_shows_what_is_left_and_each_choice_s_cost(budget_hub):
    hub = budget_hub
    bob = login(hub, "bob").get(hub.url + "/hub/spawn", timeout=60).text
    assert "7 of 10 T4-hours left in the last 7 days" in bob
    costs = re.search(r'<div class="gs-note gs-cost">([^<]*)</div>', bob).group(1)
    assert costs == "Cost per GPU per hour held, in T4-hours: NVIDIA A100-SXM4-80GB 4, Tesla T4 1"
    web = login(hub, "alice")
    alice = web.get(hub.url + "/hub/spawn", timeout=60).text
    assert "0 of 10 T4-hours left in the last 7 days" in alice and "Your GPU budget is spent" in alice
    # submitting a GPU choice anyway: the form again, with the refusal's sentence; nothing started
    r = web.post(hub.url + "/hub/spawn", timeout=60, data={"_xsrf": xsrf_token(alice), "profile": "gpu",
                                                           "gpus-gpu": "1", "gpu_model-gpu": "t4"})
    assert "you have used 10 of 10 T4-hours in the last 7 days" in r.text and 'name="profile"' in r.text
    assert hub.user("alice")["servers"] == {}


def test_budgets_api_usage_page_and_prometheus_agree_with_the_records(budget_hub):
    hub = budget_hub
    url = hub.url + "/hub/api/gpus/budgets"
    reader = {"Authorization": f"token {hub.reader_token}"}
    everyone = requests.get(url, headers=reader, timeout=60).json()
    by_user = {u["user"]: u for u in everyone["users"]}
    assert set(by_user) >= {"alice", "bob", "boss"} and everyone["unit"] == "T4-hours"
    assert (by_user["alice"]["left"], by_user["alice"]["exhausted"]) == (0, True)
    assert by_user["bob"]["budgets"][0]["used"] == pytest.approx(3, abs=0.01)
    assert by_user["boss"]["left"] == 10
    # a user reads their own only
    web = login(hub, "bob")
    auth = {"Authorization": f"token {user_token(hub, web, 'bob')}"}
    own = requests.get(url, headers=auth, timeout=60).json()
    assert [u["user"] for u in own["users"]] == ["bob"] and own["users"][0]["summary"].startswith("7 of 10")
    assert requests.get(url, params={"user": "alice"}, headers=auth, timeout=60).status_code == 403
    # the user's own usage page shows it
    page = web.get(hub.url + "/hub/gpus/usage", timeout=60).text
    assert "7 of 10 T4-hours left in the last 7 days" in page
    # Prometheus: what each user has left, as last computed
    metrics = requests.get(hub.url + "/hub/metrics", headers=reader, timeout=60).text
    found = dict(re.findall(r'^gpuspawner_budget_left\{user="([^"]+)"\} (\S+)$', metrics, re.M))
    assert float(found["alice"]) == 0 and float(found["bob"]) == pytest.approx(7, abs=0.01)


def test_queue_last_puts_a_spent_user_behind_everyone_with_budget_left(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, mixin={**BUDGETS, "gpu_budget_exhausted": "queue-last"})
    hub.start()
    try:
        hub.add_users("alice", "bob", "carol")
        assert wait_for(lambda: _has_table(hub))
        now = time.time()
        add_row(hub, "alice", now - 3 * H, now - H, 1, "a100-sxm4-80gb")
        add_row(hub, "alice", now - 2 * H, now - H, 2, "t4")
        # carol holds both A100s
        for server in ("one", "two"):
            r = hub.api("POST", f"/users/carol/servers/{server}", data=json.dumps({"profile": "gpu-queued"}))
            assert r.status_code in (201, 202), r.text
        assert wait_for(lambda: all(s.get("ready") for s in hub.user("carol")["servers"].values())
                        and len(hub.user("carol")["servers"]) == 2, timeout=120)
        # alice (spent) asks first, bob (budget left) after her
        assert hub.spawn("alice", {"profile": "gpu-queued"}).status_code == 202
        assert wait_for(lambda: "" in hub.user("alice")["servers"])
        assert hub.spawn("bob", {"profile": "gpu-queued"}).status_code == 202
        assert wait_for(lambda: "" in hub.user("bob")["servers"])
        hub.api("DELETE", "/users/carol/servers/one")  # one A100 comes free: bob's, though alice came first
        assert wait_for(lambda: (hub.user("bob")["servers"].get("") or {}).get("ready"), timeout=120), hub.log()
        assert not (hub.user("alice")["servers"].get("") or {}).get("ready")
        holders = {g["holder"]["user"] for g in hub.overview().json()["gpus"] if g["holder"]}
        assert holders == {"bob", "carol"}
    finally:
        for name in ("alice", "bob", "carol"):
            for sname in hub.user(name)["servers"]:
                hub.api("DELETE", f"/users/{name}/servers/{sname}" if sname else f"/users/{name}/server")
        hub.close()
