"""The GPU-aware idle culler as a managed service of a real hub, with utilisation scripted on the stand-in."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import requests

from hub import login
from ops_hub import OpsHub
from test_local_hub import TWO_GPUS, start
from test_ops_culler_lifetime import cullers
from test_ops_overview import user_token, wait_for

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2],
             "default_gpus": 1, "default": True}]
CULLER = {"period": 2, "threshold": 10, "idle_timeout": 14, "warn_before": 6}


@pytest.fixture
def ops_hub(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, culler=CULLER, server_args=["--GPUMonitor.interval=0.5"])
    hub.start()
    try:
        yield hub
    finally:
        hub.close()


def notices(hub, name: str, token: str) -> list[dict]:
    r = requests.get(f"{hub.url}/user/{name}/api/gpus/notices", headers={"Authorization": f"token {token}"}, timeout=30)
    return r.json()["notices"] if r.status_code == 200 else []


def busy_alice_idle_bob(hub) -> tuple[set[str], set[str], str, str]:
    """Start alice's and bob's servers on two GPUs each, alice's busy, bob's idle: their GPUs and tokens.
    Every GPU reads busy until then, so that no server idles before the test says so."""
    hub.set_utilization({device["uuid"]: 85 for device in hub.gpus_config["devices"]})
    hub.add_users("alice", "bob")
    alice_gpus = start(hub, "alice", TWO_GPUS)
    bob_gpus = start(hub, "bob", TWO_GPUS)
    hub.set_utilization({**dict.fromkeys(alice_gpus, 85), **dict.fromkeys(bob_gpus, 2)})
    alice_token, bob_token = (user_token(hub, login(hub, name), name) for name in ("alice", "bob"))
    return alice_gpus, bob_gpus, alice_token, bob_token


def test_only_the_idle_server_is_warned_then_stopped_and_a_new_start_begins_clean(ops_hub):
    hub = ops_hub
    alice_gpus, bob_gpus, alice_token, bob_token = busy_alice_idle_bob(hub)

    warning = wait_for(lambda: notices(hub, "bob", bob_token), timeout=120, interval=0.2)
    assert warning, hub.log()
    assert warning[0]["level"] == "warning" and warning[0]["source"] == "gpu-culler"
    assert warning[0]["message"].startswith("This server will be stopped in 6 seconds because its GPUs are idle")
    assert hub.user("bob")["servers"][""]["ready"], "warned first, still running"

    # Bob stops and starts his server within one culler period (the culler is held still meanwhile,
    # as a culler with the usual period of a minute would be): the new start is tracked afresh, so
    # it is warned in its turn before it is stopped, not stopped at the next round on the strength
    # of the first start's idle time and warning.
    (culler,) = cullers(hub)
    os.kill(culler, signal.SIGSTOP)
    try:
        assert hub.api("DELETE", "/users/bob/server").status_code in (202, 204)
        assert wait_for(lambda: not hub.user("bob")["servers"], timeout=60, interval=0.1)
        restarted = time.time()
        bob_gpus = start(hub, "bob", TWO_GPUS)
        hub.set_utilization(dict.fromkeys(bob_gpus, 2))
    finally:
        os.kill(culler, signal.SIGCONT)

    def warned_or_gone():
        if not hub.user("bob")["servers"]:
            return "stopped"
        return "warned" if notices(hub, "bob", bob_token) else None

    assert wait_for(warned_or_gone, timeout=120, interval=0.2) == "warned", (
        "the new start was stopped without a warning of its own\n" + hub.log_path.read_text()[-4000:])
    assert wait_for(lambda: not hub.user("bob")["servers"], timeout=120), hub.log()
    stopped = time.time()
    log = hub.log_path.read_text()
    warned_lines = [line for line in log.splitlines() if "warned bob/" in line]
    stop_lines = [line for line in log.splitlines() if "stopping bob/ because its GPUs" in line]
    assert len(warned_lines) == 2 and len(stop_lines) == 1, log[-4000:]
    assert log.index(warned_lines[1]) < log.index(stop_lines[0])
    assert "stayed below 10% utilisation" in stop_lines[0] and all(u in stop_lines[0] for u in bob_gpus)
    # the idle time that got it stopped is the new start's own
    idle = int(re.search(r"utilisation for (\d+) seconds", stop_lines[0]).group(1))
    assert CULLER["idle_timeout"] <= idle <= stopped - restarted + 1, stop_lines[0]

    # the busy one keeps running, unwarned
    time.sleep(CULLER["period"])
    assert hub.user("alice")["servers"][""]["ready"]
    assert notices(hub, "alice", alice_token) == []
    culler_lines = [line for line in log.splitlines() if "gpu-culler" in line]
    assert "alice/" not in "".join(line for line in culler_lines if "warned" in line or "stopping" in line)
