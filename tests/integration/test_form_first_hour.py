"""The first hour on a real hub (gpu-local, 2 A100 and 2 T4 on one host): what the spawn form says,
what a refused user is pointed to, what the queue says, and the form remembering a user's last choice.

Each sentence is read where the user reads it: the form at /hub/spawn, the REST answer to a spawn,
the spawn's progress stream.
"""

from __future__ import annotations

import html as htmllib
import re

import pytest
import requests

from hub import login
from ops_hub import OpsHub, started

pytestmark = pytest.mark.integration

A100, T4 = "a100-sxm4-80gb", "t4"
QUEUED_NAME = "GPU, queued (waits for one)"
PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_counts": [1, 2, 4], "default_gpus": 1, "default": True},
    {"slug": "t4-pair", "display_name": "Two T4", "gpu_models": ["t4"], "gpu_counts": [2], "default_gpus": 2},
    {"slug": "gpu-queued", "display_name": QUEUED_NAME, "gpu_counts": [1], "default_gpus": 1, "queue": True},
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory, fakenvml_libdir):
    with started(OpsHub(tmp_path_factory.mktemp("first-hour"), fakenvml_libdir, PROFILES,
                        mixin={"gpu_queue_timeout": 300, "gpu_queue_recheck": 1})) as hub:
        yield hub


def form(hub, name: str) -> str:
    page = login(hub, name).get(hub.url + "/hub/spawn", timeout=60)
    page.encoding = "utf-8"  # as the page's <meta charset> tells a browser
    assert "gpuspawner-form" in page.text, page.url
    return page.text


def words(html: str) -> str:
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def card(html: str, slug: str) -> str:
    found = re.search(rf'data-profile="{slug}">.*?<div class="gs-note gs-free">(.*?)</div>', html, re.S)
    return words(found.group(1)) if found else ""


def options(html: str, name: str) -> dict[str, tuple[str, bool]]:
    """value -> (the text a user reads, selected) of the select ``name``."""
    select = re.search(rf'<select[^>]*name="{name}"[^>]*>(.*?)</select>', html, re.S).group(1)
    return {m.group(1): (words(m.group(3)), "selected" in m.group(2))
            for m in re.finditer(r'<option value="([^"]*)"([^>]*)>(.*?)</option>', select, re.S)}


def selected(html: str, name: str) -> str:
    (value,) = [v for v, (_text, chosen) in options(html, name).items() if chosen]
    return value


def progress_until(hub, name: str, wanted: str) -> str:
    events = hub.api("GET", f"/users/{name}/server/progress", stream=True)
    seen = ""
    try:
        for line in events.iter_lines(decode_unicode=True):
            seen += htmllib.unescape(line or "")
            if wanted in seen or '"failed": true' in seen:
                break
    except requests.exceptions.RequestException:
        pass
    finally:
        events.close()
    return seen


def test_a_new_user_reads_what_fits_is_pointed_to_the_queue_and_finds_their_last_choice(hub):
    hub.add_users("ann", "bob", "cy")

    # a fresh hub: free/total on the card; 4 GPUs never fit (the host has 2 of a model), never "not free now"
    fresh = form(hub, "cy")
    assert card(fresh, "gpu") == "NVIDIA A100-SXM4-80GB: 2 of 2 free · Tesla T4: 2 of 2 free"
    assert card(fresh, "t4-pair") == "Tesla T4: 2 of 2 free"
    counts = options(fresh, "gpus-gpu")
    assert counts["4"][0] == "4 GPUs (never fits here: needs 4 GPUs on one host; the largest here has 2)"
    assert counts["2"][0] == "2 GPUs" and "not free now" not in words(fresh)

    # every GPU taken: 1 and 2 are not free now, 4 still never fits
    for name, model in (("ann", A100), ("bob", T4)):
        r = hub.spawn(name, {"profile": "gpu", "gpus": 2, "gpu_model": model})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(name)
    busy = form(hub, "cy")
    assert card(busy, "gpu") == "NVIDIA A100-SXM4-80GB: 0 of 2 free · Tesla T4: 0 of 2 free"
    counts = options(busy, "gpus-gpu")
    assert [counts[n][0] for n in "124"] == [
        "1 GPU (not free now)", "2 GPUs (not free now)",
        "4 GPUs (never fits here: needs 4 GPUs on one host; the largest here has 2)"]

    # refused for lack of free GPUs: pointed to the profile that would queue them, where it could
    r = hub.spawn("cy", {"profile": "gpu", "gpus": 1})
    assert r.status_code == 409
    assert r.json()["message"] == ("No GPU is free right now: 0 of 4 free. Try again later. "
                                   f'Pick "{QUEUED_NAME}" to wait in the queue instead.')
    r = hub.spawn("cy", {"profile": "t4-pair", "gpus": 2})  # no profile queues two T4s: no pointer
    assert r.status_code == 409
    assert r.json()["message"] == "No Tesla T4 is free right now: 0 of 2 free. Try again later."

    # queued: the progress says the place and what the estimate rests on, not "no estimate yet"
    r = hub.spawn("cy", {"profile": "gpu-queued", "gpus": 1})
    assert r.status_code in (201, 202), r.text  # JupyterHub answers before a slow start ends
    waiting = ("Waiting for a free GPU: number 1 in the queue (1 of 1 waiting for these GPUs); 4 of 4 GPUs held. "
               "No start time can be given yet. No session has ended on this hub yet, so nothing tells how long "
               "sessions last; no holder of these GPUs has a time limit.")
    assert waiting in progress_until(hub, "cy", waiting)
    hub.stop_server("ann")
    hub.wait_ready("cy")

    # the form preselects each user's last choice
    hub.stop_server("cy")
    hub.stop_server("bob")
    again = form(hub, "ann")
    assert re.search(r'<input type="radio" name="profile" value="gpu"\s+checked>', again)
    assert (selected(again, "gpu_model-gpu"), selected(again, "gpus-gpu")) == (A100, "2")
    assert re.search(r'<input type="radio" name="profile" value="gpu-queued"\s+checked>', form(hub, "cy"))
