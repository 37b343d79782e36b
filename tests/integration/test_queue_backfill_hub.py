"""The queue's first-fit backfill on a real hub (``gpu_queue_backfill = "first-fit"``): a 1-GPU spawn
behind a queued 2-GPU spawn starts at once on the GPU it fits, and the 2-GPU spawn keeps its place and
starts when a model frees two; the spawn form's wait estimate says so. One host with 2 A100s and 2 T4s
(the stand-in NVML)."""

from __future__ import annotations

import html as htmllib
import time

import pytest

from hub import login
from ops_hub import OpsHub
from test_local_hub import gpu_set, start

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook (queued)", "gpu_models": ["any"], "gpu_counts": [1, 2],
             "default_gpus": 1, "default": True, "queue": True}]


def one(model: str) -> dict:
    return {"profile": "gpu", "gpus": 1, "gpu_model": model}


def wait_for(predicate, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.5)
    return None


def test_a_small_spawn_starts_beside_a_big_one_that_waits_for_a_whole_model(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES,
                 mixin={"gpu_queue_backfill": "first-fit", "gpu_queue_timeout": 300, "gpu_queue_recheck": 1})
    hub.start()
    try:
        names = {d["uuid"]: d["name"] for d in hub.gpus_config["devices"]}
        hub.add_users("old", "tess", "ada", "bob")
        start(hub, "old", one("a100-sxm4-80gb"))  # 1 of 2 A100s free
        start(hub, "tess", one("t4"))  # 1 of 2 T4s free
        r = hub.spawn("ada", {"profile": "gpu", "gpus": 2, "gpu_model": "any"})  # no model has 2 free: queued
        assert r.status_code == 202, r.text

        def queued():
            queue = hub.overview().json()["queue"]
            return queue if [q["user"] for q in queue] == ["ada"] else None

        assert wait_for(queued), hub.overview().json()
        # the form's estimate follows the queue's rule: a 1-GPU spawn queued now would start now (in strict
        # order it would wait for ada, who has no end known: until her limit, 5 minutes on)
        before = time.time()
        page = login(hub, "bob").get(hub.url + "/hub/spawn", timeout=60).text
        minutes = {time.strftime("%H:%M UTC", time.gmtime(t)) for t in (before, time.time())}
        note = htmllib.unescape(page[page.index('data-profile="gpu"'):]).split('<div class="gs-note gs-wait">')[1]
        assert any(note.startswith(f"If you queue now: about {m}. ") for m in minutes), note[:300]
        # bob asks for one A100 behind ada (whose "any" competes for it): he starts on the free one
        bob = start(hub, "bob", one("a100-sxm4-80gb"))
        assert [names[u] for u in bob] == ["NVIDIA A100-SXM4-80GB"]
        overview = hub.overview().json()
        assert [(q["user"], q["position"]) for q in overview["queue"]] == [("ada", 1)]
        assert not hub.user("ada")["servers"][""]["ready"]
        # tess stops: both T4s are free, and ada, still first in the queue, gets them
        hub.stop_server("tess")
        hub.wait_ready("ada")
        assert {names[u] for u in gpu_set(hub.server_env("ada"))} == {"Tesla T4"}
        assert hub.overview().json()["queue"] == []
    finally:
        hub.close()
