"""gpu-kube's profiles and user_options, as KubeSpawner 7.1 reads and applies them: :class:`KubeOptionsMixin`.

A parent of :class:`~gpuspawner.backends.kube.spawner.GPUKubeSpawner`. Profiles are
KubeSpawner's initialised profile list (``gpu_profiles`` first, then ``profile_list``),
each with its GPU part (:mod:`gpuspawner.backends.kube.profiles`); the spawn form is
KubeSpawner's profile form with the GPU choices and live capacity; user_options are checked
as KubeSpawner checks them, more strictly (HTTP 400 naming the option, the ``ValueError``
KubeSpawner raises), and applied as KubeSpawner applies them, each spawn starting from the
settings as configured (:meth:`KubeOptionsMixin.restore_configured`).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from jupyterhub.utils import maybe_future
from tornado import web
from traitlets import observe
from traitlets.config import Configurable

from ...form import form_context
from ...inputs import check_json, field_name
from ...inventory import InventoryReading
from ...profiles import Choice, OptionsError, Profile, gpu_resource_choice, parse_options
from ..errors import user_error
from .capacity import pools
from .estimates import cluster_slots
from .holdings import PoolHolders
from .objects import GPU_TRAITS, PodGPURequest, PodGPUSettings, gpu_overrides, merge_overrides
from .profiles import GPU_OPTIONS, UNLISTED, check_entries, combined_entries


def _copy(value: Any) -> Any:
    """A copy of a setting's containers (dicts, lists...); leaves (callables included) are shared."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return type(value)(_copy(v) for v in value)
    return value


class UserOptionsError(web.HTTPError, ValueError):
    """user_options gpu-kube refuses: HTTP 400 with a sentence for JupyterHub, and the
    ``ValueError`` KubeSpawner's ``load_user_options`` raises for options it cannot load."""

    def __init__(self, message: str) -> None:
        super().__init__(400, "%s", message)
        self.jupyterhub_message = message


class KubeOptionsMixin(Configurable):
    """Profiles, the form and user_options the KubeSpawner way (see the module's words)."""

    _entries: tuple[list[dict], tuple[Profile, ...]] | None = None
    _spawn_base: dict[str, Any] | None = None
    #: what this spawn's options changed: setting -> (its value before, the value they set)
    _spawn_changes: dict[str, tuple[Any, Any]] | None = None
    _spawn_before: dict[str, Any] | None = None
    #: set once this start's options are loaded and its claim applied; KubeSpawner's _start then loads none again
    _options_loaded_for_start = False

    @observe("profile_list", "gpu_profiles")
    def _forget_entries(self, change) -> None:
        self._entries = None  # read again from the new value

    def _record_spawn_changes(self) -> None:
        """Note every setting this spawn's options (profile, choices, GPU request) changed so far."""
        before = self._spawn_before or {}
        changes = self._spawn_changes if self._spawn_changes is not None else {}
        for name, value in before.items():
            now = getattr(self, name)
            if now != value:
                changes[name] = (value, _copy(now))
            else:
                changes.pop(name, None)
        self._spawn_changes = changes

    def restore_configured(self) -> None:
        """Undo what the last spawn's options changed; forget the last choice.

        Runs when a server stops (JupyterHub stops a failed spawn too) and before
        options are loaded again, so each spawn of this spawner object starts from
        the settings it had before its options were applied, as a new spawner
        object would: KubeSpawner merges dict overrides into its settings in
        place, and JupyterHub reuses the object (kubespawner issue 546). A
        setting changed since by something else (an admin, a hook) keeps that value.
        """
        for name, (before, after) in (self._spawn_changes or {}).items():
            if getattr(self, name) == after:
                setattr(self, name, _copy(before))
        self._spawn_changes = None
        self._spawn_before = None
        self._options_loaded_for_start = False
        self.gpu_choice = None
        self._spawn_base = None


    # ------------------------------------------------------------ profiles

    def _check_entries(self, listed, gpu_profiles) -> tuple[list[dict], tuple[Profile, ...]]:
        entries = self._get_initialized_profile_list(combined_entries(gpu_profiles, listed))
        return entries, check_entries(entries, self.kueue_queue_name)

    async def load_profiles(self) -> tuple[list[dict], tuple[Profile, ...]]:
        """KubeSpawner's initialised profile list (gpu_profiles, then profile_list) and each one's GPU part.

        A callable ``profile_list`` is called here, as KubeSpawner calls it (with this spawner).
        """
        listed = self._sorted_dict_values(self.profile_list)
        if callable(listed):
            listed = await maybe_future(listed(self))
            listed = self._sorted_dict_values(listed)
        try:
            self._entries = self._check_entries(listed or [], self.gpu_profiles)
        except OptionsError as e:
            raise user_error(500, f"gpu-kube profile configuration: {e}") from e
        return self._entries

    def all_profiles(self) -> tuple[Profile, ...]:
        if self._entries is None:
            if callable(self.profile_list):
                raise RuntimeError("a callable profile_list is read by load_profiles() first")
            self._entries = self._check_entries(self._sorted_dict_values(self.profile_list) or [], self.gpu_profiles)
        return self._entries[1]

    async def check_options(self, options: Any) -> tuple[dict, Choice]:
        """The profile entry and GPU choice ``options`` ask for; 400 (403 for another group's profile) if not allowed.

        KubeSpawner's options (``profile``, each profile option by name, ``<name>--unlisted-choice``)
        are checked as KubeSpawner checks them, and more strictly: a choice that is not offered,
        or an option the profile does not have, is refused instead of failing later.
        """
        entries, profiles = await self.load_profiles()
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise UserOptionsError(f"user_options: must be a JSON object, not {type(options).__name__}")
        try:  # free-text values end up in the pod: finite numbers and storable text only
            check_json(options)
        except OptionsError as e:
            raise UserOptionsError(str(e)) from e
        visible = self.profiles_for_options(options)  # 403 for a profile of other groups
        by_slug = {p.slug: (e, p) for e, p in zip(entries, profiles, strict=True) if p in visible}
        slug = options.get("profile")
        if slug in (None, ""):  # KubeSpawner's default: the entry marked default (else the first)
            entry, profile = next((ep for ep in by_slug.values() if ep[0].get("default")),
                                  next(iter(by_slug.values())))
        elif isinstance(slug, str) and slug in by_slug:
            entry, profile = by_slug[slug]
        else:
            shown = slug[:40] if isinstance(slug, str) else type(slug).__name__
            raise UserOptionsError(f"profile: no profile {shown!r}; choose one of: {', '.join(by_slug)}")
        option_specs = entry.get("profile_options") or {}
        allowed = {"profile", *GPU_OPTIONS, *option_specs, *(f"{n}{UNLISTED}" for n in option_specs)}
        unknown = sorted(field_name(k) for k in options if k not in allowed)
        if unknown:
            raise UserOptionsError(f"{unknown[0]}: unknown option for profile '{profile.slug}'; allowed options: "
                                   + ", ".join(sorted(allowed)))
        for name, spec in option_specs.items():
            self._check_option(name, spec, options)
        gpu_options = {k: options[k] for k in GPU_OPTIONS if k in options}
        try:
            choice = parse_options(gpu_options, (profile,), await self.offered_models())
        except OptionsError as e:
            raise UserOptionsError(str(e)) from e
        return entry, choice

    @staticmethod
    def _check_option(name: str, spec: Mapping, options: Mapping) -> None:
        value, text = options.get(name), options.get(f"{name}{UNLISTED}")
        for key, given in ((name, value), (f"{name}{UNLISTED}", text)):
            if given is not None and not isinstance(given, str):
                raise UserOptionsError(f"{key}: must be a string, not {type(given).__name__}")
        unlisted = spec.get("unlisted_choice") or {}
        label = spec.get("display_name") or name
        if text:
            if not unlisted.get("enabled"):
                raise UserOptionsError(f"{name}{UNLISTED}: '{label}' takes no value of your own; "
                                       f"choose one of: {', '.join(spec.get('choices') or {})}")
            regex = unlisted.get("validation_regex")
            if regex and not re.match(regex, text):
                shown = text if len(text) <= 60 else text[:60] + "..."
                why = unlisted.get("validation_message") or f"it must match {regex}"
                raise UserOptionsError(f"{name}{UNLISTED}: {shown!r} is not accepted for '{label}': {why}")
        elif value:
            if value not in (spec.get("choices") or {}):
                what = "enter a value" if value == "unlisted-choice" else f"{value[:40]!r} is not a choice"
                raise UserOptionsError(f"{name}: {what} for '{label}'; choose one of: "
                                       + ", ".join(spec.get("choices") or {}))
        elif not spec.get("choices"):
            raise UserOptionsError(f"{name}{UNLISTED}: '{label}' needs a value")

    def gpu_form_field(self, name: str) -> bool:
        """KubeSpawner's form fields: ``profile`` and ``profile-option-<slug>--<name>``."""
        return name == "profile" or name.startswith("profile-option-")

    def gpu_options_from_form(self, formdata):
        """KubeSpawner's form fields (``profile``, ``profile-option-<slug>--<name>``); ``gpus`` as a number."""
        options = self._options_from_form(formdata)
        for key in [k for k, v in options.items() if v == ""]:
            del options[key]  # an empty field (no free-text value typed) is no choice
        gpus = options.get("gpus")
        if gpus is not None:
            if not re.fullmatch(r"[0-9]{1,4}", gpus.strip()):
                raise UserOptionsError(f"gpus: {gpus[:20]!r} is not a whole number from 0 to 9999")
            options["gpus"] = int(gpus)
        return options

    async def options_form_context(self) -> dict:
        entries, _profiles = await self.load_profiles()
        by_slug = {e["slug"]: e for e in entries}
        reading = await self.cluster_capacity().read()
        known = reading.unknown is None
        availability = [p.availability(known) for p in pools(reading.nodes)]
        previous = self.user_options or {}
        slots, held = cluster_slots(reading.nodes, self.hub_state.cache(PoolHolders), self.ledger.allocations())
        context = form_context(
            self.profiles, InventoryReading(), (), previous,
            availability=availability, unknown=reading.unknown, host="node",
            queue_estimates=self.queue_form_estimates(self.profiles, slots, held) if known else None,
        )
        queues = {p["profile"].slug: self.kueue_queue(p["profile"]) for p in context["profiles"]}
        lines = await self.kueue_reader().quota_lines(self.namespace, [q for q in queues.values() if q])
        for p in context["profiles"]:
            queue = queues[p["profile"].slug]
            p["kueue"] = lines[queue] if queue else None
        for p in context["profiles"]:
            slug = p["profile"].slug
            prefix = f"profile-option-{slug}--"
            p["fields"] = {key: prefix + key for key in p["fields"]}
            chosen = previous if previous.get("profile") == slug else {}
            p["options"] = [_option_context(prefix + name, name, spec, chosen)
                            for name, spec in (by_slug[slug].get("profile_options") or {}).items()]
        return context

    # ------------------------------------------------------------ applying a choice

    async def load_user_options(self):
        """Apply this spawn's user_options to the spawner's settings, as KubeSpawner 7.1 does.

        KubeSpawner's contract: the chosen profile's ``kubespawner_override`` and each
        chosen option's (an ``unlisted_choice``'s with ``{value}`` filled in) are applied,
        merged as KubeSpawner merges them, so every setting read afterwards (the pod,
        the progress page, admin tools) is this spawn's. Options gpu-kube refuses raise
        :class:`UserOptionsError` (HTTP 400, and the ``ValueError`` KubeSpawner raises).
        Each call starts from the settings as they were before the previous call's
        options were applied. The GPU request itself (resources, node selection) is
        set at start by the spawner's claim (``reserve_gpus``), once the cluster has room.

        JupyterHub's start runs ``reserve_gpus``, which loads the options first
        (``choice_for_start``); KubeSpawner's ``_start`` then calls this again, which
        loads nothing twice.
        """
        if self._options_loaded_for_start:
            self._options_loaded_for_start = False
            return
        await self._load_options()

    async def _load_options(self) -> Choice:
        """:meth:`load_user_options`; returns the GPU choice they make.

        A profile without GPU keys asks for the GPU resource its overrides leave in
        ``extra_resource_limits`` (or guarantees), MIG and shared GPUs included.
        """
        entry, choice = await self.check_options(self.user_options or {})  # refused: nothing changes
        self.restore_configured()  # never an earlier spawn's choice
        self._spawn_before = {name: _copy(getattr(self, name)) for name in self.trait_names(config=True)}
        try:
            self._load_profile(entry["slug"], [entry])
        finally:
            self._record_spawn_changes()  # what a failed override changed is undone too
        if not {"gpu_counts", "gpu_models"} & set(entry):
            effective = {"extra_resource_limits": self.extra_resource_limits,
                         "extra_resource_guarantees": self.extra_resource_guarantees,
                         "node_selector": self.node_selector}
            try:
                asked = gpu_resource_choice(effective, f"profile '{choice.profile.slug}'")
            except OptionsError as e:
                raise UserOptionsError(str(e)) from e
            counts, models = asked.get("gpu_counts", [0]), tuple(asked.get("gpu_models", ["any"]))
            profile = dataclasses.replace(choice.profile, gpu_counts=tuple(counts), default_gpus=counts[0],
                                          gpu_models=models)
            model = choice.gpu_model if choice.gpu_model != "any" and profile.allows_model(choice.gpu_model) else "any"
            choice = Choice(profile, counts[0], model, choice.image)
        self.gpu_choice = choice
        self._spawn_base = {t: copy.deepcopy(getattr(self, t)) for t in GPU_TRAITS}
        return choice

    def _apply_request(self, request: PodGPURequest) -> None:
        """This spawn's settings (configuration, hooks, profile overrides) with the request's GPU settings."""
        base = self._spawn_base or {t: copy.deepcopy(getattr(self, t)) for t in GPU_TRAITS}
        settings = PodGPUSettings(tuple(self.gpu_tolerations), self.gpu_runtime_class, self.gpu_product_label)
        values = merge_overrides(base, gpu_overrides(request, settings))
        for trait, value in values.items():
            setattr(self, trait, value)
        self._record_spawn_changes()

    async def _apply_gpu_options(self, user_options: dict[str, Any]) -> None:
        """JupyterHub's apply_user_options hook: check the options at once (400/403) and set the
        queue policy; the profile is applied at start, after pre_spawn_hook, as KubeSpawner does."""
        _entry, choice = await self.check_options(user_options)
        self.gpu_choice = choice
        self.apply_queue_policy(choice)
        self.apply_budget(choice)  # a spent GPU-hour budget: 422 (or last in the queue), nothing held


def _option_context(field: str, name: str, spec: Mapping, chosen: Mapping) -> dict:
    """One KubeSpawner profile option as the form shows it, the user's last choice preselected."""
    unlisted = dict(spec.get("unlisted_choice") or {})
    text = chosen.get(f"{name}{UNLISTED}") if unlisted.get("enabled") else None
    last = chosen.get(name)
    choices = spec.get("choices") or {}
    if last not in choices:
        last = next((k for k, c in choices.items() if c.get("default")), None)
    unlisted["value"] = text if isinstance(text, str) else ""
    return {
        "name": name,
        "field": field,
        "display_name": spec.get("display_name") or name,
        "choices": [{"key": k, "display_name": c.get("display_name") or k, "selected": k == last and not text}
                    for k, c in choices.items()],
        "unlisted": unlisted,
    }
