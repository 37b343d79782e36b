"""Tests for gpuspawner.form and templates/form.html: what a user sees in the spawn form."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from jinja2 import Environment, PackageLoader

from gpuspawner.availability import ModelAvailability
from gpuspawner.form import form_context, has_choices
from gpuspawner.gpu import GPU, model_slug
from gpuspawner.inventory import InventoryReading
from gpuspawner.profiles import load_profiles, options_from_form, parse_options

A100_NAME = "NVIDIA A100-SXM4-80GB"
T4_NAME = "Tesla T4"
A100 = model_slug(A100_NAME)
T4 = model_slug(T4_NAME)

IMG_SCIPY = "jupyter/scipy-notebook:2024-01-01"
IMG_TORCH = "ghcr.io/example/torch:2.3"

PROFILES = load_profiles([
    {"slug": "cpu", "display_name": "CPU only", "description": "No GPU at all", "gpu_counts": [0]},
    {
        "slug": "gpu",
        "display_name": "GPU notebook",
        "gpu_counts": [1, 2, 4],
        "default_gpus": 1,
        "default": True,
        "images": [IMG_SCIPY, IMG_TORCH],
    },
    {"slug": "big", "display_name": "Big", "gpu_models": ["a100", "t4"], "gpu_counts": [0, 1, 2, 8], "default_gpus": 1},
    {"slug": "hopper", "display_name": "Hopper only", "gpu_models": ["h100"], "gpu_counts": [1, 2]},
])


def gpu(host: str, index: int, name: str = A100_NAME, healthy: bool = True) -> GPU:
    return GPU(host, index, f"{host}-{index}", name, healthy=healthy, reason=None if healthy else "GPU is lost")


# Two hosts:
#   h1: A100 x2 (h1-0 held), T4 x1
#   h2: A100 x4 (h2-0 held, h2-1 unhealthy, h2-2 and h2-3 free), T4 x1 (unhealthy)
INVENTORY = (
    gpu("h1", 0),
    gpu("h1", 1),
    gpu("h1", 2, T4_NAME),
    gpu("h2", 0),
    gpu("h2", 1, healthy=False),
    gpu("h2", 2),
    gpu("h2", 3),
    gpu("h2", 4, T4_NAME, healthy=False),
)
HELD = frozenset({"h1-0", "h2-0"})
READING = InventoryReading(INVENTORY)

ENV = Environment(loader=PackageLoader("gpuspawner", "templates"), autoescape=True)


def render(context: dict) -> str:
    return ENV.get_template("form.html").render(**context)


def text(html: str) -> str:
    """The visible words, whitespace collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


class FormParser(HTMLParser):
    """Collects the form controls as a browser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.radios: list[dict] = []
        self.selects: dict[str, dict] = {}
        self._select: dict | None = None
        self._option: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "input" and a.get("type") == "radio":
            self.radios.append(a)
        elif tag == "select":
            self._select = {"attrs": a, "options": []}
            self.selects[a["name"]] = self._select
        elif tag == "option" and self._select is not None:
            self._option = {"value": a.get("value"), "selected": "selected" in a, "disabled": "disabled" in a,
                            "text": ""}
            self._select["options"].append(self._option)

    def handle_data(self, data):
        if self._option is not None:
            self._option["text"] += data

    def handle_endtag(self, tag):
        if tag == "option" and self._option is not None:
            self._option["text"] = " ".join(self._option["text"].split())
            self._option = None
        elif tag == "select":
            self._select = None


def controls(html: str) -> FormParser:
    parser = FormParser()
    parser.feed(html)
    parser.close()
    return parser


def submit(html: str) -> dict[str, list[str]]:
    """The form fields a browser posts for the form as rendered (no user change)."""
    parsed = controls(html)
    form: dict[str, list[str]] = {}
    for radio in parsed.radios:
        if "checked" in radio:
            form.setdefault(radio["name"], []).append(radio["value"])
    for name, select in parsed.selects.items():
        options = select["options"]
        chosen = [o for o in options if o["selected"]][-1:] or [o for o in options if not o["disabled"]][:1]
        if chosen and not chosen[0]["disabled"]:
            form[name] = [chosen[0]["value"]]
    return form


def by_slug(context: dict, slug: str) -> dict:
    (p,) = [p for p in context["profiles"] if p["profile"].slug == slug]
    return p


def counts(profile_context: dict) -> dict[int, tuple[bool, bool]]:
    """count -> (disabled, selected)"""
    return {c["value"]: (c["disabled"], c["selected"]) for c in profile_context["counts"]}


# ==========================================================================
# form_context
# ==========================================================================


def test_default_profile_and_counts_for_any_model():
    context = form_context(PROFILES, READING, HELD)
    assert context["selected_profile"] == "gpu"
    assert [p["profile"].slug for p in context["profiles"]] == ["cpu", "gpu", "big", "hopper"]
    gpu_ctx = by_slug(context, "gpu")
    assert gpu_ctx["selected_model"] == "any"
    assert gpu_ctx["largest"] == {"any": 2, A100: 2, T4: 1}
    # 4 GPUs do not fit on one host now; 1 (the default) is selected
    assert counts(gpu_ctx) == {1: (False, True), 2: (False, False), 4: (True, False)}
    assert [m.slug for m in gpu_ctx["models"]] == [A100, T4]
    assert gpu_ctx["gpu_choice"] is True
    assert gpu_ctx["images"] == [IMG_SCIPY, IMG_TORCH]
    assert gpu_ctx["selected_image"] == IMG_SCIPY
    assert context["simulated"] is False and context["no_gpus"] is False and context["problems"] == []


def test_count_labels():
    labels = [c["label"] for c in by_slug(form_context(PROFILES, READING, HELD), "big")["counts"]]
    assert labels == ["no GPU", "1 GPU", "2 GPUs", "8 GPUs"]


def test_counts_follow_the_previously_chosen_model():
    context = form_context(PROFILES, READING, HELD, {"profile": "gpu", "gpus": 1, "gpu_model": T4})
    gpu_ctx = by_slug(context, "gpu")
    assert gpu_ctx["selected_model"] == T4
    assert counts(gpu_ctx) == {1: (False, True), 2: (True, False), 4: (True, False)}


def test_zero_gpus_is_never_disabled():
    nothing_free = form_context(PROFILES, READING, {g.uuid for g in INVENTORY})
    assert counts(by_slug(nothing_free, "big")) == {
        0: (False, False), 1: (True, True), 2: (True, False), 8: (True, False)
    }
    assert counts(by_slug(nothing_free, "cpu")) == {0: (False, True)}


def test_cpu_profile_has_no_gpu_choice():
    cpu = by_slug(form_context(PROFILES, READING, HELD), "cpu")
    assert cpu["gpu_choice"] is False
    assert cpu["images"] == [] and cpu["selected_image"] is None


def test_restricted_profile_offers_only_its_models():
    hopper = by_slug(form_context(PROFILES, READING, HELD), "hopper")
    assert hopper["models"] == []
    assert hopper["largest"] == {"any": 0}
    assert counts(hopper) == {1: (True, True), 2: (True, False)}
    big = by_slug(form_context(PROFILES, READING, HELD), "big")
    assert [m.slug for m in big["models"]] == [A100, T4]


def test_previous_choice_is_preselected():
    previous = {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": IMG_TORCH}
    context = form_context(PROFILES, READING, HELD, previous)
    assert context["selected_profile"] == "gpu"
    gpu_ctx = by_slug(context, "gpu")
    assert gpu_ctx["selected_model"] == A100
    assert counts(gpu_ctx) == {1: (False, False), 2: (False, True), 4: (True, False)}
    assert gpu_ctx["selected_image"] == IMG_TORCH


def test_previous_choice_of_another_profile():
    context = form_context(PROFILES, READING, HELD, {"profile": "big", "gpus": 8, "gpu_model": T4})
    assert context["selected_profile"] == "big"
    big = by_slug(context, "big")
    assert big["selected_model"] == T4
    # 8 is not free now: it is shown disabled, and the largest count that fits is preselected instead
    assert counts(big)[8] == (True, False)
    selected = [n for n, (disabled, chosen) in counts(big).items() if chosen]
    assert len(selected) == 1 and not counts(big)[selected[0]][0] and selected[0] > 0
    # The previous choice only applies to its own profile; the others show their defaults.
    gpu_ctx = by_slug(context, "gpu")
    assert gpu_ctx["selected_model"] == "any" and counts(gpu_ctx)[1] == (False, True)


@pytest.mark.parametrize(
    "previous",
    [
        {"profile": "nope"},
        {"profile": None},
        {"profile": 5},
        {"profile": "GPU"},
        {},
        None,
    ],
)
def test_unknown_previous_profile_falls_back_to_default(previous):
    context = form_context(PROFILES, READING, HELD, previous)
    assert context["selected_profile"] == "gpu"
    assert counts(by_slug(context, "gpu"))[1] == (False, True)


@pytest.mark.parametrize(
    "previous",
    [{"profile": ["gpu"]}, {"profile": {"$ne": ""}}, {"profile": "gpu", "gpu_model": [T4]},
     {"profile": "gpu", "gpu_model": {"$ne": ""}}],
    ids=repr,
)
def test_unhashable_previous_values_fall_back_to_defaults(previous):
    context = form_context(PROFILES, READING, HELD, previous)
    assert context["selected_profile"] == "gpu"
    assert by_slug(context, "gpu")["selected_model"] == "any"


def test_previous_values_of_wrong_type_fall_back_to_defaults():
    previous = {"profile": "gpu", "gpus": [2], "image": [IMG_TORCH]}
    gpu_ctx = by_slug(form_context(PROFILES, READING, HELD, previous), "gpu")
    assert [c["value"] for c in gpu_ctx["counts"] if c["selected"]] == [1]
    assert gpu_ctx["selected_image"] == IMG_SCIPY


def test_invalid_previous_values_fall_back_to_defaults():
    previous = {"profile": "gpu", "gpus": 3, "gpu_model": "v100", "image": "evil/image"}
    gpu_ctx = by_slug(form_context(PROFILES, READING, HELD, previous), "gpu")
    assert gpu_ctx["selected_model"] == "any"
    assert [c["value"] for c in gpu_ctx["counts"] if c["selected"]] == [1]
    assert gpu_ctx["selected_image"] == IMG_SCIPY


def test_model_of_another_profile_is_not_preselected():
    gpus = INVENTORY + (gpu("h3", 0, "NVIDIA H100 80GB HBM3"),)
    h100 = model_slug("NVIDIA H100 80GB HBM3")
    big = by_slug(form_context(PROFILES, InventoryReading(gpus), HELD, {"profile": "big", "gpu_model": h100}), "big")
    assert big["selected_model"] == "any"


def test_reading_flags():
    simulated = form_context(PROFILES, InventoryReading(INVENTORY, simulated=True), HELD)
    assert simulated["simulated"] is True
    assert simulated["no_gpus"] is False and simulated["cpu_only"] is False
    empty = form_context(PROFILES, InventoryReading(problems=("NVML: NVIDIA driver is not loaded",)), set())
    assert empty["no_gpus"] is True
    assert empty["problems"] == ["NVML: NVIDIA driver is not loaded"]


def test_no_gpus_found_offers_the_profiles_that_run_without_one():
    """NVML finds none (or an empty static inventory): the CPU profiles, no GPU preselected."""
    for reading in (InventoryReading(), InventoryReading(problems=("NVML: NVIDIA driver is not loaded",))):
        context = form_context(PROFILES, reading, set())
        assert context["cpu_only"] is True and context["gpus_needed"] is False
        assert [p["profile"].slug for p in context["profiles"]] == ["cpu", "big"]  # "gpu" and "hopper" need GPUs
        assert context["selected_profile"] == "cpu"  # the configured default ("gpu") needs one
        big = by_slug(context, "big")
        assert [c["value"] for c in big["counts"] if c["selected"]] == [0]
        assert [c["value"] for c in big["counts"] if not c["disabled"]] == [0]
        # the form posts what the REST API's defaults give: a server without a GPU
        choice = parse_options(options_from_form(submit(render(context))), PROFILES, (), no_gpus=True)
        assert (choice.profile.slug, choice.gpus) == ("cpu", 0)


def test_no_gpus_found_with_only_gpu_profiles_keeps_them_and_says_so():
    profiles = load_profiles([
        {"slug": "gpu", "display_name": "GPU notebook", "gpu_counts": [1, 2]},
        {"slug": "hopper", "display_name": "Hopper only", "gpu_models": ["h100"], "gpu_counts": [1]},
    ])
    context = form_context(profiles, InventoryReading(), set())
    assert [p["profile"].slug for p in context["profiles"]] == ["gpu", "hopper"]
    assert context["cpu_only"] is False and context["gpus_needed"] is True
    assert "No GPUs were found on this hub: every profile here needs one" in text(render(context))


def test_no_gpus_found_on_a_cpu_only_hub_says_nothing_and_asks_nothing():
    cpu_only = load_profiles([{"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]}])
    context = form_context(cpu_only, InventoryReading(problems=("NVML: NVIDIA driver is not loaded",)), set())
    assert context["cpu_only"] is False and context["gpus_needed"] is False
    html = text(render(context))
    assert "No GPUs were found" not in html and "cannot be used" not in html and "NVML" not in html
    assert has_choices(context) is False  # the hub then starts the server without a form, as its parent does


def test_has_choices():
    cpu_only = load_profiles([{"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]}])
    assert has_choices(form_context(cpu_only, READING, HELD)) is False
    images = {"4.0": "quay.io/jupyterhub/singleuser:4.0", "4": "quay.io/jupyterhub/singleuser:4"}
    assert has_choices(form_context(cpu_only, READING, HELD, offered_images=images)) is True
    assert has_choices(form_context(cpu_only, READING, HELD, offered_images={"4": "x:4"})) is False
    assert has_choices(form_context(cpu_only, READING, HELD, offered_images="*")) is False
    assert has_choices(form_context(PROFILES, READING, HELD)) is True
    one_gpu = load_profiles([{"slug": "gpu", "display_name": "GPU", "gpu_counts": [1]}])
    assert has_choices(form_context(one_gpu, READING, HELD)) is True  # the model to pick


def test_offered_images_are_the_picker_of_profiles_without_images():
    """DockerSpawner's allowed_images beside the profiles: profiles with images keep theirs."""
    images = {"4.0": "quay.io/jupyterhub/singleuser:4.0", "4": "quay.io/jupyterhub/singleuser:4"}
    context = form_context(PROFILES, READING, HELD, {"profile": "cpu", "image": "4"}, offered_images=images)
    assert by_slug(context, "cpu")["images"] == ["4.0", "4"]
    assert by_slug(context, "cpu")["selected_image"] == "4"  # the user's last choice
    assert by_slug(context, "gpu")["images"] == [IMG_SCIPY, IMG_TORCH]
    parsed = controls(render(context))
    assert [o["value"] for o in parsed.selects["image-cpu"]["options"]] == ["4.0", "4"]
    form = submit(render(context))
    assert options_from_form(form) == {"profile": "cpu", "gpus": 0, "image": "4"}
    assert parse_options(options_from_form(form), PROFILES, (), offered_images=images).image == "4"
    # no choice of the user's yet: the spawner's configured image is preselected, as DockerSpawner's picker does
    fresh = form_context(PROFILES, READING, HELD, offered_images=images, default_image=images["4"])
    assert by_slug(fresh, "cpu")["selected_image"] == "4"
    assert by_slug(form_context(PROFILES, READING, HELD, offered_images=images), "cpu")["selected_image"] == "4.0"


# ==========================================================================
# The rendered HTML
# ==========================================================================


def test_html_has_a_radio_per_profile_with_the_selected_one_checked():
    parsed = controls(render(form_context(PROFILES, READING, HELD, {"profile": "big"})))
    assert [(r["name"], r["value"]) for r in parsed.radios] == [
        ("profile", "cpu"), ("profile", "gpu"), ("profile", "big"), ("profile", "hopper")
    ]
    assert [r["value"] for r in parsed.radios if "checked" in r] == ["big"]


def test_html_has_per_profile_select_names():
    parsed = controls(render(form_context(PROFILES, READING, HELD)))
    assert set(parsed.selects) == {
        "gpus-cpu",
        "gpu_model-gpu", "gpus-gpu", "image-gpu",
        "gpu_model-big", "gpus-big",
        "gpu_model-hopper", "gpus-hopper",
    }


def test_html_model_options_show_free_of_total():
    parsed = controls(render(form_context(PROFILES, READING, HELD)))
    models = parsed.selects["gpu_model-gpu"]["options"]
    assert [(o["value"], o["text"]) for o in models] == [
        ("any", "Any model"),
        (A100, "NVIDIA A100-SXM4-80GB - 3 of 5 free, 1 more unavailable"),
        (T4, "Tesla T4 - 1 of 1 free, 1 more unavailable"),
    ]
    assert [o["value"] for o in models if o["selected"]] == ["any"]
    largest = json.loads(parsed.selects["gpu_model-gpu"]["attrs"]["data-largest"])
    assert largest == {"any": 2, A100: 2, T4: 1}


def test_html_disables_counts_that_do_not_fit():
    parsed = controls(render(form_context(PROFILES, READING, HELD)))
    options = parsed.selects["gpus-gpu"]["options"]
    assert [(o["value"], o["disabled"], o["text"]) for o in options] == [
        ("1", False, "1 GPU"),
        ("2", False, "2 GPUs"),
        ("4", True, "4 GPUs (not free now)"),
    ]
    assert [o["value"] for o in options if o["selected"]] == ["1"]


def test_html_offers_counts_that_wait_in_the_queue_up_to_the_most_one_host_has():
    # Slurm: no T4 free now, 2 on the largest node; requests that do not fit now wait in Slurm's queue
    busy = [ModelAvailability(T4, T4_NAME, free=0, total=4, largest=0, most_on_one_host=2)]
    context = form_context(PROFILES, InventoryReading(), (), availability=busy, waits=True, host="node")
    assert by_slug(context, "gpu")["largest"] == {"any": 2, T4: 2}
    options = controls(render(context)).selects["gpus-gpu"]["options"]
    assert [(o["value"], o["disabled"], o["text"]) for o in options] == [
        ("1", False, "1 GPU"),
        ("2", False, "2 GPUs"),
        ("4", True, "4 GPUs (never fits here: needs 4 GPUs on one node; the largest here has 2)"),
    ]


def test_html_preselects_the_previous_choice():
    previous = {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": IMG_TORCH}
    parsed = controls(render(form_context(PROFILES, READING, HELD, previous)))
    selected = {name: [o["value"] for o in s["options"] if o["selected"]] for name, s in parsed.selects.items()}
    assert selected["gpu_model-gpu"] == [A100]
    assert selected["gpus-gpu"] == ["2"]
    assert selected["image-gpu"] == [IMG_TORCH]
    assert [r["value"] for r in parsed.radios if "checked" in r] == ["gpu"]


def test_html_profile_without_its_models_says_so():
    html = render(form_context(PROFILES, READING, HELD))
    assert text(html).count("No GPU of this profile's models is on this hub.") == 1  # only "hopper"


def test_html_simulated_note():
    simulated = render(form_context(PROFILES, InventoryReading(INVENTORY, simulated=True), HELD))
    real = render(form_context(PROFILES, READING, HELD))
    assert "Simulated GPUs." in text(simulated)
    assert "Simulated GPUs" not in real


def test_html_no_gpu_note_with_problem():
    reading = InventoryReading(problems=("NVML: NVIDIA driver is not loaded",))
    html = render(form_context(PROFILES, reading, set()))
    assert ("No GPUs were found on this hub (NVML: NVIDIA driver is not loaded), "
            "so only servers without a GPU are offered.") in text(html)
    assert "No GPUs were found" not in render(form_context(PROFILES, READING, HELD))


def test_html_no_gpu_note_without_problem():
    html = render(form_context(PROFILES, InventoryReading(), set()))
    assert "No GPUs were found on this hub, so only servers without a GPU are offered." in text(html)


def test_html_problems_with_some_gpus():
    reading = InventoryReading(INVENTORY, problems=("GPU 1 on h2: GPU is lost", "GPU 4 on h2: GPU is lost"))
    html = render(form_context(PROFILES, reading, HELD))
    assert "Some GPUs cannot be used: GPU 1 on h2: GPU is lost; GPU 4 on h2: GPU is lost." in text(html)
    assert "No GPUs were found" not in html


def test_html_escapes_hostile_text():
    hostile = '<script>alert("x")</script>'
    profiles = load_profiles([
        {"slug": "evil", "display_name": hostile, "description": hostile + "<img src=x onerror=alert(1)>",
         "gpu_counts": [0, 1]},
    ])
    gpus = (GPU("h1", 0, "u0", "Evil <b>GPU</b>\"'><script>alert(2)</script>"),)
    reading = InventoryReading(gpus, problems=("<script>alert(3)</script>",))
    html = render(form_context(profiles, reading, set()))
    assert html.count("<script") == 1  # only the template's own script
    assert "<img" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    parsed = controls(html)
    (model_option,) = [o for o in parsed.selects["gpu_model-evil"]["options"] if o["value"] != "any"]
    assert model_option["text"].startswith("Evil <b>GPU</b>\"'><script>alert(2)</script>")  # shown as text


# --------------------------------------------------------------- form round trip


@pytest.mark.parametrize(
    "previous",
    [
        None,
        {"profile": "cpu"},
        {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": IMG_TORCH},
        {"profile": "gpu", "gpus": 1, "gpu_model": T4, "image": IMG_SCIPY},
        {"profile": "big", "gpus": 0, "gpu_model": "any"},
        {"profile": "big", "gpus": 1, "gpu_model": T4},
    ],
)
def test_submitting_the_rendered_form_gives_the_shown_choice(previous):
    """The form as shown, posted unchanged, gives the same Choice as the REST body."""
    html = render(form_context(PROFILES, READING, HELD, previous))
    models = {g.model for g in INVENTORY}
    from_form = parse_options(options_from_form(submit(html)), PROFILES, models)
    rest = dict(previous or {})
    if rest.get("profile", "gpu") == "gpu" and "image" not in rest:
        rest["image"] = IMG_SCIPY  # the form preselects the first image
    assert from_form == parse_options(rest, PROFILES, models)
