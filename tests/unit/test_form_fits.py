"""The spawn form's first look, as a new user reads it: free/total per model on each profile card,
GPU counts that never fit here (and why) apart from those busy now; the queue's words.

Everything here is the rendered form HTML or the sentence a waiting user reads. The same
sentences on a real hub (the REST answers, /hub/spawn) are in
tests/integration/test_form_first_hour.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter

from hypothesis import given, settings, strategies as st
from jinja2 import Environment, PackageLoader
from test_form import controls, text

from gpuspawner.availability import ModelAvailability
from gpuspawner.form import form_context
from gpuspawner.gpu import GPU, model_slug
from gpuspawner.inventory import InventoryReading
from gpuspawner.profiles import Choice, load_profiles
from gpuspawner.queue import GPUQueue, Known, known_for, queue_alternatives

A100, T4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"
NAMES = {model_slug(A100): A100, model_slug(T4): T4}
COUNTS = [0, 1, 2, 3, 4, 8]
PROFILES = load_profiles([
    {"slug": "gpu", "display_name": "GPU", "gpu_counts": COUNTS, "default_gpus": 1, "default": True},
])
ENV = Environment(loader=PackageLoader("gpuspawner", "templates"), autoescape=True)


def render(context: dict) -> str:
    return ENV.get_template("form.html").render(**context)


def card(html: str, slug: str) -> str:
    """The words on one profile card's free/total line."""
    found = re.search(rf'data-profile="{slug}">.*?<div class="gs-note gs-free">(.*?)</div>', html, re.S)
    return text(found.group(1)) if found else ""


def count_options(html: str) -> dict[int, tuple[bool, str]]:
    return {int(o["value"]): (o["disabled"], o["text"]) for o in controls(html).selects["gpus-gpu"]["options"]}


# hosts, each with some GPUs of each model, some held, some out of service
gpu_layouts = st.lists(
    st.lists(st.tuples(st.sampled_from([A100, T4]), st.booleans(), st.booleans()), max_size=5),
    min_size=1, max_size=4,
).filter(any)  # a hub without any GPU shows only profiles without one (tests/unit/test_form.py)


@settings(max_examples=150, deadline=None)
@given(layout=gpu_layouts, model=st.sampled_from(["any", model_slug(A100), model_slug(T4)]))
def test_every_count_says_whether_it_fits_now_later_or_never(layout, model):
    gpus, held = [], set()
    for h, host in enumerate(layout):
        for i, (name, busy, healthy) in enumerate(host):
            gpus.append(GPU(f"h{h}", i, f"h{h}-{i}", name, healthy=healthy, reason=None if healthy else "GPU is lost"))
            if busy:
                held.add(f"h{h}-{i}")
    context = form_context(PROFILES, InventoryReading(tuple(gpus)), held,
                           {"profile": "gpu", "gpu_model": model, "gpus": 1})
    html = render(context)
    models = {g.model for g in gpus}
    if model not in models:
        model = "any"
    wanted = [g for g in gpus if model in ("any", g.model)]
    # what a user can count on the hosts themselves: the most of one model on one host, ever and free now
    per_host = Counter((g.host, g.model) for g in wanted)
    free_per_host = Counter((g.host, g.model) for g in wanted if g.healthy and g.uuid not in held)
    most, free = max(per_host.values(), default=0), max(free_per_host.values(), default=0)
    for n, (disabled, label) in count_options(html).items():
        if n <= free:
            assert not disabled and "(" not in label
        elif n > most:
            what = (f"{n} GPU" + "s" * (n > 1)) if model == "any" else f"{n} x {NAMES[model]}"
            assert disabled and label.endswith(
                f"(never fits here: needs {what} on one host; the largest here has {most or 'none'})"), label
        else:
            assert disabled and label.endswith("(not free now)"), label
    # the card says free/total of every model without opening the menu, as counted from the GPUs
    expected = []
    for name in sorted({g.name for g in gpus}):
        mine = [g for g in gpus if g.name == name]
        up = [g for g in mine if g.healthy]
        down = len(mine) - len(up)
        more = f", {down} {name} out of service" if down else ""
        counts = (f"none usable{more}" if not up else f"{sum(g.uuid not in held for g in up)} of {len(up)} free{more}")
        expected.append(f"{name}: {counts}")
    assert card(html, "gpu") == " · ".join(expected)


def test_a_count_no_host_can_hold_is_never_shown_as_not_free_now():
    # the hub: its largest host has 2 GPUs, all 4 held
    gpus = tuple(GPU(f"h{i // 2}", i % 2, f"u{i}", A100) for i in range(4))
    html = render(form_context(PROFILES, InventoryReading(gpus), {g.uuid for g in gpus}))
    options = count_options(html)
    assert options[4] == (True, "4 GPUs (never fits here: needs 4 GPUs on one host; the largest here has 2)")
    assert options[2] == (True, "2 GPUs (not free now)")
    assert card(html, "gpu") == f"{A100}: 0 of 4 free"
    # the browser script keeps the reasons when the model changes: each count's reason per model
    notes = json.loads(controls(html).selects["gpu_model-gpu"]["attrs"]["data-notes"])
    assert notes["any"] == {"0": "", "1": "not free now", "2": "not free now",
                            "3": "never fits here: needs 3 GPUs on one host; the largest here has 2",
                            "4": "never fits here: needs 4 GPUs on one host; the largest here has 2",
                            "8": "never fits here: needs 8 GPUs on one host; the largest here has 2"}
    assert notes[model_slug(A100)]["4"] == f"never fits here: needs 4 x {A100} on one host; the largest here has 2"


def test_a_cluster_says_node_and_waiting_backends_disable_only_what_never_fits():
    busy = [ModelAvailability(model_slug(T4), T4, free=0, total=4, largest=0, most_on_one_host=2)]
    html = render(form_context(PROFILES, InventoryReading(), (), availability=busy, waits=True, host="node"))
    options = count_options(html)
    assert options[2] == (False, "2 GPUs")
    assert options[3] == (True, "3 GPUs (never fits here: needs 3 GPUs on one node; the largest here has 2)")
    assert card(html, "gpu") == "Tesla T4: 0 of 4 free"


def test_when_availability_is_unknown_nothing_is_disabled_and_the_card_says_so():
    unknown = [ModelAvailability(model_slug(T4), T4, 0, 0, known=False)]
    html = render(form_context(PROFILES, InventoryReading(), (), availability=unknown, unknown="no answer"))
    assert all(not disabled for disabled, _label in count_options(html).values())
    assert card(html, "gpu") == "Tesla T4: availability unknown"


# --------------------------------------------------------------- which profile would queue them

QUEUE_PROFILES = load_profiles([
    {"slug": "gpu", "display_name": "GPU", "gpu_counts": [1, 2], "default": True},
    {"slug": "t4", "display_name": "T4", "gpu_models": ["t4"], "gpu_counts": [1]},
    {"slug": "big", "display_name": "Two A100", "gpu_models": ["a100"], "gpu_counts": [2]},
    {"slug": "q-a100", "display_name": "A100, queued", "gpu_models": ["a100"], "gpu_counts": [1, 2], "queue": True},
    {"slug": "q-any", "display_name": "GPU, queued (waits for one)", "gpu_counts": [1], "queue": True},
])


def alternatives(slug: str, gpus: int, model: str = "any") -> list[str]:
    profile = next(p for p in QUEUE_PROFILES if p.slug == slug)
    return [f"{c.profile.slug}:{c.gpu_model}" for c in queue_alternatives(QUEUE_PROFILES, Choice(profile, gpus, model))]


def test_only_queued_profiles_that_ask_the_same_are_offered():
    assert alternatives("gpu", 1) == ["q-any:any"]  # q-a100 would not give any model
    assert alternatives("gpu", 1, "a100") == ["q-a100:a100", "q-any:a100"]
    assert alternatives("gpu", 2) == []  # no queued profile of any model takes 2
    assert alternatives("t4", 1) == ["q-any:t4"]
    assert alternatives("big", 2) == ["q-a100:a100"]
    assert alternatives("q-any", 1) == []  # already one that queues


# --------------------------------------------------------------- the queue's words


def gpu(i: int, name: str = A100) -> GPU:
    return GPU("h", i, f"u{i}", name)


def test_the_queue_says_its_place_and_what_it_knows_instead_of_no_estimate():
    queue = GPUQueue(clock=lambda: 0.0)
    gpus = (gpu(0), gpu(1), gpu(2, T4))
    first = queue.join("ann/", "ann", 1, ("a100",))
    second = queue.join("bob/", "bob", 1, ("a100",))
    holders = {"u0": "cy/", "u1": "dee/job/7f3e"}
    # a server has no time limit; a notebook job ends at its time limit at the latest
    known = known_for(second, gpus, holders, {"dee/job/7f3e": 7200.0})
    assert known == Known(total=2, held=2, what=A100, ends=7200.0)
    assert queue.describe(2, 2, known, now=0.0) == (
        f"Waiting for a free GPU: number 2 in the queue (2 of 2 waiting for these GPUs); 2 of 2 {A100} held. "
        "The first could free by 02:00 UTC, when a notebook job holding one reaches its time limit.")
    # on another day than today, the time says which day (a 24-hour limit read at 02:00 is not "now")
    assert queue.describe(2, 2, known, now=-3600.0).endswith(
        "The first could free by 1970-01-01 02:00 UTC, when a notebook job holding one reaches its time limit.")
    servers_only = known_for(first, gpus, {"u0": "cy/", "u1": "eve/"}, {})
    assert queue.describe(1, 2, servers_only) == (
        f"Waiting for a free GPU: number 1 in the queue (1 of 2 waiting for these GPUs); 2 of 2 {A100} held. "
        "No server here has a time limit, so no end time is known.")
    any_model = known_for(queue.join("fay/", "fay", 1, ()), gpus, {"u2": "cy/"}, {})
    assert any_model == Known(total=3, held=1, what="GPUs")


def test_with_a_pace_the_queue_says_what_its_estimate_rests_on():
    now = [0.0]
    queue = GPUQueue(clock=lambda: now[0])
    for t in (0.0, 60.0, 120.0):
        now[0] = t
        queue._served.append(t)
    assert queue.describe(3, 3, Known(4, 4)).endswith(
        "(3 of 3 waiting for these GPUs); 4 of 4 GPUs held. About 3 minutes, at the pace of the last 3 requests "
        "served from the queue.")
    assert "no estimate" not in queue.describe(1) and "no estimate" not in queue.describe(5, 9, Known())
