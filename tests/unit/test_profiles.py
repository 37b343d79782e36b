"""Tests for gpuspawner.profiles: profile configuration and the user_options contract.

The contract is the same for the spawn form and the REST API:
``profile`` (slug), ``gpus`` (int, one of the profile's counts), ``gpu_model``
(a model slug present and allowed, or "any"), ``image`` (one of the profile's
images). Anything else is an OptionsError whose ``.field`` names the field.
"""

from __future__ import annotations

import ast
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gpuspawner.backends.base import GPUSpawnerMixin
from gpuspawner.gpu import model_slug
from gpuspawner.inputs import field_name
from gpuspawner.profiles import (
    DEFAULT_PROFILES,
    MAX_GPUS,
    OPTION_KEYS,
    Choice,
    OptionsError,
    Profile,
    default_profile,
    is_form_field,
    load_profiles,
    options_from_form,
    parse_options,
    without_gpus,
)

A100 = model_slug("NVIDIA A100-SXM4-80GB")  # "a100-sxm4-80gb"
T4 = model_slug("Tesla T4")  # "t4"
H100 = model_slug("NVIDIA H100 80GB HBM3")  # "h100-80gb-hbm3"
MODELS_PRESENT = frozenset({A100, T4, H100})

IMG_SCIPY = "jupyter/scipy-notebook:2024-01-01"
IMG_TORCH = "ghcr.io/example/torch:2.3"

CONFIG = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {
        "slug": "gpu",
        "display_name": "GPU notebook",
        "gpu_counts": [1, 2, 4],
        "default_gpus": 1,
        "default": True,
        "images": [IMG_SCIPY, IMG_TORCH],
    },
    {
        "slug": "big",
        "display_name": "Big training",
        "gpu_models": ["a100", "t4"],
        "gpu_counts": [0, 1, 8],
        "default_gpus": 1,
    },
]
PROFILES = load_profiles(CONFIG)
BY_SLUG = {p.slug: p for p in PROFILES}


def parse(options):
    return parse_options(options, PROFILES, MODELS_PRESENT)


def refusal(options) -> OptionsError:
    with pytest.raises(OptionsError) as info:
        parse(options)
    return info.value


def config_refusal(entries) -> OptionsError:
    with pytest.raises(OptionsError) as info:
        load_profiles(entries)
    return info.value


def one_profile(**entry) -> Profile:
    entry.setdefault("display_name", "Test profile")
    (profile,) = load_profiles([entry])
    return profile


# ==========================================================================
# Configuration
# ==========================================================================


@pytest.mark.parametrize("empty", [[], (), None])
def test_empty_configuration_gives_the_default_profiles(empty):
    profiles = load_profiles(empty)
    assert [p.slug for p in profiles] == ["cpu", "gpu"]
    cpu, gpu = profiles
    assert cpu.gpu_counts == (0,) and cpu.default_gpus == 0 and not cpu.default
    assert gpu.gpu_counts == (1, 2, 4) and gpu.default_gpus == 1 and gpu.default
    assert gpu.gpu_models == ("any",)
    assert default_profile(profiles) is gpu
    assert profiles == load_profiles(list(DEFAULT_PROFILES))


def test_profile_defaults_for_a_minimal_entry():
    p = one_profile(display_name="  Plain  ")
    assert p == Profile(slug="plain", display_name="Plain")
    assert p.gpu_models == ("any",)
    assert p.gpu_counts == (0,) and p.default_gpus == 0 and p.max_gpus == 0
    assert p.images == () and p.cpu_limit is None and p.mem_limit is None
    assert p.capabilities == ("compute", "utility")
    assert p.default is False


def test_full_entry_is_read_as_written():
    p = one_profile(
        slug="train",
        display_name="Training",
        description="For long runs",
        gpu_models=["A100", "t4"],
        gpu_counts=[4, 1, 2, 2],
        default_gpus=2,
        images=[IMG_TORCH],
        cpu_limit=8,
        mem_limit="64G",
        default=True,
        capabilities=["compute", "utility", "graphics"],
    )
    assert p.slug == "train" and p.display_name == "Training" and p.description == "For long runs"
    assert p.gpu_models == ("a100", "t4")  # lowercased
    assert p.gpu_counts == (1, 2, 4)  # sorted, deduplicated
    assert p.default_gpus == 2 and p.max_gpus == 4
    assert p.images == (IMG_TORCH,)
    assert p.cpu_limit == 8 and p.mem_limit == "64G"
    assert p.default is True
    assert p.capabilities == ("compute", "utility", "graphics")


def test_default_gpus_defaults_to_the_smallest_count():
    assert one_profile(gpu_counts=[8, 2, 4]).default_gpus == 2


def test_single_model_string_is_accepted_as_a_list():
    assert one_profile(gpu_models="A100").gpu_models == ("a100",)


def test_kubespawner_style_entry():
    (p,) = load_profiles([
        {
            "display_name": "Training (2 GPUs)",
            "slug": "training",
            "description": "Two exclusive GPUs",
            "default": True,
            "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": 2}, "mem_limit": "8G"},
        }
    ])
    assert p.slug == "training"
    assert p.display_name == "Training (2 GPUs)"
    assert p.description == "Two exclusive GPUs"
    assert p.default is True
    assert p.gpu_counts == (2,) and p.default_gpus == 2
    assert p.mem_limit == "8G" and p.cpu_limit is None
    # The profile then works through the user_options contract.
    choice = parse_options({}, (p,), MODELS_PRESENT)
    assert (choice.profile, choice.gpus, choice.gpu_model) == (p, 2, "any")


def test_kubespawner_override_image_and_cpu_limit():
    p = one_profile(kubespawner_override={"image": IMG_TORCH, "cpu_limit": 4})
    assert p.images == (IMG_TORCH,) and p.cpu_limit == 4
    assert p.gpu_counts == (0,)  # no GPU limit given: no GPU


def test_kubespawner_override_without_gpu_limit_and_empty_override():
    assert one_profile(kubespawner_override={}).gpu_counts == (0,)
    assert one_profile(kubespawner_override=None).gpu_counts == (0,)


@pytest.mark.parametrize("override, named", [
    ({"extra_resource_limits": {"example.com/fpga": 1}}, "example.com/fpga"),
    ({"node_selector": {"disk": "ssd"}}, "node_selector"),
    ({"environment": {"A": "1"}, "image": IMG_TORCH}, "environment"),
    ({"tolerations": [], "volumes": []}, "tolerations"),
])
def test_override_keys_a_backend_cannot_apply_are_refused_not_dropped(override, named):
    e = config_refusal([{"display_name": "X", "slug": "x", "kubespawner_override": override}])
    assert named in str(e)
    # gpu-kube applies every key (KubeSpawner does)
    (p,) = load_profiles([{"display_name": "X", "slug": "x", "kubespawner_override": override}], honour_all=True)
    assert p.gpu_counts == (0,)


@pytest.mark.parametrize("override, counts, models", [
    ({"extra_resource_limits": {"nvidia.com/mig-1g.10gb": 1}}, (1,), ("mig-1g-10gb",)),
    ({"extra_resource_guarantees": {"nvidia.com/gpu.shared": "1"}}, (1,), ("shared",)),
    ({"extra_resource_limits": {"nvidia.com/gpu": 2},
      "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}, (2,), ("a100-sxm4-80gb",)),
])
def test_kubespawner_style_gpu_entries_keep_their_gpu(override, counts, models):
    (p,) = load_profiles([{"display_name": "X", "kubespawner_override": override}], honour_all=True)
    assert (p.gpu_counts, p.gpu_models, p.default_gpus) == (counts, models, counts[0])


@pytest.mark.parametrize("override, named", [
    ({"extra_resource_limits": {"nvidia.com/fpga": 1}}, "nvidia.com/fpga"),
    ({"extra_resource_limits": {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}}, "several GPU resources"),
])
def test_unknown_or_several_gpu_resources_are_refused(override, named):
    with pytest.raises(OptionsError, match=re.escape(named)):
        load_profiles([{"display_name": "X", "kubespawner_override": override}], honour_all=True)


def test_kubespawner_gpu_limit_as_string_number():
    p = one_profile(kubespawner_override={"extra_resource_limits": {"nvidia.com/gpu": "4"}})
    assert p.gpu_counts == (4,) and p.default_gpus == 4


def test_kubespawner_gpu_limit_is_checked_like_gpu_counts():
    override = {"extra_resource_limits": {"nvidia.com/gpu": -1}}
    e = config_refusal([{"display_name": "X", "kubespawner_override": override}])
    assert e.field == "profile 'x'"
    assert "gpu_counts" in str(e)


@pytest.mark.parametrize(
    "display_name, slug",
    [
        ("GPU notebook", "gpu-notebook"),
        ("Training (2 GPUs)", "training-2-gpus"),
        ("  A100 -- big!  ", "a100-big"),
        ("Über GPU", "ber-gpu"),
        ("!!!", "profile"),
        ("x" * 100, "x" * 63),
    ],
)
def test_slug_generated_from_display_name(display_name, slug):
    assert one_profile(display_name=display_name).slug == slug


def test_explicit_empty_slug_is_generated_from_display_name():
    assert one_profile(display_name="My Profile", slug="").slug == "my-profile"


def test_unknown_keys_are_named():
    e = config_refusal([{"display_name": "A"}, {"display_name": "B", "gpus": 2, "image": "x"}])
    assert e.field == "gpu_profiles[1]"
    assert "unknown keys ['gpus', 'image']" in str(e)
    assert "known keys" in str(e) and "gpu_counts" in str(e)


@pytest.mark.parametrize("entry", ["cpu", ["display_name", "x"], None, 3])
def test_entry_must_be_a_dict(entry):
    e = config_refusal([{"display_name": "ok"}, entry])
    assert e.field == "gpu_profiles[1]"
    assert "must be a dict" in str(e)
    assert type(entry).__name__ in str(e)


@pytest.mark.parametrize("entry", [
    {}, {"display_name": ""}, {"display_name": "   "}, {"display_name": 5}, {"slug": "x"},
])
def test_display_name_is_required(entry):
    e = config_refusal([entry])
    assert e.field == "gpu_profiles[0]"
    assert "display_name" in str(e)


@pytest.mark.parametrize("slug", ["GPU", "gpu notebook", "-gpu", "gpu_big", "../gpu", "é", "a" * 64, 5, ["gpu"]])
def test_bad_slug_is_refused(slug):
    e = config_refusal([{"display_name": "X", "slug": slug}])
    assert e.field == "gpu_profiles[0]"
    assert "lowercase letters, digits and dashes" in str(e)


@pytest.mark.parametrize(
    "counts",
    [[], [-1], [1.0], ["2"], [True], [1, None], [MAX_GPUS + 1], [10**30], "2", 2, None, {1: 1}, {2}],
    ids=repr,
)
def test_bad_gpu_counts_are_refused(counts):
    e = config_refusal([{"display_name": "X", "slug": "x", "gpu_counts": counts}])
    assert e.field == "profile 'x'"
    assert str(e) == f"profile 'x': gpu_counts must be a non-empty list of integers 0..{MAX_GPUS}"


def test_gpu_counts_accept_the_bounds():
    assert one_profile(gpu_counts=[0, MAX_GPUS]).gpu_counts == (0, MAX_GPUS)


@pytest.mark.parametrize("default_gpus", [3, -1, "1", None])
def test_default_gpus_must_be_one_of_the_counts(default_gpus):
    e = config_refusal([{"display_name": "X", "slug": "x", "gpu_counts": [1, 2], "default_gpus": default_gpus}])
    assert e.field == "profile 'x'"
    assert f"default_gpus {default_gpus!r} is not one of gpu_counts [1, 2]" in str(e)


def test_duplicate_slugs_are_refused():
    e = config_refusal([
        {"display_name": "One", "slug": "gpu"},
        {"display_name": "Two"},
        {"display_name": "Three", "slug": "gpu"},
    ])
    assert e.field == "gpu_profiles"
    assert "slugs must be unique; repeated: ['gpu']" in str(e)


def test_duplicate_generated_slugs_are_refused():
    e = config_refusal([{"display_name": "GPU Notebook"}, {"display_name": "gpu notebook!"}])
    assert e.field == "gpu_profiles"
    assert "'gpu-notebook'" in str(e)


def test_two_defaults_are_refused():
    e = config_refusal([
        {"display_name": "A", "default": True},
        {"display_name": "B", "default": True},
    ])
    assert e.field == "gpu_profiles"
    assert "at most one profile may be the default" in str(e)


def test_without_a_default_the_first_profile_is_default():
    profiles = load_profiles([{"display_name": "A"}, {"display_name": "B"}])
    assert default_profile(profiles).slug == "a"
    assert parse_options({}, profiles).profile.slug == "a"


@pytest.mark.parametrize(
    "models", [[], ["A100 SXM4"], [""], [5], [None], ["../a100"], ["a100", "t4!"], ["a_100"], ""], ids=repr
)
def test_bad_model_slugs_are_refused(models):
    e = config_refusal([{"display_name": "X", "slug": "x", "gpu_models": models}])
    assert e.field == "profile 'x'"
    assert "gpu_models must" in str(e) and ("model slugs" in str(e) or "at least one model" in str(e))


@pytest.mark.parametrize("images", [["not an image"], [""], [5], ["-rm"], ["a" * 300]], ids=repr)
def test_bad_images_are_refused(images):
    e = config_refusal([{"display_name": "X", "slug": "x", "images": images}])
    assert e.field == "profile 'x'"
    assert "images must be a list of image names" in str(e)


@pytest.mark.parametrize("capabilities", [["Compute"], ["compute", ""], [1], ["gpu all"]], ids=repr)
def test_bad_capabilities_are_refused(capabilities):
    e = config_refusal([{"display_name": "X", "slug": "x", "capabilities": capabilities}])
    assert e.field == "profile 'x'"
    assert "capabilities" in str(e)


# --------------------------------------------------------------- config bugs


@pytest.mark.parametrize(
    "override",
    [
        {"extra_resource_limits": {"nvidia.com/gpu": "two"}},
        {"extra_resource_limits": {"nvidia.com/gpu": 2.5}},
        {"extra_resource_limits": {"nvidia.com/gpu": True}},
        {"extra_resource_limits": {"nvidia.com/gpu": None}},
        "mem_limit=8G",
    ],
    ids=repr,
)
def test_bad_kubespawner_override_is_an_options_error(override):
    e = config_refusal([{"display_name": "X", "slug": "x", "kubespawner_override": override}])
    assert e.field in ("profile 'x'", "gpu_profiles[0]")


@pytest.mark.parametrize("default_gpus", [True, 1.0], ids=repr)
def test_default_gpus_must_be_an_integer(default_gpus):
    config = [{"display_name": "X", "slug": "x", "gpu_counts": [1, 2], "default_gpus": default_gpus}]
    try:
        profiles = load_profiles(config)
    except OptionsError as e:
        assert e.field == "profile 'x'"
        return
    # If accepted, the default must be usable by a user who does not send gpus.
    choice = parse_options({}, profiles)
    assert choice.gpus == 1 and type(choice.gpus) is int


@pytest.mark.parametrize("key, value", [("images", "python"), ("capabilities", "compute")])
def test_string_instead_of_list_is_not_split_into_characters(key, value):
    try:
        profile = one_profile(slug="x", **{key: value})
    except OptionsError as e:
        assert e.field == "profile 'x'"
        return
    assert getattr(profile, key) == (value,)


@pytest.mark.parametrize("key", ["gpu_models", "images", "capabilities"])
def test_non_list_values_are_options_errors(key):
    e = config_refusal([{"display_name": "X", "slug": "x", key: 5}])
    assert e.field == "profile 'x'" and key in str(e)


@pytest.mark.parametrize(
    "entry",
    [{"slug": "x\n"}, {"gpu_models": ["a100\n"]}, {"images": ["python:3.12\n"]}, {"capabilities": ["compute\n"]}],
    ids=repr,
)
def test_trailing_newline_is_refused_in_config(entry):
    config_refusal([{"display_name": "X", **entry}])


def test_cpu_limit_must_be_a_number():
    e = config_refusal([{"display_name": "X", "slug": "x", "cpu_limit": "lots"}])
    assert e.field == "profile 'x'" and "cpu_limit" in str(e)


# ==========================================================================
# parse_options: accepted choices
# ==========================================================================


@pytest.mark.parametrize("options", [None, {}])
def test_defaults_applied(options):
    choice = parse(options)
    assert choice == Choice(BY_SLUG["gpu"], 1, "any", None)
    assert choice.models == ()  # "any" in a profile allowing any model: no restriction
    assert choice.to_options() == {"profile": "gpu", "gpus": 1, "gpu_model": "any"}


def test_profile_default_gpus_applied():
    assert parse({"profile": "cpu"}) == Choice(BY_SLUG["cpu"], 0, "any", None)
    assert parse({"profile": "big"}).gpus == 1


def test_specific_model_choice():
    choice = parse({"profile": "gpu", "gpus": 2, "gpu_model": A100})
    assert (choice.profile.slug, choice.gpus, choice.gpu_model) == ("gpu", 2, A100)
    assert choice.models == (A100,)


def test_any_model_in_restricted_profile_gives_the_profile_patterns():
    choice = parse({"profile": "big", "gpus": 8, "gpu_model": "any"})
    assert choice.gpu_model == "any"
    assert choice.models == ("a100", "t4")


def test_restricted_profile_accepts_its_models_by_prefix():
    assert parse({"profile": "big", "gpu_model": A100}).models == (A100,)
    assert parse({"profile": "big", "gpu_model": T4}).models == (T4,)


def test_restricted_profile_matches_on_whole_words():
    profiles = load_profiles([{"display_name": "A100s", "slug": "a", "gpu_models": ["a100"], "gpu_counts": [1]}])
    assert parse_options({"gpu_model": "a100-pcie-40gb"}, profiles, {"a100-pcie-40gb", "a1000"}).models == (
        "a100-pcie-40gb",
    )
    e = pytest.raises(OptionsError, parse_options, {"gpu_model": "a1000"}, profiles, {"a100-pcie-40gb", "a1000"})
    assert e.value.field == "gpu_model"
    assert "choose one of: any, a100-pcie-40gb" in str(e.value)


def test_image_choice():
    assert parse({"profile": "gpu", "image": IMG_TORCH}).image == IMG_TORCH
    assert parse({"profile": "gpu", "image": IMG_TORCH}).to_options()["image"] == IMG_TORCH


def test_zero_gpus_allowed_where_the_profile_says_so():
    assert parse({"profile": "big", "gpus": 0}).gpus == 0


def test_to_options_round_trips():
    for options in [
        {},
        {"profile": "cpu"},
        {"profile": "gpu", "gpus": 4, "gpu_model": T4, "image": IMG_SCIPY},
        {"profile": "big", "gpus": 8, "gpu_model": "any"},
    ]:
        choice = parse(options)
        assert parse(choice.to_options()) == choice


# ==========================================================================
# parse_options: refusals a user sees
# ==========================================================================


def test_unknown_profile_lists_the_profiles():
    e = refusal({"profile": "nope"})
    assert e.field == "profile"
    assert str(e) == "profile: no profile 'nope'; choose one of: cpu, gpu, big"


def test_gpu_count_not_in_profile_lists_the_allowed_counts():
    e = refusal({"profile": "gpu", "gpus": 3})
    assert e.field == "gpus"
    assert str(e) == "gpus: 3 is not allowed in profile 'gpu'; allowed: 1, 2, 4"


def test_gpus_on_cpu_profile_refused():
    e = refusal({"profile": "cpu", "gpus": 1})
    assert e.field == "gpus"
    assert "allowed: 0" in str(e)


def test_huge_gpu_count_is_not_echoed():
    e = refusal({"gpus": 10**30})
    assert e.field == "gpus"
    assert "1000000000" not in str(e)
    assert "that number is not allowed in profile 'gpu'; allowed: 1, 2, 4" in str(e)


@pytest.mark.parametrize("value, type_name", [
    (True, "bool"), (2.0, "float"), ("2", "str"), (None, "NoneType"), ([2], "list"),
])
def test_gpus_wrong_type(value, type_name):
    e = refusal({"gpus": value})
    assert e.field == "gpus"
    assert str(e) == f"gpus: must be an integer, not {type_name}"


def test_model_not_offered_lists_the_choices():
    e = refusal({"profile": "big", "gpu_model": H100})
    assert e.field == "gpu_model"
    assert str(e) == f"gpu_model: '{H100}' is not offered in profile 'big'; choose one of: any, {A100}, t4"


def test_model_not_in_inventory_is_refused():
    e = refusal({"gpu_model": "v100"})
    assert e.field == "gpu_model"
    assert f"choose one of: any, {A100}, {H100}, t4" in str(e)


def test_model_refused_when_inventory_is_empty():
    with pytest.raises(OptionsError) as info:
        parse_options({"gpu_model": A100}, PROFILES, ())
    assert info.value.field == "gpu_model"
    assert str(info.value).endswith("choose one of: any")


def test_model_pattern_is_not_a_model_slug():
    # "a100" is a profile pattern; the user must pick a model present in the inventory.
    e = refusal({"profile": "big", "gpu_model": "a100"})
    assert e.field == "gpu_model"


def test_model_wrong_type_and_bad_characters():
    e = refusal({"gpu_model": 100})
    assert str(e) == "gpu_model: must be a string (GPU model), not int"
    e = refusal({"gpu_model": "A100"})
    assert str(e) == "gpu_model: 'A100' is not a valid GPU model"


def test_image_not_offered_lists_the_images():
    e = refusal({"profile": "gpu", "image": "evil.example/miner:latest"})
    assert e.field == "image"
    assert str(e) == (
        f"image: 'evil.example/miner:latest' is not offered in profile 'gpu'; allowed: {IMG_SCIPY}, {IMG_TORCH}"
    )


def test_image_on_fixed_image_profile():
    e = refusal({"profile": "cpu", "image": IMG_SCIPY})
    assert e.field == "image"
    assert "none (this profile has a fixed image)" in str(e)


def test_unknown_option_lists_the_allowed_options():
    e = refusal({"gpus": 1, "gpu_count": 2})
    assert e.field == "gpu_count"
    assert str(e) == "gpu_count: unknown option 'gpu_count'; allowed options: profile, gpus, gpu_model, image"


def test_not_an_object():
    e = refusal([("gpus", 1)])
    assert e.field == "user_options"
    assert str(e) == "user_options: must be a JSON object, not list"


def test_long_values_are_shortened_in_messages():
    e = refusal({"profile": "x" * 100_000})
    assert e.field == "profile"
    assert len(str(e)) < 200
    e = refusal({"k" * 100_000: 1})
    assert e.field == "k" * 40
    assert len(str(e)) < 200


# --------------------------------------------------------------- malformed corpus

_HUGE = 10**30
MALFORMED: list[tuple[object, str]] = [
    # gpus
    ({"gpus": {"$gt": 0}}, "gpus"),
    ({"gpus": [1]}, "gpus"),
    ({"gpus": []}, "gpus"),
    ({"gpus": None}, "gpus"),
    ({"gpus": -1}, "gpus"),
    ({"gpus": _HUGE}, "gpus"),
    ({"gpus": -_HUGE}, "gpus"),
    ({"gpus": "2"}, "gpus"),
    ({"gpus": ""}, "gpus"),
    ({"gpus": "1; rm -rf /"}, "gpus"),
    ({"gpus": True}, "gpus"),
    ({"profile": "cpu", "gpus": False}, "gpus"),
    ({"gpus": 2.0}, "gpus"),
    ({"gpus": 1e3}, "gpus"),
    ({"gpus": float("nan")}, "gpus"),
    ({"gpus": float("inf")}, "gpus"),
    ({"gpus": 3}, "gpus"),
    ({"gpus": 0}, "gpus"),
    ({"profile": "cpu", "gpus": 1}, "gpus"),
    ({"profile": "big", "gpus": 2}, "gpus"),
    ({"gpus": MAX_GPUS + 1}, "gpus"),
    ({"gpus": "\uff12"}, "gpus"),  # fullwidth 2
    # profile
    ({"profile": None}, "profile"),
    ({"profile": 1}, "profile"),
    ({"profile": True}, "profile"),
    ({"profile": ["gpu"]}, "profile"),
    ({"profile": {"slug": "gpu"}}, "profile"),
    ({"profile": ""}, "profile"),
    ({"profile": "GPU"}, "profile"),
    ({"profile": "../etc/passwd"}, "profile"),
    ({"profile": "gpu\n"}, "profile"),
    ({"profile": "gpu "}, "profile"),
    ({"profile": " gpu"}, "profile"),
    ({"profile": "gpu\x00"}, "profile"),
    ({"profile": "\u0261pu"}, "profile"),  # LATIN SMALL LETTER SCRIPT G
    ({"profile": "x" * 10_000}, "profile"),
    ({"profile": "nope"}, "profile"),
    ({"profile": "cpu'; DROP TABLE users;--"}, "profile"),
    # gpu_model
    ({"gpu_model": "A100"}, "gpu_model"),
    ({"gpu_model": "a100"}, "gpu_model"),
    ({"gpu_model": "../etc"}, "gpu_model"),
    ({"gpu_model": None}, "gpu_model"),
    ({"gpu_model": 100}, "gpu_model"),
    ({"gpu_model": True}, "gpu_model"),
    ({"gpu_model": [A100]}, "gpu_model"),
    ({"gpu_model": {"$ne": ""}}, "gpu_model"),
    ({"gpu_model": ""}, "gpu_model"),
    ({"gpu_model": "Any"}, "gpu_model"),
    ({"gpu_model": "*"}, "gpu_model"),
    ({"gpu_model": A100 + "\x00"}, "gpu_model"),
    ({"gpu_model": A100 + "\n"}, "gpu_model"),
    ({"gpu_model": "\uff41100"}, "gpu_model"),  # fullwidth a
    ({"gpu_model": "a" * 100_000}, "gpu_model"),
    ({"gpu_model": "v100"}, "gpu_model"),
    ({"profile": "big", "gpu_model": H100}, "gpu_model"),
    # image
    ({"image": None}, "image"),
    ({"image": 5}, "image"),
    ({"image": [IMG_SCIPY]}, "image"),
    ({"image": ""}, "image"),
    ({"image": "../../etc/passwd"}, "image"),
    ({"image": "evil.example/miner:latest"}, "image"),
    ({"image": IMG_SCIPY + " "}, "image"),
    ({"image": IMG_SCIPY + "\n"}, "image"),
    ({"image": "$(reboot)"}, "image"),
    ({"image": "i" * 10_000}, "image"),
    ({"profile": "cpu", "image": IMG_SCIPY}, "image"),
    # unknown keys
    ({"foo": 1}, "foo"),
    ({"GPUS": 1}, "GPUS"),
    ({"gpus": 1, "extra": None}, "extra"),
    ({"__proto__": {"admin": True}}, "__proto__"),
    ({"user_options": {"gpus": 1}}, "user_options"),
    ({"kubespawner_override": {"image": "evil"}}, "kubespawner_override"),
    ({"gpu_count": 2}, "gpu_count"),
    ({"gpus ": 1}, "gpus "),
    ({"images": [IMG_SCIPY]}, "images"),
    ({"\u00e9": 1}, "\u00e9"),
    # not an object at all
    ([], "user_options"),
    ([["gpus", 2]], "user_options"),
    ("gpus=2", "user_options"),
    (2, "user_options"),
    (True, "user_options"),
    (b"{}", "user_options"),
]


def test_corpus_is_large_and_distinct():
    assert len(MALFORMED) >= 50
    assert len({repr(body) for body, _ in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize("body, field", MALFORMED, ids=[f"{n}-{f}" for n, (_, f) in enumerate(MALFORMED)])
def test_malformed_body_is_refused_with_its_field(body, field):
    e = refusal(body)
    assert e.field == field
    message = str(e)
    assert message.startswith(f"{field}: ")
    assert len(message) < 300, message  # never echoes huge input
    assert "Traceback" not in message


# --------------------------------------------------------------- property

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-3, max_value=10),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["cpu", "gpu", "big", "any", A100, T4, H100, "a100", IMG_SCIPY, IMG_TORCH, ""]),
)
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_option_bodies = st.one_of(
    _json,
    st.dictionaries(st.sampled_from(OPTION_KEYS) | st.text(max_size=8), _json, max_size=5),
    st.fixed_dictionaries(
        {},
        optional={
            "profile": st.sampled_from(["cpu", "gpu", "big"]) | _scalars,
            "gpus": st.sampled_from([0, 1, 2, 4, 8]) | _scalars,
            "gpu_model": st.sampled_from(["any", A100, T4, H100]) | _scalars,
            "image": st.sampled_from([IMG_SCIPY, IMG_TORCH]) | _scalars,
        },
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_option_bodies)
def test_parse_options_returns_a_valid_choice_or_options_error(body):
    try:
        choice = parse(body)
    except OptionsError as e:
        assert isinstance(e.field, str)
        assert str(e).startswith(f"{e.field}: ")
        known_fields = {"user_options", *OPTION_KEYS}
        unknown_keys = {field_name(k) for k in body} if isinstance(body, dict) else set()  # unprintable: escaped
        assert e.field in known_fields | unknown_keys
        return
    # Accepted: the choice keeps every rule of its profile.
    assert isinstance(body, dict) or body is None
    body = body or {}
    profile = choice.profile
    assert profile in PROFILES
    assert profile.slug == body.get("profile", "gpu")
    assert type(choice.gpus) is int and choice.gpus in profile.gpu_counts
    assert choice.gpus == body.get("gpus", profile.default_gpus)
    if choice.gpu_model != "any":
        assert choice.gpu_model in MODELS_PRESENT and profile.allows_model(choice.gpu_model)
    assert choice.gpu_model == (body.get("gpu_model") or "any")
    assert choice.image is None or choice.image in profile.images
    assert choice.image == body.get("image")
    assert set(body) <= set(OPTION_KEYS)


# ==========================================================================
# options_from_form
# ==========================================================================


def test_form_uses_the_fields_of_the_chosen_profile():
    form = {
        "profile": ["gpu"],
        "gpus-gpu": ["2"],
        "gpu_model-gpu": [T4],
        "image-gpu": [IMG_TORCH],
        # fields of the other profiles are in every submitted form and must be ignored
        "gpus-cpu": ["0"],
        "gpus-big": ["8"],
        "gpu_model-big": [H100],
        "image-big": ["other"],
    }
    assert options_from_form(form) == {"profile": "gpu", "gpus": 2, "gpu_model": T4, "image": IMG_TORCH}


def test_form_fields_of_other_profiles_do_not_leak():
    form = {"profile": ["cpu"], "gpus-cpu": ["0"], "gpus-gpu": ["4"], "gpu_model-gpu": [A100], "image-gpu": [IMG_SCIPY]}
    assert options_from_form(form) == {"profile": "cpu", "gpus": 0}


def test_form_invalid_field_of_another_profile_is_ignored():
    form = {"profile": ["cpu"], "gpus-gpu": ["lots"], "gpus-big": ["1", "2"]}
    assert options_from_form(form) == {"profile": "cpu"}


def test_form_plain_names_accepted():
    form = {"profile": ["gpu"], "gpus": ["2"], "gpu_model": [A100], "image": [IMG_SCIPY]}
    assert options_from_form(form) == {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": IMG_SCIPY}
    assert options_from_form({"gpus": ["4"]}) == {"gpus": 4}


def test_form_per_profile_field_wins_over_plain_name():
    assert options_from_form({"profile": ["gpu"], "gpus": ["4"], "gpus-gpu": ["2"]})["gpus"] == 2


def test_form_empty_values_are_left_out():
    assert options_from_form({}) == {}
    assert options_from_form({"profile": ["gpu"], "gpus-gpu": [""], "gpu_model-gpu": [""], "image-gpu": []}) == {
        "profile": "gpu"
    }


@pytest.mark.parametrize("field", ["profile", "gpus-gpu", "gpu_model-gpu", "image-gpu", "gpus"])
def test_form_repeated_field_refused(field):
    form = {"profile": ["gpu"], field: ["1", "2"]}
    if field == "profile":
        form = {"profile": ["gpu", "cpu"]}
    with pytest.raises(OptionsError) as info:
        options_from_form(form)
    # the field is named as in the user_options contract, whatever the form field was called
    assert info.value.field == field.split("-")[0]
    assert "more than once" in str(info.value)


@pytest.mark.parametrize(
    "value", ["two", "-1", "+1", "1.5", "1e3", "0x2", " ", "1 2", "99999", "2;rm", "\u00b2", "\u00bd"], ids=repr
)
def test_form_non_digit_count_refused(value):
    with pytest.raises(OptionsError) as info:
        options_from_form({"profile": ["gpu"], "gpus-gpu": [value]})
    assert info.value.field == "gpus"
    assert "is not a whole number" in str(info.value)


def test_form_count_leading_zeros_and_spaces():
    assert options_from_form({"profile": ["gpu"], "gpus-gpu": ["02"]})["gpus"] == 2
    assert options_from_form({"profile": ["gpu"], "gpus-gpu": [" 4 "]})["gpus"] == 4


@pytest.mark.parametrize("value", ["\uff12", "\u0662", "\u0968"])
def test_form_non_ascii_digits_refused(value):
    with pytest.raises(OptionsError):
        options_from_form({"profile": ["gpu"], "gpus-gpu": [value]})


def test_form_values_are_checked_by_parse_options():
    # options_from_form only converts types; the checks happen in parse_options.
    options = options_from_form({"profile": ["gpu"], "gpus-gpu": ["3"], "gpu_model-gpu": ["A100"]})
    e = refusal(options)
    assert e.field == "gpus"


REST_AND_FORM = [
    ({}, {}),
    ({"profile": "cpu"}, {"profile": ["cpu"], "gpus-cpu": ["0"], "gpus-gpu": ["1"], "gpu_model-gpu": ["any"]}),
    ({"profile": "cpu", "gpus": 0}, {"profile": ["cpu"], "gpus-cpu": ["0"]}),
    (
        {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": IMG_TORCH},
        {"profile": ["gpu"], "gpus-gpu": ["2"], "gpu_model-gpu": [A100], "image-gpu": [IMG_TORCH],
         "gpus-big": ["8"], "gpu_model-big": [T4]},
    ),
    ({"profile": "gpu", "gpus": 4, "gpu_model": "any"}, {"profile": ["gpu"], "gpus": ["4"], "gpu_model": ["any"]}),
    ({"profile": "big", "gpus": 8, "gpu_model": T4}, {"profile": ["big"], "gpus-big": ["8"], "gpu_model-big": [T4]}),
    ({"profile": "big", "gpus": 0}, {"profile": ["big"], "gpus-big": ["0"], "gpus-gpu": ["4"]}),
]


@pytest.mark.parametrize("rest, form", REST_AND_FORM)
def test_form_and_rest_give_the_same_choice(rest, form):
    assert parse(options_from_form(form)) == parse(rest)


@pytest.mark.parametrize(
    "rest, form",
    [
        ({"profile": "gpu", "gpus": 3}, {"profile": ["gpu"], "gpus-gpu": ["3"]}),
        ({"profile": "big", "gpu_model": H100}, {"profile": ["big"], "gpu_model-big": [H100]}),
        ({"profile": "nope"}, {"profile": ["nope"]}),
        ({"profile": "cpu", "image": IMG_SCIPY}, {"profile": ["cpu"], "image-cpu": [IMG_SCIPY]}),
    ],
)
def test_form_and_rest_give_the_same_refusal(rest, form):
    rest_error = refusal(rest)
    form_error = refusal(options_from_form(form))
    assert (form_error.field, str(form_error)) == (rest_error.field, str(rest_error))


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["profile", "gpus", "gpu_model", "image", "gpus-gpu", "gpu_model-gpu", "image-gpu",
                         "gpus-cpu", "other"]) | st.text(max_size=10),
        st.lists(st.text(max_size=6) | st.sampled_from(["gpu", "cpu", "1", "2", A100]), max_size=3),
        max_size=6,
    )
)
def test_options_from_form_never_crashes(form):
    try:
        options = options_from_form(form)
    except OptionsError as e:
        assert isinstance(e.field, str) and e.field
        return
    assert set(options) <= set(OPTION_KEYS)
    assert "gpus" not in options or (type(options["gpus"]) is int and options["gpus"] >= 0)
    try:
        parse(options)
    except OptionsError:
        pass


def test_gpu_profiles_help_explains_every_key_a_profile_accepts():
    message = str(config_refusal([{"display_name": "X", "no_such_key": 1}]))
    known = ast.literal_eval(re.search(r"known keys: (\[.*\])", message).group(1))
    assert {"groups", "queue", "kubespawner_override"} <= set(known)
    help_text = GPUSpawnerMixin.class_traits()["gpu_profiles"].help
    assert [k for k in known if f"- ``{k}``:" not in help_text] == []


# ==========================================================================
# Beside the parent spawner: offered images, site keys, a hub without GPUs
# ==========================================================================

#: DockerSpawner's allowed_images (name in its picker -> image)
ALLOWED = {"4.0": "quay.io/jupyterhub/singleuser:4.0", "Python 3 (CPU)": "quay.io/jupyterhub/singleuser:4"}


def test_offered_images_are_what_profiles_without_images_take():
    cpu = parse_options({"profile": "cpu", "image": "Python 3 (CPU)"}, PROFILES, (), offered_images=ALLOWED)
    assert cpu.image == "Python 3 (CPU)"  # the picker's name (which need not look like an image)
    any_image = parse_options({"profile": "cpu", "image": "example.org/mine:1"}, PROFILES, (), offered_images="*")
    assert any_image.image == "example.org/mine:1"
    # a profile with images of its own offers those, and only those
    own = parse_options({"profile": "gpu", "image": IMG_TORCH}, PROFILES, (), offered_images=ALLOWED)
    assert own.image == IMG_TORCH
    for options, offered, allowed in [
        ({"profile": "gpu", "image": "4.0"}, ALLOWED, f"{IMG_SCIPY}, {IMG_TORCH}"),
        ({"profile": "cpu", "image": "3.0"}, ALLOWED, "4.0, Python 3 (CPU)"),
        ({"profile": "cpu", "image": "4.0"}, None, "none (this profile has a fixed image)"),
        ({"profile": "cpu", "image": "4.0"}, {}, "none (this profile has a fixed image)"),
    ]:
        with pytest.raises(OptionsError) as info:
            parse_options(options, PROFILES, (), offered_images=offered)
        assert str(info.value) == (f"image: {options['image']!r} is not offered in profile '{options['profile']}'; "
                                   f"allowed: {allowed}")
    for bad in ("", "$(reboot)", "x" * 300, "a b"):  # any image, but a well-formed name
        with pytest.raises(OptionsError) as info:
            parse_options({"profile": "cpu", "image": bad}, PROFILES, (), offered_images="*")
        assert info.value.field == "image" and len(str(info.value)) < 300


@settings(max_examples=150, deadline=None)
@given(image=st.text(max_size=40) | st.sampled_from(sorted(ALLOWED) + list(ALLOWED.values())),
       offered=st.sampled_from([None, "*", ALLOWED]), profile=st.sampled_from(["cpu", "gpu", "big"]))
def test_an_image_is_offered_or_refused_naming_the_field(image, offered, profile):
    try:
        choice = parse_options({"profile": profile, "image": image}, PROFILES, (), offered_images=offered)
    except OptionsError as e:
        assert e.field == "image" and len(str(e)) < 400
        return
    chosen = BY_SLUG[profile]
    assert choice.image == image
    if chosen.images:
        assert image in chosen.images
    elif offered != "*":
        assert image in (offered or {})


def test_site_keys_are_left_for_the_site_only_when_it_reads_options():
    with pytest.raises(OptionsError) as info:
        parse({"profile": "cpu", "flavor": "vanilla"})
    assert info.value.field == "flavor"
    choice = parse_options({"profile": "cpu", "flavor": "vanilla"}, PROFILES, MODELS_PRESENT, site_keys=True)
    assert choice == Choice(BY_SLUG["cpu"], 0, "any", None)
    with pytest.raises(OptionsError) as info:  # gpuspawner's own keys are still checked
        parse_options({"profile": "cpu", "gpus": 2, "flavor": "x"}, PROFILES, MODELS_PRESENT, site_keys=True)
    assert info.value.field == "gpus"


def test_without_gpus_offers_the_profiles_that_run_without_one():
    cpu_first = without_gpus(PROFILES)
    assert [p.slug for p in cpu_first] == ["cpu", "big"]
    assert [p.default_gpus for p in cpu_first] == [0, 0]
    assert default_profile(cpu_first).slug == "cpu"  # the configured default ("gpu") needs a GPU
    big_default = load_profiles([
        CONFIG[0], {**CONFIG[1], "default": False}, {**CONFIG[2], "default": True}])
    assert default_profile(without_gpus(big_default)).slug == "big"  # the default, where it runs without one
    only_gpus = load_profiles([CONFIG[1]])
    assert without_gpus(only_gpus) == only_gpus


def test_a_hub_without_gpus_defaults_to_a_server_without_one():
    """No profile or count named: no GPU; one that asks for GPUs is still checked (placement refuses it)."""
    assert parse_options({}, PROFILES, (), no_gpus=True) == Choice(BY_SLUG["cpu"], 0)
    assert parse_options({"profile": "big"}, PROFILES, (), no_gpus=True).gpus == 0
    assert parse_options({"profile": "big", "gpus": 8}, PROFILES, (), no_gpus=True).gpus == 8
    assert parse_options({"profile": "gpu"}, PROFILES, (), no_gpus=True).gpus == 1  # needs one: placement says no
    assert parse_options({}, PROFILES, ()) == Choice(BY_SLUG["gpu"], 1)  # GPUs found: the configured default


def test_form_fields_that_are_gpuspawners():
    slugs = ("cpu", "gpu")
    assert all(is_form_field(f, slugs) for f in ("profile", "gpus", "gpu_model", "image", "gpus-gpu",
                                                   "image-cpu", "gpu_model-gpu"))
    assert not any(is_form_field(f, slugs) for f in ("flavor", "image-size", "gpus-big", "profile-x", "_xsrf"))


def test_form_plain_image_is_dockerspawners_field_first_value_counts():
    """DockerSpawner's own picker field ``image``: its first value, as DockerSpawner reads it."""
    assert options_from_form({"image": ["1.0", "1.1"]}) == {"image": "1.0"}
    with pytest.raises(OptionsError):
        options_from_form({"profile": ["gpu"], "image-gpu": ["a", "b"]})
