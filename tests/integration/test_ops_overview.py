"""The admin GPU overview (/hub/gpus, /hub/api/gpus) and the hub's Prometheus metrics, on a real hub."""

from __future__ import annotations

import re
import time

import pytest
import requests

from gpuspawner.backends.local.fence import detect
from hub import login
from ops_hub import OpsHub
from test_local_hub import TWO_GPUS, start

pytestmark = pytest.mark.integration

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2, 4],
     "default_gpus": 1, "default": True},
]


@pytest.fixture
def ops_hub(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES)
    hub.start()
    try:
        yield hub
    finally:
        hub.close()


def user_token(hub, session: requests.Session, name: str) -> str:
    """A token of ``name``, made through its own logged-in browser session."""
    xsrf = session.cookies.get("_xsrf", path="/hub/")
    r = session.post(f"{hub.url}/hub/api/users/{name}/tokens", json={"note": "test"},
                     headers={"X-XSRFToken": xsrf, "Referer": hub.url + "/hub/token"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def wait_for(predicate, timeout=60, interval=0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def test_overview_shows_holders_live_numbers_and_access_rules(ops_hub):
    hub = ops_hub
    hub.add_users("alice", "bob")
    alice = start(hub, "alice", TWO_GPUS)
    hub.set_utilization(dict.fromkeys(alice, 37))

    def monitored():
        data = hub.overview().json()
        held = [g for g in data["gpus"] if g["holder"]]
        return data if held and all(g["source"] == "monitor" and g["utilization_gpu"] == 37 for g in held) else None

    data = wait_for(monitored)
    assert data, hub.overview().text
    held = {g["uuid"]: g for g in data["gpus"] if g["holder"]}
    assert set(held) == alice
    for g in held.values():
        assert g["holder"]["user"] == "alice" and g["holder"]["server"] == "" and g["holder"]["state"] == "running"
        assert g["holder"]["since"] > time.time() - 600
        assert g["age"] is not None and not g["stale"]
    free = [g for g in data["gpus"] if not g["holder"]]
    assert len(free) == 2 and all(g["source"] == "hub-nvml" for g in free)
    models = {m["model"]: m for m in data["models"]}
    assert sum(m["total"] for m in models.values()) == 4
    assert sum(m["free"] for m in models.values()) == 2
    assert sum(m["allocated"] for m in models.values()) == 2
    # how gpu-local fences servers on this host, as the hub sees it (root here: device cgroups)
    expected = detect()
    assert data["isolation"] == {"enforced": expected.enforced, "mechanism": expected.mechanism,
                                 "note": expected.note}

    # non-admins see their own GPUs only (bob holds none), on the page and the API; the test service
    # (admin:users, no custom scope, no GPUs of its own) gets 403
    bob = login(hub, "bob")
    page = bob.get(hub.url + "/hub/gpus")
    assert page.status_code == 200 and "alice" not in page.text
    token = user_token(hub, bob, "bob")
    assert hub.overview(token).json()["gpus"] == []
    assert hub.overview(hub.token).status_code == 403
    assert requests.get(hub.url + "/hub/api/gpus", timeout=30).status_code == 403

    # the admin sees the page with the holder
    boss = login(hub, "boss")
    page = boss.get(hub.url + "/hub/gpus")
    assert page.status_code == 200
    assert "alice" in page.text and "running" in page.text
    assert 'class="navbar' in page.text  # JupyterHub's own page layout


def test_metrics_count_gpus_refusals_and_placements(ops_hub):
    hub = ops_hub
    hub.add_users("alice", "bob", "carol")
    start(hub, "alice", TWO_GPUS)
    start(hub, "bob", TWO_GPUS)
    assert hub.spawn("carol", TWO_GPUS).status_code == 409
    r = requests.get(hub.url + "/hub/metrics", timeout=30, headers={"Authorization": f"token {hub.reader_token}"})
    assert r.status_code == 200, r.text
    text = r.text

    def value(pattern: str) -> float:
        found = re.search(pattern + r" ([0-9.e+]+)", text)
        assert found, pattern
        return float(found.group(1))

    assert value(r'gpuspawner_gpus\{host="[^"]+",model="a100-sxm4-80gb",state="total"\}') == 2
    assert value(r'gpuspawner_gpus\{host="[^"]+",model="t4",state="free"\}') == 0
    total_alloc = sum(float(v) for v in re.findall(r'gpuspawner_gpus\{[^}]*state="allocated"\} ([0-9.]+)', text))
    assert total_alloc == 4
    assert value(r'gpuspawner_spawn_refusals_total\{reason="none_free"\}') >= 1
    assert value(r'gpuspawner_placement_seconds_count\{outcome="placed"\}') >= 2
    assert value(r"gpuspawner_queue_length") == 0
