"""Quotas, group-only profiles and the GPU queue on a real hub with 4 simulated GPUs."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
import requests

from hub import login
from ops_hub import OpsHub

pytestmark = pytest.mark.integration

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook (queued)", "gpu_models": ["any"], "gpu_counts": [1],
     "default_gpus": 1, "default": True, "queue": True},
    {"slug": "big", "display_name": "Staff: 2 GPUs", "gpu_counts": [2], "default_gpus": 2, "groups": ["staff"]},
]
USERS = [f"u{n:02d}" for n in range(25)]
STUDENTS = USERS[:10]


@pytest.fixture
def ops_hub(tmp_path, fakenvml_libdir):
    hub = OpsHub(
        tmp_path, fakenvml_libdir, PROFILES,
        mixin={"gpu_quota_per_user": 1, "gpu_quota_per_group": {"students": 3},
               "gpu_queue_timeout": 300, "gpu_queue_recheck": 2},
        groups={"students": {"users": STUDENTS}, "staff": {"users": ["sam"]}},
    )
    hub.start()
    try:
        yield hub
    finally:
        stop_everything(hub)
        hub.close()


def servers(hub, name: str) -> dict:
    return hub.user(name)["servers"]


def stop_everything(hub) -> None:
    """DELETE every server (pending ones included) and remember every server pid for close()."""
    for name in hub.user_names():
        for sname, server in servers(hub, name).items():
            pid = (server.get("state") or {}).get("pid")
            if pid:
                hub.server_pids.add(pid)
            hub.api("DELETE", f"/users/{name}/servers/{sname}" if sname else f"/users/{name}/server")


def wait_for(predicate, timeout=120, interval=0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def overview(hub) -> dict:
    r = hub.overview()
    assert r.status_code == 200, r.text
    return r.json()


def check_invariants(data: dict) -> None:
    """No GPU held twice, no quota exceeded."""
    held = [g for g in data["gpus"] if g["holder"]]
    assert len({g["uuid"] for g in held}) == len(held)
    per_user: dict[str, int] = {}
    for g in held:
        per_user[g["holder"]["user"]] = per_user.get(g["holder"]["user"], 0) + 1
    assert all(n <= 1 for n in per_user.values()), per_user
    assert sum(n for u, n in per_user.items() if u in STUDENTS) <= 3


def outcome(hub, user: str, server: str, code: int, message: str) -> tuple[str, str]:
    """What became of one spawn request: ("accepted", "") or ("refused", the sentence).

    A 201 or 202 is not yet a decision: JupyterHub answers 202 when the spawn has not finished
    within its ``slow_spawn_timeout`` (10 s), and with 100 spawns at once on a loaded machine its
    own per-spawn database work can block its event loop for longer than that before gpuspawner
    is asked (seen: "Event loop was unresponsive for at least 13.63s", then 100 answers of 202,
    82 of them refused seconds later). Such a spawn's outcome is what its user then sees: the
    server running or queued, or the progress stream's "Spawn failed: <sentence>".
    """
    if code == 409:
        return "refused", message
    assert code in (201, 202), (user, server, code, message)
    if server in servers(hub, user):
        return "accepted", ""
    events = hub.api("GET", f"/users/{user}/servers/{server}/progress", stream=True)
    try:
        text = events.text
    finally:
        events.close()
    failed = [json.loads(line[len("data:"):]) for line in text.splitlines() if line.startswith("data:")]
    assert failed and failed[-1].get("failed"), (user, server, text)
    return "refused", failed[-1]["message"].removeprefix("Spawn failed: ")


def max_held_at_once(rows: list[dict], members: set[str] | None = None) -> dict[str, int]:
    """From the usage records: the most GPUs each user (or, with ``members``, the group) held at any moment."""
    events = []
    for row in rows:
        if members is not None and row["user"] not in members:
            continue
        who = "group" if members is not None else row["user"]
        started = datetime.fromisoformat(row["started"].replace("Z", "+00:00")).timestamp()
        events.append((started, 1, who, row["gpu_count"]))
        if row["ended"]:
            ended = datetime.fromisoformat(row["ended"].replace("Z", "+00:00")).timestamp()
            events.append((ended, 0, who, -row["gpu_count"]))  # at one instant, a release goes first
    held: dict[str, int] = {}
    most: dict[str, int] = {}
    for _at, _order, who, change in sorted(events):
        held[who] = held.get(who, 0) + change
        most[who] = max(most.get(who, 0), held[who])
    return most


def test_100_concurrent_requests_respect_quotas_and_queue_order(ops_hub):
    hub = ops_hub
    hub.add_users(*USERS)
    requests_ = [(u, f"s{k}") for k in range(4) for u in USERS]  # 100 named-server requests

    def ask(item):
        user, server = item
        r = hub.api("POST", f"/users/{user}/servers/{server}", data=json.dumps({"profile": "gpu"}))
        return user, server, r.status_code, (r.json().get("message", "") if r.status_code >= 400 else "")

    with ThreadPoolExecutor(max_workers=100) as pool:
        answers = list(pool.map(ask, requests_))
    undecided = {(u, s) for u, s, code, _ in answers if code == 202}

    def decided():  # every 202 spawn is running, queued, or gone (refused)
        data = overview(hub)
        placed = {(g["holder"]["user"], g["holder"]["server"]) for g in data["gpus"] if g["holder"]}
        placed |= {(q["user"], q["server"]) for q in data["queue"]}
        return all((u, s) in placed or s not in servers(hub, u) for u, s in undecided)

    assert wait_for(decided), overview(hub)
    outcomes = {(u, s): outcome(hub, u, s, code, m) for u, s, code, m in answers}
    accepted = sorted(k for k, (what, _) in outcomes.items() if what == "accepted")
    refused = [m for what, m in outcomes.values() if what == "refused"]
    user_quota = [m for m in refused if m.startswith("Your quota is 1 GPU")]
    group_quota = [m for m in refused if "The quota of group 'students' is 3 GPUs" in m]
    other = [m for m in refused if m not in user_quota and m not in group_quota]
    assert not other, other
    assert len(refused) == 82 and len(accepted) == 18, (len(refused), accepted)
    assert len({u for u, _ in accepted}) == 18  # one per user ...
    assert len({u for u, _ in accepted} & set(STUDENTS)) == 3  # ... and three students in all
    assert len(user_quota) >= 54 and group_quota

    # four run, fourteen wait in the queue, in fair order
    def settled():
        data = overview(hub)
        running = [g for g in data["gpus"] if g["holder"] and g["holder"]["state"] == "running"]
        return data if len(running) == 4 and len(data["queue"]) == 14 else None

    data = wait_for(settled)
    assert data, overview(hub)
    check_invariants(data)
    queue = [(q["user"], q["server"]) for q in data["queue"]]
    assert [q["position"] for q in data["queue"]] == list(range(1, 15))
    assert set(queue) | {(g["holder"]["user"], g["holder"]["server"]) for g in data["gpus"]} == set(accepted)
    waits = [q["waiting_seconds"] for q in data["queue"]]
    assert waits == sorted(waits, reverse=True), "first come, first served (each user has one request)"

    # a queued spawn shows its place on the progress stream
    head_user, head_server = queue[0]
    # (the stream replays every step: the place it had when it joined, then each change)
    events = hub.api("GET", f"/users/{head_user}/servers/{head_server}/progress", stream=True)
    seen = ""
    try:
        for line in events.iter_lines(decode_unicode=True):
            seen += line
            if "number 1 in the queue" in seen:
                break
    except requests.exceptions.RequestException:
        pass
    finally:
        events.close()
    assert "Waiting for a free GPU: number 1 in the queue" in seen, seen

    # the first two holders stop: the first two in the queue get their GPUs, the rest keep their order
    holders = sorted({(g["holder"]["user"], g["holder"]["server"]) for g in data["gpus"] if g["holder"]})
    for user, server in holders[:2]:
        hub.server_pids.add(servers(hub, user)[server]["state"]["pid"])
        assert hub.api("DELETE", f"/users/{user}/servers/{server}").status_code in (202, 204)

    def moved():
        d = overview(hub)
        running = {(g["holder"]["user"], g["holder"]["server"]) for g in d["gpus"]
                   if g["holder"] and g["holder"]["state"] == "running"}
        return d if set(queue[:2]) <= running and len(d["queue"]) == 12 else None

    data = wait_for(moved)
    assert data, overview(hub)
    check_invariants(data)
    assert [(q["user"], q["server"]) for q in data["queue"]] == queue[2:]

    # cancelling a pending spawn frees its place
    user, server = queue[5]
    assert hub.api("DELETE", f"/users/{user}/servers/{server}").status_code in (202, 204)
    def cancelled():
        d = overview(hub)
        return d if len(d["queue"]) == 11 and server not in servers(hub, user) else None

    data = wait_for(cancelled, timeout=60)
    assert data and (user, server) not in [(q["user"], q["server"]) for q in data["queue"]]
    assert [(q["user"], q["server"]) for q in data["queue"]] == [x for x in queue[2:] if x != (user, server)]

    # the usage records hold every allocation of the storm: at no moment did a user hold more
    # than 1 GPU, nor the students together more than 3
    r = requests.get(hub.url + "/hub/api/gpus/usage", params={"by": "allocation", "since": "0"}, timeout=60,
                     headers={"Authorization": f"token {hub.reader_token}"})
    assert r.status_code == 200, r.text
    rows = r.json()["rows"]
    assert len(rows) >= 6, rows  # four first holders, then the two served from the queue
    assert max(max_held_at_once(rows).values()) == 1
    assert max_held_at_once(rows, set(STUDENTS)).get("group", 0) <= 3  # no student may be among the six


def test_group_profiles_are_hidden_and_refused_by_name(ops_hub):
    hub = ops_hub
    hub.add_users("sam", "u00")
    html = login(hub, "u00").get(hub.url + "/hub/spawn").text
    assert 'data-profile="gpu"' in html and 'data-profile="big"' not in html
    assert 'data-profile="big"' in login(hub, "sam").get(hub.url + "/hub/spawn").text
    r = hub.spawn("u00", {"profile": "big"})
    assert r.status_code == 403
    assert r.json()["message"] == ("profile: 'big' is only for members of the group(s) 'staff', "
                                   "and you are not a member of any of them")
    assert servers(hub, "u00") == {}
