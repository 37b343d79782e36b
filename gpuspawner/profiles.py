"""GPU profiles and the user_options contract.

Admins describe profiles in configuration (``c.GPUSpawner.gpu_profiles``);
:func:`load_profiles` checks them once at hub start and turns them into
:class:`Profile` values. Users choose through the spawn form or the REST API;
both give the same ``user_options`` dict, which :func:`parse_options` checks
against the profiles and the GPU models present, giving a :class:`Choice` or an
:class:`OptionsError` that names the field.

The contract (identical for the form and ``POST /hub/api/users/NAME/server``):

=============  ======================================================
``profile``    a profile slug (default: the profile marked default)
``gpus``       an integer >= 0, one of the profile's ``gpu_counts``
``gpu_model``  a model slug shown in the form, or ``"any"``
``image``      optional, one of the profile's ``images``; for a profile
               without ``images``, one the backend offers beside the
               profiles (gpu-docker: DockerSpawner's ``allowed_images``)
=============  ======================================================

On a hub that found no GPU at all, the defaults are those of :func:`without_gpus`:
a request that names no profile or count gets a server without a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .gpu import model_slug, slug_matches
from .inputs import OptionsError, field_name, shown
from .topology import INTERCONNECTS

OPTION_KEYS = ("profile", "gpus", "gpu_model", "image")
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
MAX_GPUS = 1024  # more than any machine holds; anything larger is nonsense input


@dataclass(frozen=True)
class Profile:
    slug: str
    display_name: str
    description: str = ""
    gpu_models: tuple[str, ...] = ("any",)
    gpu_counts: tuple[int, ...] = (0,)
    default_gpus: int = 0
    images: tuple[str, ...] = ()
    cpu_limit: float | None = None
    mem_limit: str | int | None = None
    default: bool = False
    capabilities: tuple[str, ...] = ("compute", "utility")
    groups: tuple[str, ...] = ()  # empty: everyone; else only members of one of these JupyterHub groups
    queue: bool = False  # when no GPU is free, wait in the hub's queue instead of being refused
    slurm: tuple[tuple[str, str], ...] = ()  # gpu-slurm job settings: (("partition", "gpu"), ("time", "8:00:00"))
    interconnect: str | None = None  # "nvlink": multi-GPU servers only on GPUs NVLink joins (placement)
    kueue: str | None = None  # gpu-kube: the Kueue LocalQueue the profile's pods go to

    def visible_to(self, user_groups: Iterable[str]) -> bool:
        """Whether a member of ``user_groups`` may see and use this profile."""
        return not self.groups or not set(self.groups).isdisjoint(user_groups)

    @property
    def max_gpus(self) -> int:
        return max(self.gpu_counts)

    def allows_model(self, slug: str) -> bool:
        return any(slug_matches(p, slug) for p in self.gpu_models)


@dataclass(frozen=True)
class Choice:
    """A validated user choice."""

    profile: Profile
    gpus: int
    gpu_model: str = "any"
    image: str | None = None

    @property
    def models(self) -> tuple[str, ...]:
        """Model patterns placement may use, in preference order."""
        if self.gpu_model != "any":
            return (self.gpu_model,)
        if "any" in self.profile.gpu_models:
            return ()
        return self.profile.gpu_models

    def to_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"profile": self.profile.slug, "gpus": self.gpus, "gpu_model": self.gpu_model}
        if self.image:
            options["image"] = self.image
        return options


# ---------------------------------------------------------------- configuration

DEFAULT_PROFILES: tuple[dict, ...] = (
    {
        "slug": "cpu",
        "display_name": "CPU only",
        "description": "No GPU: for data preparation and light work.",
        "gpu_counts": [0],
    },
    {
        "slug": "gpu",
        "display_name": "GPU notebook",
        "description": "Exclusive GPUs of the model you pick, visible only to your server.",
        "gpu_models": ["any"],
        "gpu_counts": [1, 2, 4],
        "default_gpus": 1,
        "default": True,
    },
)

_PROFILE_KEYS = {
    "slug", "display_name", "description", "gpu_models", "gpu_counts", "default_gpus",
    "images", "cpu_limit", "mem_limit", "default", "capabilities", "groups", "queue", "slurm",
    "interconnect", "kueue",
    # KubeSpawner-style profile_list entries
    "kubespawner_override",
}


#: A Kueue LocalQueue name (a Kubernetes object name that is also a label value).
KUEUE_QUEUE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")

#: Keys of a profile's ``slurm`` settings (gpu-slurm): each one an ``sbatch`` option.
SLURM_KEYS = ("partition", "time", "qos", "account", "reservation", "constraint")
_SLURM_VALUE = re.compile(r"[A-Za-z0-9_.:,+@&|!-]{1,128}")


def _slurm_settings(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise OptionsError(where, f"slurm must be a dict with keys from {', '.join(SLURM_KEYS)}")
    unknown = sorted(str(k) for k in value if k not in SLURM_KEYS)
    if unknown:
        raise OptionsError(where, f"slurm keys {unknown} are unknown; known keys: {', '.join(SLURM_KEYS)}")
    for key, text in value.items():
        if not isinstance(text, str) or not _SLURM_VALUE.fullmatch(text):
            raise OptionsError(where, f"slurm.{key} {text!r} must be a Slurm name or time such as 'gpu' or '8:00:00'")
    return tuple((k, value[k]) for k in SLURM_KEYS if k in value)


def _slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower())[:63].strip("-") or "profile"


#: kubespawner_override keys every backend honours; gpu-kube (KubeSpawner) honours every key.
OVERRIDE_KEYS = ("extra_resource_limits", "extra_resource_guarantees", "cpu_limit", "mem_limit", "image")

_MIG_RESOURCE = re.compile(r"nvidia\.com/mig-([0-9]+g)\.([0-9]+gb)")
_PRODUCT_LABEL = "nvidia.com/gpu.product"


def gpu_resource_choice(override: Mapping, where: str) -> dict:
    """``gpu_counts`` and ``gpu_models`` from the NVIDIA resources a kubespawner_override asks for.

    ``nvidia.com/gpu`` is whole GPUs (of the model a ``nvidia.com/gpu.product`` node selector
    names, else any), ``nvidia.com/mig-1g.10gb`` a MIG slice of that size, ``nvidia.com/gpu.shared``
    a time-sliced GPU. Limits are read, else guarantees; any other ``nvidia.com/`` resource, two of
    them, or a count that is not a whole number is refused.
    """
    found: dict[str, Any] = {}
    for key in ("extra_resource_limits", "extra_resource_guarantees"):
        values = override.get(key) or {}
        if not isinstance(values, Mapping):
            raise OptionsError(where, f"kubespawner_override.{key} must be a dict")
        gpu = {str(k): v for k, v in values.items() if str(k).startswith("nvidia.com/")}
        if gpu and not found:
            found = gpu
    if not found:
        return {}
    if len(found) > 1:
        raise OptionsError(where, f"kubespawner_override asks for several GPU resources {sorted(found)}; "
                                  "one pod gets one")
    ((resource, limit),) = found.items()
    if isinstance(limit, str) and re.fullmatch(r"[0-9]{1,4}", limit):
        limit = int(limit)
    if type(limit) is not int:
        raise OptionsError(where, f"{resource} limit {limit!r} must be a whole number")
    mig = _MIG_RESOURCE.fullmatch(resource)
    if resource == "nvidia.com/gpu":
        selector = override.get("node_selector") or {}
        product = selector.get(_PRODUCT_LABEL) if isinstance(selector, Mapping) else None
        models = [model_slug(product)] if isinstance(product, str) and product else ["any"]
    elif mig:
        models = [f"mig-{mig.group(1)}-{mig.group(2)}"]
    elif resource == "nvidia.com/gpu.shared":
        models = ["shared"]
    else:
        raise OptionsError(where, f"kubespawner_override resource {resource!r} is not a GPU resource gpuspawner "
                                  "knows (nvidia.com/gpu, nvidia.com/mig-<size>, nvidia.com/gpu.shared)")
    return {"gpu_counts": [limit], "gpu_models": models}


def _from_kubespawner_override(override: Any, where: str, honour_all: bool = False) -> dict:
    """The parts of a KubeSpawner profile override that a GPU profile understands.

    Without ``honour_all`` (backends other than gpu-kube) a key this backend cannot
    apply, or a resource other than a GPU, is refused rather than dropped.
    """
    if not isinstance(override, Mapping):
        raise OptionsError(where, "kubespawner_override must be a dict")
    values: dict[str, Any] = gpu_resource_choice(override, where)
    if honour_all:
        return values
    unknown = sorted(str(k) for k in override if k not in OVERRIDE_KEYS)
    if unknown:
        raise OptionsError(where, f"kubespawner_override keys {unknown} are only honoured by gpu-kube (KubeSpawner); "
                                  f"this backend honours {', '.join(OVERRIDE_KEYS)}")
    for key in ("extra_resource_limits", "extra_resource_guarantees"):
        other = sorted(str(k) for k in (override.get(key) or {}) if not str(k).startswith("nvidia.com/"))
        if other:
            raise OptionsError(where, f"kubespawner_override.{key} {other}: only GPU resources are honoured "
                                      "outside gpu-kube")
    for key in ("cpu_limit", "mem_limit"):
        if key in override:
            values[key] = override[key]
    if "image" in override:
        values["images"] = [override["image"]]
    return values


def _words(value: Any, pattern: re.Pattern, where: str, key: str, what: str, lower: bool = False) -> tuple[str, ...]:
    """A configured list of names (a lone string counts as a list of one)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise OptionsError(where, f"{key} must be a list of {what}")
    words = tuple(v.lower() if lower and isinstance(v, str) else v for v in value)
    if any(not isinstance(w, str) or not pattern.fullmatch(w) for w in words):
        raise OptionsError(where, f"{key} must be a list of {what}")
    return words


def profile_from_config(entry: Mapping, position: int = 0, honour_all: bool = False) -> Profile:
    """Check one configured profile; raise OptionsError naming the bad key.

    ``honour_all``: every ``kubespawner_override`` key is applied by the backend (gpu-kube).
    """
    where = f"gpu_profiles[{position}]"
    if not isinstance(entry, Mapping):
        raise OptionsError(where, f"must be a dict, not {type(entry).__name__}")
    unknown = set(entry) - _PROFILE_KEYS
    if unknown:
        raise OptionsError(where, f"unknown keys {sorted(unknown)}; known keys: {sorted(_PROFILE_KEYS)}")
    values = dict(entry)
    derived = _from_kubespawner_override(values.pop("kubespawner_override", None) or {}, where, honour_all)
    if "gpu_counts" in entry or "gpu_models" in entry:  # the profile's own GPU choices win
        derived = {k: v for k, v in derived.items() if k not in ("gpu_counts", "gpu_models")}
    values.update({k: v for k, v in derived.items() if k not in entry})
    display = values.get("display_name")
    if not isinstance(display, str) or not display.strip():
        raise OptionsError(where, "needs a 'display_name' string")
    slug = values.get("slug") or _slugify(display)
    if not isinstance(slug, str) or not _SLUG.fullmatch(slug):
        raise OptionsError(where, f"slug {slug!r} must be lowercase letters, digits and dashes")
    where = f"profile '{slug}'"
    counts = values.get("gpu_counts", [0])
    if (not isinstance(counts, (list, tuple)) or not counts
            or any(type(c) is not int or not 0 <= c <= MAX_GPUS for c in counts)):
        raise OptionsError(where, f"gpu_counts must be a non-empty list of integers 0..{MAX_GPUS}")
    counts = tuple(sorted(set(counts)))
    default_gpus = values.get("default_gpus", counts[0])
    if type(default_gpus) is not int or default_gpus not in counts:
        raise OptionsError(where, f"default_gpus {default_gpus!r} is not one of gpu_counts {list(counts)}")
    models = _words(values.get("gpu_models", ["any"]), _SLUG, where, "gpu_models",
                    "model slugs such as 'a100' or 'any'", lower=True)
    if not models:
        raise OptionsError(where, "gpu_models must name at least one model, or 'any'")
    images = _words(values.get("images", []), _IMAGE, where, "images", "image names")
    capabilities = _words(values.get("capabilities", ["compute", "utility"]), _SLUG, where,
                          "capabilities", "words such as 'compute'")
    groups = values.get("groups", [])
    if isinstance(groups, str):
        groups = [groups]
    if (not isinstance(groups, (list, tuple))
            or any(not isinstance(g, str) or not g.strip() or len(g) > 255 for g in groups)):
        raise OptionsError(where, "groups must be a list of JupyterHub group names")
    queue = values.get("queue", False)
    if type(queue) is not bool:
        raise OptionsError(where, f"queue {queue!r} must be true or false")
    cpu_limit = values.get("cpu_limit")
    if cpu_limit is not None and (type(cpu_limit) not in (int, float) or not 0 < cpu_limit < 10**6):
        raise OptionsError(where, f"cpu_limit {cpu_limit!r} must be a positive number of CPUs")
    interconnect = values.get("interconnect")
    if interconnect is not None and interconnect not in INTERCONNECTS:
        raise OptionsError(where, f"interconnect {interconnect!r} must be one of {list(INTERCONNECTS)} or absent")
    kueue = values.get("kueue")
    if kueue is not None and (not isinstance(kueue, str) or not KUEUE_QUEUE_NAME.fullmatch(kueue)):
        raise OptionsError(where, f"kueue {kueue!r} must be a LocalQueue name (lowercase letters, digits, "
                                  "'-' and '.', at most 63 characters)")
    mem_limit = values.get("mem_limit")
    if mem_limit is not None and not (
        (type(mem_limit) is int and mem_limit > 0)
        or (isinstance(mem_limit, str) and re.fullmatch(r"[0-9]+(\.[0-9]+)?[KMGT]?", mem_limit))
    ):
        raise OptionsError(where, f"mem_limit {mem_limit!r} must be bytes or a size such as '8G'")
    return Profile(
        slug=slug,
        display_name=display.strip(),
        description=str(values.get("description", "")),
        gpu_models=models,
        gpu_counts=counts,
        default_gpus=default_gpus,
        images=images,
        cpu_limit=cpu_limit,
        mem_limit=mem_limit,
        default=bool(values.get("default", False)),
        capabilities=tuple(capabilities),
        groups=tuple(groups),
        queue=queue,
        slurm=_slurm_settings(values.get("slurm", {}), where),
        interconnect=interconnect,
        kueue=kueue,
    )


def load_profiles(entries: Iterable[Mapping], honour_all: bool = False) -> tuple[Profile, ...]:
    """Check a whole profile list: unique slugs, at most one default."""
    profiles = tuple(profile_from_config(e, n, honour_all) for n, e in enumerate(entries or DEFAULT_PROFILES))
    slugs = [p.slug for p in profiles]
    duplicate = {s for s in slugs if slugs.count(s) > 1}
    if duplicate:
        raise OptionsError("gpu_profiles", f"slugs must be unique; repeated: {sorted(duplicate)}")
    if sum(p.default for p in profiles) > 1:
        raise OptionsError("gpu_profiles", "at most one profile may be the default")
    return profiles


def default_profile(profiles: tuple[Profile, ...]) -> Profile:
    return next((p for p in profiles if p.default), profiles[0])


def without_gpus(profiles: tuple[Profile, ...]) -> tuple[Profile, ...]:
    """What a hub that found no GPU offers: the profiles that run without one, each preselecting no GPU.

    The default is the configured default where it runs without a GPU, else the first
    such profile. When every profile needs a GPU, they are all returned unchanged (a
    start then says that the hub has no GPUs).
    """
    cpu = [p for p in profiles if 0 in p.gpu_counts]
    if not cpu:
        return profiles
    chosen = next((p for p in cpu if p.default), cpu[0])
    return tuple(replace(p, default_gpus=0, default=p is chosen) for p in cpu)


#: What a backend offers as ``image`` for profiles without ``images``: image names by the
#: name a user picks (gpu-docker: DockerSpawner's ``allowed_images``), ``"*"`` for any image,
#: or nothing (None or empty: the spawner's own image only).
OfferedImages = Mapping[str, str] | str | None


# ---------------------------------------------------------------- user choices


def _text(options: Mapping, key: str, pattern: re.Pattern, what: str) -> str | None:
    if key not in options:
        return None
    value = options[key]
    if not isinstance(value, str):
        raise OptionsError(key, f"must be a string ({what}), not {type(value).__name__}")
    if not pattern.fullmatch(value):
        raise OptionsError(key, f"{shown(value, 40)} is not a valid {what}")
    return value


def parse_options(
    options: Any, profiles: tuple[Profile, ...], models_present: Iterable[str] = (), *,
    offered_images: OfferedImages = None, no_gpus: bool = False, site_keys: bool = False,
) -> Choice:
    """Check user_options against the profiles; return a Choice or raise OptionsError.

    ``models_present`` are the model slugs of the inventory (what the form shows).
    ``offered_images``: the images a profile without ``images`` offers (:data:`OfferedImages`).
    ``no_gpus``: the hub found no GPU; a request naming no profile or no count gets the
    defaults of :func:`without_gpus` (one that asks for GPUs is still checked as usual).
    ``site_keys``: other keys are the site's own (its ``options_from_form`` or
    ``apply_user_options`` reads them) and are left alone instead of refused.
    """
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise OptionsError("user_options", f"must be a JSON object, not {type(options).__name__}")
    unknown = [str(k) for k in options if k not in OPTION_KEYS]
    if unknown and not site_keys:
        listed = ", ".join(shown(k, 40) for k in sorted(unknown)[:5])
        raise OptionsError(field_name(unknown[0]),
                           f"unknown option {listed}; allowed options: {', '.join(OPTION_KEYS)}")

    fallback = {p.slug: p for p in without_gpus(profiles)} if no_gpus else {}
    slug = _text(options, "profile", _SLUG, "profile slug")
    by_slug = {p.slug: p for p in profiles}
    if slug is None:
        profile = by_slug[default_profile(tuple(fallback.values()) or profiles).slug]
    elif slug in by_slug:
        profile = by_slug[slug]
    else:
        raise OptionsError("profile", f"no profile {slug!r}; choose one of: {', '.join(by_slug)}")

    gpus = options.get("gpus", fallback.get(profile.slug, profile).default_gpus)
    if type(gpus) is not int:  # bool is an int subclass: refuse it too
        raise OptionsError("gpus", f"must be an integer, not {type(gpus).__name__}")
    if gpus not in profile.gpu_counts:
        number = gpus if abs(gpus) < 10**6 else "that number"
        raise OptionsError(
            "gpus", f"{number} is not allowed in profile '{profile.slug}'; allowed: "
            + ", ".join(map(str, profile.gpu_counts)))

    model = _text(options, "gpu_model", _SLUG, "GPU model") or "any"
    if model != "any":
        offered = sorted({m for m in models_present if profile.allows_model(m)})
        if model not in offered:
            raise OptionsError(
                "gpu_model", f"{model!r} is not offered in profile '{profile.slug}'; choose one of: "
                + ", ".join(["any", *offered]))

    return Choice(profile, gpus, model, _image(options, profile, offered_images))


def _image(options: Mapping, profile: Profile, offered: OfferedImages) -> str | None:
    """The ``image`` option checked: one of the profile's ``images``, else one the backend offers."""
    if "image" not in options:
        return None
    image = options["image"]
    if not isinstance(image, str):
        raise OptionsError("image", f"must be a string (image name), not {type(image).__name__}")
    if profile.images:
        allowed: Iterable[str] = profile.images
    elif offered == "*":
        return _text(options, "image", _IMAGE, "image name")
    else:
        allowed = list(offered or ())
    if image in allowed:
        return image
    listed = ", ".join(allowed) if allowed else "none (this profile has a fixed image)"
    raise OptionsError("image", f"{shown(image, 80)} is not offered in profile '{profile.slug}'; allowed: {listed}")


#: The spawn form's fields that are gpuspawner's: ``profile``, and these, plain or ``<key>-<profile slug>``.
FORM_KEYS = ("gpus", "gpu_model", "image")


def is_form_field(name: str, slugs: Iterable[str]) -> bool:
    """Whether the spawn form field ``name`` is one of gpuspawner's (see :func:`options_from_form`)."""
    if name == "profile" or name in FORM_KEYS:
        return True
    key, dash, slug = name.partition("-")
    return bool(dash) and key in FORM_KEYS and slug in set(slugs)


def options_from_form(form: Mapping[str, list[str]]) -> dict[str, Any]:
    """Turn spawn-form fields into the same user_options a REST client sends.

    The form names per-profile fields ``gpus-<slug>`` (so it works without
    JavaScript); plain ``gpus``/``gpu_model``/``image`` are accepted too. A repeated
    field is refused, except plain ``image``, DockerSpawner's own picker field, of
    which the first value counts, as DockerSpawner reads it.
    Only types are converted here; :func:`parse_options` does the checking.
    """

    def one(key: str) -> str | None:
        values = form.get(key)
        if not values:
            return None
        if len(values) != 1 and key != "image":
            raise OptionsError(key.split("-", 1)[0], "was given more than once")
        return values[0]

    options: dict[str, Any] = {}
    profile = one("profile")
    if profile is not None:
        options["profile"] = profile
    for key in ("gpus", "gpu_model", "image"):
        value = one(f"{key}-{profile}") if profile else None
        if value is None:
            value = one(key)
        if value is None or value == "":
            continue
        if key == "gpus":
            if not re.fullmatch(r"[0-9]{1,4}", value.strip()):
                raise OptionsError("gpus", f"{value[:20]!r} is not a whole number from 0 to 9999")
            value = int(value)
        options[key] = value
    return options
