"""A server admitted until a booking's window, on a real hub with real servers and their monitors:
told in its progress and by a notice, warned ``gpu_booking_warn_before`` ahead, stopped when the window
starts, its usage ending "booking"; a server that holds other GPUs runs on."""

from __future__ import annotations

import time

import pytest
import requests

from hub import login
from ops_hub import OpsHub
from test_ops_culler import notices
from test_ops_overview import user_token, wait_for
from test_usage_accounting import allocations

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2],
             "default": True}]
WARN_BEFORE = 25


@pytest.fixture
def hub(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, mixin={"gpu_booking_warn_before": WARN_BEFORE})
    hub.start()
    try:
        hub.add_users("ann", "bob", "cat", "boss")
        yield hub
    finally:
        hub.close()


def test_a_server_admitted_until_a_window_is_told_warned_and_stopped_when_it_starts(hub):
    tokens = {name: user_token(hub, login(hub, name), name) for name in ("ann", "bob", "boss")}
    window = time.time() + WARN_BEFORE + 35
    auth = {"Authorization": f"token {tokens['boss']}"}
    r = requests.post(hub.url + "/hub/api/gpus/bookings", timeout=60, headers=auth,
                      json={"model": "t4", "count": 2, "start": window, "end": window + 3600, "user": "cat"})
    assert r.status_code == 201, r.text
    booking = r.json()["id"]

    assert hub.spawn("ann", {"profile": "gpu", "gpus": 1, "gpu_model": "a100-sxm4-80gb"}).status_code in (201, 202)
    assert hub.spawn("bob", {"profile": "gpu", "gpus": 1, "gpu_model": "t4"}).status_code in (201, 202)
    hub.wait_ready("ann")
    hub.wait_ready("bob")
    assert "will be stopped at" in hub.log_path.read_text()  # bob's progress told him (placement's words)

    # the notice once his server is up: until when, and whose booking
    told = wait_for(lambda: [n for n in notices(hub, "bob", tokens["bob"]) if n["source"] == "gpu-bookings"], 60, 0.5)
    assert told, hub.log()
    assert told[0]["level"] == "info" and told[0]["id"] == "gpu-booking"
    assert told[0]["message"].startswith("This server may keep its GPUs until ")
    assert f"from then 2 x t4 are booked by cat (booking {booking})" in told[0]["message"]
    assert time.time() < window - WARN_BEFORE  # told before the warning time
    assert notices(hub, "ann", tokens["ann"]) == []  # ann's A100s are not booked

    # warned gpu_booking_warn_before ahead (the same notice id: it replaces the first)
    def warning():
        found = notices(hub, "bob", tokens["bob"])
        return found if found and found[0]["level"] == "warning" else None

    warned = wait_for(warning, 60, 0.5)
    assert warned and len(warned) == 1, hub.log()
    assert time.time() >= window - WARN_BEFORE
    assert warned[0]["message"].startswith("This server will be stopped in ")
    assert f"its GPUs are booked from then by cat (booking {booking}). Save your work now." in warned[0]["message"]

    # stopped when the window starts, and recorded so; ann's server runs on
    assert wait_for(lambda: not hub.user("bob")["servers"], 60, 0.5), hub.log()
    assert time.time() >= window
    (row,) = [a for a in allocations(hub) if a["owner"] == "bob/"]
    assert row["end_reason"] == "booking"
    assert hub.user("ann")["servers"][""]["ready"]
