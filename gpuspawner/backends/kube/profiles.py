"""gpu-kube's profiles: KubeSpawner's ``profile_list`` with gpuspawner's GPU choices added. Pure.

gpu-kube offers KubeSpawner's own profile model (``c.KubeSpawner.profile_list``,
z2jh's ``singleuser.profileList``): entries with ``display_name``, ``slug``,
``description``, ``default``, ``kubespawner_override`` and ``profile_options``
(``choices``, ``unlisted_choice``), which KubeSpawner's own code initialises,
validates and applies. gpuspawner adds to an entry:

- GPU keys (``gpu_models``, ``gpu_counts``, ``default_gpus``, ``capabilities``,
  ``groups``, ``queue``, ``kueue``): the user picks a GPU count and model beside the
  entry's other options (user_options ``gpus`` and ``gpu_model``);
- or, without them, the GPU the override asks for
  (``extra_resource_limits: {"nvidia.com/gpu": 1}``, a MIG resource such as
  ``nvidia.com/mig-1g.10gb``, ``nvidia.com/gpu.shared``), checked against the
  cluster's capacity like any GPU choice.

``c.GPUSpawnerMixin.gpu_profiles`` entries become such entries
(:func:`entry_from_gpu_profile`): ``cpu_limit``/``mem_limit`` go into the
override, ``images`` become a profile option ``image`` whose choices are the
image names. This module checks entries (:func:`check_entries`) so that a key
gpu-kube cannot honour is refused, naming it, instead of being dropped.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...profiles import DEFAULT_PROFILES, OptionsError, Profile, _slugify, profile_from_config

#: KubeSpawner's profile_list entry keys (kubespawner 7).
KUBE_KEYS = frozenset({"display_name", "slug", "description", "default", "kubespawner_override", "profile_options"})
#: gpuspawner's keys an entry may add.
GPU_KEYS = frozenset({"gpu_models", "gpu_counts", "default_gpus", "capabilities", "groups", "queue", "kueue"})
#: user_options gpuspawner adds beside a profile's options: no profile option may use these names.
GPU_OPTIONS = ("gpus", "gpu_model")
IMAGE_OPTION = "image"
UNLISTED = "--unlisted-choice"
_OPTION_KEYS = frozenset({"display_name", "choices", "unlisted_choice"})
_CHOICE_KEYS = frozenset({"display_name", "default", "kubespawner_override"})
_UNLISTED_KEYS = frozenset({"enabled", "display_name", "display_name_in_choices", "validation_regex",
                            "validation_message", "kubespawner_override"})


def entry_from_gpu_profile(entry: Mapping[str, Any], position: int) -> dict[str, Any]:
    """A ``gpu_profiles`` entry as a KubeSpawner profile_list entry with GPU keys.

    The entry is checked first (OptionsError names the key).
    """
    profile = profile_from_config(entry, position, honour_all=True)
    out: dict[str, Any] = {
        "display_name": profile.display_name,
        "slug": profile.slug,
        "description": profile.description,
        "default": profile.default,
        "gpu_models": list(profile.gpu_models),
        "gpu_counts": list(profile.gpu_counts),
        "default_gpus": profile.default_gpus,
        "capabilities": list(profile.capabilities),
        "groups": list(profile.groups),
        "queue": profile.queue,
    }
    if profile.kueue:
        out["kueue"] = profile.kueue
    override = copy.deepcopy(dict(entry.get("kubespawner_override") or {}))
    for key in ("cpu_limit", "mem_limit"):
        if key in entry:
            override[key] = entry[key]
    if override:
        out["kubespawner_override"] = override
    if profile.images:
        out["profile_options"] = {IMAGE_OPTION: {
            "display_name": "Image",
            "choices": {image: {"display_name": image, "default": n == 0, "kubespawner_override": {"image": image}}
                        for n, image in enumerate(profile.images)},
        }}
    return out


def combined_entries(gpu_profiles: Sequence[Mapping], profile_list: Sequence[Mapping]) -> list[dict]:
    """What gpu-kube offers: ``gpu_profiles`` (as entries), then ``profile_list``.

    Without either, gpuspawner's default profiles; with only ``profile_list``, just those.
    The default profile is the one marked ``default``; where none is, it is the one
    KubeSpawner would pick from the site's ``profile_list``, its first entry (adding
    ``gpu_profiles`` beside a ``profile_list`` does not change what a user who picks
    nothing gets), and without ``profile_list`` the first of ``gpu_profiles``.
    """
    listed = [copy.deepcopy(dict(e)) if isinstance(e, Mapping) else e for e in profile_list or []]
    own = gpu_profiles or ([] if listed else DEFAULT_PROFILES)
    entries = [entry_from_gpu_profile(e, n) for n, e in enumerate(own)] + listed
    marked = any(isinstance(e, Mapping) and e.get("default") for e in entries)
    if own and listed and isinstance(listed[0], dict) and not marked:
        listed[0]["default"] = True
    return entries


def _where(entry: Any, position: int) -> str:
    slug = entry.get("slug") if isinstance(entry, Mapping) else None
    return f"profile '{slug}'" if isinstance(slug, str) else f"profile_list[{position}]"


def _check_option(name: Any, option: Any, where: str) -> None:
    if not isinstance(name, str) or not name or "--" in name:
        raise OptionsError(where, f"profile_options key {name!r} must be a name without '--'")
    if name in GPU_OPTIONS:
        raise OptionsError(where, f"profile_options '{name}' is gpuspawner's own option; "
                                  "use gpu_counts/gpu_models for GPU choices or rename the option")
    if not isinstance(option, Mapping):
        raise OptionsError(where, f"profile_options '{name}' must be a dict")
    unknown = sorted(set(option) - _OPTION_KEYS)
    if unknown:
        raise OptionsError(where, f"profile_options '{name}': unknown keys {unknown}; known: {sorted(_OPTION_KEYS)}")
    choices = option.get("choices") or {}
    if not isinstance(choices, Mapping):
        raise OptionsError(where, f"profile_options '{name}'.choices must be a dict")
    for key, choice in choices.items():
        if not isinstance(choice, Mapping) or set(choice) - _CHOICE_KEYS:
            raise OptionsError(where, f"profile_options '{name}'.choices '{key}' must be a dict with keys "
                                      f"{sorted(_CHOICE_KEYS)}")
        if not isinstance(choice.get("kubespawner_override", {}), Mapping):
            raise OptionsError(where, f"profile_options '{name}'.choices '{key}'.kubespawner_override must be a dict")
    unlisted = option.get("unlisted_choice") or {}
    if not isinstance(unlisted, Mapping) or set(unlisted) - _UNLISTED_KEYS:
        raise OptionsError(where, f"profile_options '{name}'.unlisted_choice must be a dict with keys "
                                  f"{sorted(_UNLISTED_KEYS)}")
    regex = unlisted.get("validation_regex")
    if regex is not None:
        try:
            re.compile(regex)
        except (re.error, TypeError) as e:
            raise OptionsError(where, f"profile_options '{name}'.unlisted_choice.validation_regex: {e}") from e
    if not choices and not unlisted.get("enabled"):
        raise OptionsError(where, f"profile_options '{name}' offers nothing: give choices or enable unlisted_choice")


def gpu_profile(entry: Mapping[str, Any], position: int) -> Profile:
    """Check one profile_list entry (KubeSpawner's keys plus gpuspawner's GPU keys); its GPU choices."""
    where = _where(entry, position)
    if not isinstance(entry, Mapping):
        raise OptionsError(where, f"must be a dict, not {type(entry).__name__}")
    unknown = sorted(set(entry) - KUBE_KEYS - GPU_KEYS)
    if unknown:
        raise OptionsError(where, f"unknown keys {unknown}; gpu-kube honours KubeSpawner's "
                                  f"{sorted(KUBE_KEYS)} and gpuspawner's {sorted(GPU_KEYS)}")
    options = entry.get("profile_options") or {}
    if not isinstance(options, Mapping):
        raise OptionsError(where, "profile_options must be a dict")
    for name, option in options.items():
        _check_option(name, option, where)
    gpu = {k: v for k, v in entry.items() if k in GPU_KEYS or k in ("display_name", "description", "default")}
    gpu["kubespawner_override"] = entry.get("kubespawner_override") or {}
    slug = entry.get("slug")
    if slug is not None and not isinstance(slug, str):
        raise OptionsError(where, f"slug {slug!r} must be a string")
    display = entry.get("display_name")
    if not isinstance(display, str) or not display.strip():
        raise OptionsError(where, "needs a 'display_name' string")
    # KubeSpawner's slugs may hold characters gpuspawner's do not: checked as a tame one, kept as given
    gpu["slug"] = _slugify(slug or display)
    profile = profile_from_config(gpu, position, honour_all=True)
    return dataclasses.replace(profile, slug=slug or profile.slug)


def check_entries(entries: Sequence[Mapping], kueue_queue_name: str | None = None) -> tuple[Profile, ...]:
    """Check what gpu-kube offers: each entry, unique slugs, at most one default; the GPU part of each."""
    profiles = tuple(gpu_profile(e, n) for n, e in enumerate(entries))
    slugs = [p.slug for p in profiles]
    repeated = sorted({s for s in slugs if slugs.count(s) > 1})
    if repeated:
        raise OptionsError("profile_list", f"slugs must be unique across gpu_profiles and profile_list; "
                                           f"repeated: {repeated}")
    if sum(bool(e.get("default")) for e in entries) > 1:
        raise OptionsError("profile_list", "at most one profile may be the default")
    refuse_queue(profiles, kueue_queue_name)
    return profiles


def refuse_queue(profiles: Sequence[Profile], kueue_queue_name: str | None = None) -> None:
    """A ``queue: true`` profile whose pods go to a Kueue queue is refused: Kueue is its queue.

    Other ``queue: true`` profiles wait in the hub's queue until the cluster has room.
    """
    for p in profiles:
        if p.queue and (p.kueue or kueue_queue_name):
            raise OptionsError(
                f"profile {p.slug!r}",
                f"sets 'queue': True and sends its pods to the Kueue queue {p.kueue or kueue_queue_name!r}: "
                "Kueue is the queue, and the hub never runs a queue of its own beside it. Remove 'queue' from it.")


__all__ = [
    "GPU_KEYS",
    "GPU_OPTIONS",
    "IMAGE_OPTION",
    "KUBE_KEYS",
    "UNLISTED",
    "check_entries",
    "combined_entries",
    "entry_from_gpu_profile",
    "gpu_profile",
    "refuse_queue",
]
