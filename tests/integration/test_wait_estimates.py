"""Wait estimates on a real hub (gpu-local, 2 A100 and 2 T4 on one host): a spawn waiting in the hub's
queue reads when it will likely start, and what that rests on, in its progress and in /hub/api/gpus.

On a fresh hub no session has ended, so the estimate says so instead of a time; once a session has
ended, the next waiting spawn's estimate goes by it.
"""

from __future__ import annotations

import html as htmllib
import time

import pytest

from hub import login
from ops_hub import OpsHub, started
from test_form_first_hour import progress_until
from test_ops_overview import user_token

pytestmark = pytest.mark.integration

PROFILES = [
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_counts": [1, 2], "default_gpus": 1, "default": True},
    {"slug": "gpu-queued", "display_name": "GPU, queued", "gpu_counts": [1], "default_gpus": 1, "queue": True},
]
NO_HISTORY = ("No start time can be given yet. No session has ended on this hub yet, so nothing tells how long "
              "sessions last; no holder of these GPUs has a time limit.")


@pytest.fixture(scope="module")
def hub(tmp_path_factory, fakenvml_libdir):
    with started(OpsHub(tmp_path_factory.mktemp("waits"), fakenvml_libdir, PROFILES,
                        mixin={"gpu_queue_timeout": 300, "gpu_queue_recheck": 1})) as hub:
        yield hub




def queue_entry(hub, user: str, token: str | None = None) -> dict | None:
    """``user``'s place in /hub/api/gpus once the queue has estimated it (None until then)."""
    for _ in range(120):
        r = hub.overview(token)
        assert r.status_code == 200, r.text
        found = [q for q in r.json()["queue"] if q["user"] == user]
        if found and found[0]["estimate"] is not None:
            return found[0]
        time.sleep(0.5)
    return None


def test_a_queued_spawn_reads_its_estimate_in_its_progress_and_in_rest(hub):
    hub.add_users("ann", "bob", "cy", "dee", "eve")
    for name in ("ann", "bob"):  # every GPU held
        assert hub.spawn(name, {"profile": "gpu", "gpus": 2}).status_code in (201, 202)
        hub.wait_ready(name)

    # nothing has ended yet: no time, and why
    assert hub.spawn("cy", {"profile": "gpu-queued", "gpus": 1}).status_code in (201, 202)
    entry = queue_entry(hub, "cy")
    assert entry is not None, hub.overview().text
    assert entry["estimate"] == {"likely": None, "low": None, "high": None, "text": NO_HISTORY,
                                 "basis": NO_HISTORY[len("No start time can be given yet. "):-1]}
    waiting = ("Waiting for a free GPU: number 1 in the queue (1 of 1 waiting for these GPUs); 4 of 4 GPUs held. "
               + NO_HISTORY)
    assert waiting in progress_until(hub, "cy", waiting)

    # a user's own view shows their own place and estimate, nobody else's
    own = hub.overview(user_token(hub, login(hub, "cy"), "cy")).json()["queue"]
    assert [(q["user"], q["estimate"]["text"]) for q in own] == [("cy", NO_HISTORY)]
    assert hub.overview(user_token(hub, login(hub, "dee"), "dee")).json()["queue"] == []

    # the queue profile's card tells the next user when a request queued now would likely start
    page = login(hub, "dee").get(hub.url + "/hub/spawn", timeout=60).text
    card = htmllib.unescape(page[page.index('data-profile="gpu-queued"'):])
    assert card.split('<div class="gs-note gs-wait">')[1].split("</div>")[0] == (
        "If you queue now: no start time can be given yet. No session has ended on this hub yet, so nothing tells "
        "how long sessions last; 1 request ahead of yours; no holder of these GPUs has a time limit.")

    # ann's session ends (the first in the history) and cy gets her GPU; eve waits and goes by it
    hub.stop_server("ann")
    hub.wait_ready("cy")
    assert hub.spawn("dee", {"profile": "gpu", "gpus": 1}).status_code in (201, 202)
    hub.wait_ready("dee")
    assert hub.spawn("eve", {"profile": "gpu-queued", "gpus": 1}).status_code in (201, 202)
    entry = queue_entry(hub, "eve")
    assert entry is not None, hub.overview().text
    estimate = entry["estimate"]
    assert estimate["basis"].startswith("Going by the 1 sessions recorded on this hub"), estimate
    assert estimate["likely"] is not None and estimate["low"] <= estimate["likely"], estimate
    assert estimate["text"].startswith("About "), estimate
    assert estimate["text"] in progress_until(hub, "eve", estimate["text"])
