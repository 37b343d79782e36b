"""Fair-share queueing on a real hub (``gpu_queue_order``): one A100 (the stand-in NVML), held by
another user. Hank used it before and queues first; Lily, with no use, queues after him. By fair share
Lily is served first and each is told their place and why (progress page, ``/hub/api/gpus`` and the
``/hub/gpus`` page); by
arrival Hank is."""

from __future__ import annotations

import html as htmllib

import pytest

from gpuspawner.simulation import simulated_config
from hub import login
from ops_hub import OpsHub
from test_form_first_hour import progress_until
from test_local_hub import start
from test_queue_backfill_hub import wait_for

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook (queued)", "gpu_models": ["any"], "gpu_counts": [1],
             "default": True, "queue": True}]
ONE = {"profile": "gpu", "gpus": 1}
A100 = "NVIDIA A100-SXM4-80GB"
LILY_WHY = ("1st in the queue: fair share puts users with less recent GPU use first (your recent use: 0.0 GPU-hours, "
            "use 7 days ago counting half)")
HANK_WHY = ("2nd in the queue: fair share puts users with less recent GPU use first (your recent use: less than 0.1 "
            "GPU-hours, use 7 days ago counting half)")


@pytest.mark.parametrize("order", ["fair-share", "arrival"])
def test_a_light_users_later_request_passes_a_heavy_users_only_under_fair_share(tmp_path, fakenvml_libdir, order):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, devices=simulated_config(a100=1, t4=0),
                 mixin={"gpu_queue_order": order, "gpu_queue_timeout": 300, "gpu_queue_recheck": 1})
    hub.start()
    try:
        hub.add_users("hank", "lily", "old")
        start(hub, "hank", ONE)  # hank's use: the usage records keep it
        hub.stop_server("hank")
        start(hub, "old", ONE)  # the only GPU is held
        for name in ("hank", "lily"):  # hank asks first, lily after him
            assert hub.spawn(name, ONE).status_code == 202
            assert wait_for(lambda n=name: n in [q["user"] for q in hub.overview().json()["queue"]])
        queue = hub.overview().json()["queue"]
        if order == "arrival":
            assert [(q["user"], q["position"]) for q in queue] == [("hank", 1), ("lily", 2)]
            assert queue[0]["why"] == ("1st in the queue: first come, first served, each user's first request "
                                       "before anyone's second")
            hub.stop_server("old")
            hub.wait_ready("hank")
            assert [q["user"] for q in hub.overview().json()["queue"]] == ["lily"]
            return
        assert [(q["user"], q["position"], q["why"]) for q in queue] == [("lily", 1, LILY_WHY), ("hank", 2, HANK_WHY)]
        waiting = f"Waiting for a free GPU: {HANK_WHY}; 2 of 2 waiting for these GPUs; 1 of 1 {A100} held."
        assert waiting in progress_until(hub, "hank", waiting)
        page = htmllib.unescape(login(hub, "hank").get(hub.url + "/hub/gpus", timeout=60).text)  # his own place
        assert f"<td>{HANK_WHY}</td>" in page and LILY_WHY not in page
        hub.stop_server("old")
        hub.wait_ready("lily")
        assert [q["user"] for q in hub.overview().json()["queue"]] == ["hank"]
        assert not hub.user("hank")["servers"][""]["ready"]
    finally:
        hub.close()
