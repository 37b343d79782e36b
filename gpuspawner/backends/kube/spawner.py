"""``gpu-kube``: GPU profiles on KubeSpawner.

Same form and user_options as the other backends; the choice becomes pod
settings: ``nvidia.com/gpu`` (or a MIG resource such as ``nvidia.com/mig-1g.10gb``,
or a time-sliced ``nvidia.com/gpu.shared``) limits, a node selector on
``nvidia.com/gpu.product``, GPU tolerations, an optional runtime class, and
node affinity on the driver's CUDA version when the image needs one.

In Kubernetes the scheduler and the NVIDIA device plugin pick the exact GPUs:
this backend checks the cluster's capacity before creating the pod (refusing
with HTTP 409 and a sentence when no node can take the request) and lets the
scheduler place it. The hub still counts each server's GPUs in its ledger (as
cluster tokens, not exact GPUs), so the quotas apply as on the other backends:
the quota check and the count are one step under the ledger's lock, the count
is given back on stop and on every failed start, and it is reconciled with the
hub's live single-user pods at hub start and every ``gpu_reconcile_interval``
seconds (a pod deleted behind the hub's back stops counting; one the hub did not
count is counted). A ``queue: true`` profile waits in the hub's queue until the
cluster has room (no pod exists meanwhile), with the same progress words as the
other backends; a profile whose pods go to a Kueue queue waits in Kueue instead,
so ``queue: true`` is refused beside Kueue.

Notebook GPU jobs (:class:`~gpuspawner.backends.kube.jobs.KubeJobs`) go through the
same :meth:`~GPUKubeSpawner.reserve_gpus` (capacity check and quota claim,
owner ``user/job/<id>``) and run as pods with ``restartPolicy: Never``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import re
import time
from collections.abc import Mapping
from typing import Any

from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner
from tornado import web
from traitlets import Callable, Dict, Float, List, TraitError, Unicode, Union, default, observe, validate

from ...compat import CudaVersion, cuda_version_text, min_cuda
from ...form import form_context
from ...gpu import GPU
from ...inputs import check_json, field_name
from ...inventory import InventoryReading
from ...ledger import cluster_tokens
from ...placement import GPURequest, PlacementError
from ...profiles import Choice, OptionsError, Profile, gpu_resource_choice, load_profiles, parse_options
from ...quota import check
from ...reconcile import Workload
from ..base import GPUSpawnerMixin, checked_cuda_map, user_error
from .api import ClusterCapacity, ClusterReading, list_server_pods, read_pod, why_failed
from .caches import KubeCaches
from .capacity import GPU_RESOURCE, PRODUCT_LABEL, CapacityError, offered_models, place, pools
from .events import EventContext, explain_event
from .holdings import USERNAME_ANNOTATION, server_holdings
from .kueue import (
    QUEUE_LABEL,
    KueueReader,
    check_queue_name,
    events_problem,
    gated,
    pod_gone,
    pod_problem,
    queue_position,
    waiting_message,
    workload_of,
    workload_problem,
)
from .objects import (
    DEFAULT_TOLERATIONS,
    GPU_TRAITS,
    PodGPURequest,
    PodGPUSettings,
    gpu_overrides,
    merge_overrides,
    replaced_settings,
)
from .profiles import GPU_OPTIONS, UNLISTED, check_entries, combined_entries, refuse_queue

# KubeSpawner settings gpu-kube cannot honour (it draws its own form): refused, never ignored.
_FORM_TRAITS = ("profile_form_template", "additional_profile_form_template_paths")


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


def image_repository(image: str) -> str:
    """``"ghcr.io/x/torch:2.3"`` -> ``"ghcr.io/x/torch"`` (digest or tag removed)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


class GPUKubeSpawner(GPUSpawnerMixin, KubeSpawner):
    """KubeSpawner with gpuspawner's GPU profiles, live capacity and plain-words progress."""

    gpu_tolerations = List(
        Dict(),
        default_value=[dict(t) for t in DEFAULT_TOLERATIONS],
        help="""Tolerations added to GPU pods, beside KubeSpawner's own ``tolerations`` (CPU-only pods
        get only those). The default tolerates the taint ``nvidia.com/gpu:NoSchedule`` that GPU
        nodes often carry.""",
    ).tag(config=True)

    gpu_runtime_class = Unicode(
        None, allow_none=True,
        help="""The ``runtimeClassName`` of GPU pods (e.g. ``"nvidia"`` where the GPU Operator does not
        make its runtime the default), replacing one set in ``extra_pod_config`` for them; CPU-only
        pods keep ``extra_pod_config``'s. None: the pod names none (the cluster's default).""",
    ).tag(config=True)

    gpu_product_label = Unicode(
        PRODUCT_LABEL, help="""The node label a GPU pod's node selector (or, for several models,
        its node affinity) names the chosen GPU model by. The hub itself reads each node's model
        from GPU Feature Discovery's ``nvidia.com/gpu.product`` label whatever this says (the form,
        the capacity checks, a ``profile_list`` entry's node selector), so another label must
        carry the same values on the same nodes. A ``node_selector`` on this label among
        KubeSpawner's own settings is refused at hub start (a profile's ``kubespawner_override``
        may set it)."""
    ).tag(config=True)

    image_cuda = Dict(
        Unicode(),
        help="""
        The CUDA version each image needs: ``{"ghcr.io/x/torch:2.3": "12.4"}``. Keys are
        whole image names or repositories without a tag; values are versions (``"12.4"``)
        or an image's ``NVIDIA_REQUIRE_CUDA`` value. GPU pods of such an image only go to
        nodes whose driver supports that CUDA version (node affinity on GPU Feature
        Discovery's ``nvidia.com/cuda.driver.major``/``minor`` labels; a node without them
        is not one). A request no node's driver can ever serve is refused with HTTP 409
        naming the newest CUDA there. A value that is no CUDA requirement is refused at hub start.
        """,
    ).tag(config=True)

    kueue_queue_name = Unicode(
        None, allow_none=True,
        help="""
        The Kueue LocalQueue (in the server's namespace) that GPU-profile pods go to, e.g.
        ``"team-a"``; a profile's own ``kueue`` key (see ``gpu_profiles``; also a key of
        ``profile_list`` entries) overrides it. Pods get the label
        ``kueue.x-k8s.io/queue-name``; Kueue holds each pod with its scheduling gate
        ``kueue.x-k8s.io/admission`` until the queue's ClusterQueue has quota for it, and
        spawn progress says "waiting in queue team-a: position 3 (Kueue)" (the position from
        Kueue's visibility API). The form shows the ClusterQueue's GPU quota and use
        ("team-a: 6 of 8 GPUs in use"); a Workload Kueue rejects or evicts fails the spawn with
        a sentence. The hub runs no queue of its own for these profiles (``queue: true`` is
        refused) and does not refuse a request the cluster is too busy for now: Kueue queues
        it. The hub's service account needs read access to Kueue's workloads, localqueues,
        clusterqueues and the visibility API (Helm chart: ``kueue.enabled``). None: no Kueue.
        """,
    ).tag(config=True)

    kueue_poll_interval = Float(
        2.0, help="""Seconds between reads of a queued pod's Kueue state (queue position, Workload
        verdict) while its spawn waits in a Kueue queue. A finite number above 0.""",
    ).tag(config=True)

    @validate("kueue_poll_interval")
    def _check_kueue_poll_interval(self, proposal):
        if not 0 < proposal["value"] < float("inf"):
            raise TraitError(f"kueue_poll_interval must be a finite number of seconds > 0, not {proposal['value']}")
        return proposal["value"]

    @validate("kueue_queue_name")
    def _check_kueue_queue_name(self, proposal):
        if proposal["value"] is None:
            return None
        try:
            return check_queue_name(proposal["value"], "kueue_queue_name")
        except ValueError as e:
            raise TraitError(str(e)) from e

    @validate("image_cuda")
    def _check_image_cuda(self, proposal):
        return checked_cuda_map(proposal)

    @validate("gpu_profiles")
    def _check_profiles(self, proposal):
        """As for every backend, and no ``queue: true`` beside a Kueue queue: Kueue is the queue."""
        value = super()._check_profiles(proposal)
        try:
            refuse_queue(load_profiles(value, honour_all=True), self.kueue_queue_name)
        except OptionsError as e:
            raise TraitError(f"Invalid GPU profile configuration: {e}") from e
        return value

    honours_kubespawner_override = True  # KubeSpawner applies every key
    form_is_the_parents = True  # KubeSpawner's profile form: a site's own form and reader replace it
    honours_interconnect = False  # the cluster places the GPUs
    honours_kueue = True  # a profile's kueue queue labels its pods

    gpu_job_runner = "gpuspawner.backends.kube.jobs.KubeJobs"  # a notebook GPU job is a pod with restartPolicy Never

    @validate("profile_list")
    def _check_profile_list(self, proposal):
        value = proposal["value"]
        if not callable(value):  # a callable is checked each time it is called
            try:
                self._check_entries(self._sorted_dict_values(value) or [], self.gpu_profiles)
            except OptionsError as e:
                raise TraitError(f"Invalid profile_list for gpu-kube: {e}") from e
        return value

    # JupyterHub's setting, declared again here: the mixin's own method must not hide it (a site's
    # c.KubeSpawner.options_from_form would be ignored)
    options_from_form = Union(
        [Callable(), Unicode()],
        help="""
        How the spawn form's fields become user_options (JupyterHub's ``Spawner.options_from_form``).
        gpu-kube's own (the default) reads the fields of its form as KubeSpawner reads its own
        (``profile``, ``profile-option-<slug>--<option>``, ``...--unlisted-choice``) plus
        ``profile-option-<slug>--gpus`` and ``--gpu_model``. A site's callable, ``"simple"`` or
        ``"passthrough"`` replaces it, as on KubeSpawner; the user_options it returns are then
        checked like a REST request's (HTTP 400 naming the field) before anything starts.
        """,
    ).tag(config=True)

    @validate(*_FORM_TRAITS)
    def _refuse_form_templates(self, proposal):
        if proposal["value"]:
            raise TraitError(f"gpu-kube draws its own spawn form (profiles, their options and live GPU "
                             f"availability); KubeSpawner's {proposal['trait'].name} would not be used: remove it")
        return proposal["value"]

    _event_context: EventContext | None = None
    _entries: tuple[list[dict], tuple[Profile, ...]] | None = None
    _spawn_base: dict[str, Any] | None = None
    #: what this spawn's options changed: setting -> (its value before, the value they set)
    _spawn_changes: dict[str, tuple[Any, Any]] | None = None
    _spawn_before: dict[str, Any] | None = None
    #: set by reserve_gpus once it has loaded this start's options; KubeSpawner's _start then loads none again
    _options_loaded_for_start = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._refuse_replaced_settings()

    def _refuse_replaced_settings(self) -> None:
        """Configured KubeSpawner settings gpu-kube would replace on some server: refused, naming them.

        Checked once the configuration is loaded (the hub makes its spawners with it), so a
        setting gpu-kube cannot honour stops the hub's spawner with a sentence instead of
        being dropped from pods. A callable ``profile_list`` counts as offering no GPU choices.
        """
        listed = self.profile_list
        if callable(listed):
            gpu_choices = bool(self.gpu_profiles)
        else:
            entries = self._sorted_dict_values(listed) or []
            gpu_choices = bool(self.gpu_profiles) or not entries or any(
                isinstance(e, Mapping) and {"gpu_counts", "gpu_models"} & set(e) for e in entries)
        configured = {t: getattr(self, t) for t in GPU_TRAITS}
        found = replaced_settings(configured, gpu_choices=gpu_choices,
                                  product_labels=(PRODUCT_LABEL, self.gpu_product_label))
        if found:
            raise TraitError("gpu-kube cannot honour c.KubeSpawner." + found[0])

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

    async def stop(self, now: bool = False):
        if self._replacing_pod:  # the old pod goes; the new one keeps this start's count and settings
            return await KubeSpawner.stop(self, now=now)
        try:
            await super().stop(now=now)
        finally:
            self.restore_configured()

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

    @default("options_from_form")  # (the trait is declared again above: its default is set here)
    def _kube_default_options_from_form(self):
        return self.gpu_options_from_form

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

    # ------------------------------------------------------------ capacity

    def cluster_capacity(self) -> ClusterCapacity:
        """The capacity reader on this spawner's Kubernetes client, kept in the hub state.

        KubeSpawner shares one API client per event loop, so the hub's spawners share one reader.
        """
        readers = self.hub_state.cache(KubeCaches).kube_capacity
        reader = readers.get(self.api)
        if reader is None:
            reader = readers[self.api] = ClusterCapacity(self.api, ttl=self.gpu_inventory_ttl,
                                                         timeout=self.k8s_api_request_timeout)
        return reader

    async def offered_models(self) -> set[str]:
        reading = await self.cluster_capacity().read()
        return {p.slug for p in pools(reading.nodes)}

    async def options_form_context(self) -> dict:
        entries, _profiles = await self.load_profiles()
        by_slug = {e["slug"]: e for e in entries}
        reading = await self.cluster_capacity().read()
        known = reading.unknown is None
        availability = [p.availability(known) for p in pools(reading.nodes)]
        previous = self.user_options or {}
        context = form_context(
            self.profiles, InventoryReading(), (), previous,
            availability=availability, unknown=reading.unknown,
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

    def cuda_requirement(self, image: str) -> CudaVersion | None:
        text = self.image_cuda.get(image) or self.image_cuda.get(image_repository(image))
        return min_cuda(text) if text else None

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
        set by :meth:`reserve_gpus` at start, once the cluster has room.

        JupyterHub's start runs :meth:`reserve_gpus`, which loads the options first;
        KubeSpawner's ``_start`` then calls this again, which loads nothing twice.
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

    def _request_for(self, choice: Choice, reading: ClusterReading) -> tuple[PodGPURequest, EventContext]:
        cuda = self.cuda_requirement(self.image)
        capabilities = tuple(choice.profile.capabilities)
        try:
            # with Kueue a request the cluster is too busy for now waits in Kueue's queue
            refuse_now = reading.unknown is None and not self.kueue_queue(choice.profile)
            placement = place(reading.nodes, choice.models, choice.gpus, cuda, refuse_now=refuse_now)
        except CapacityError:
            if reading.unknown is None:
                raise
            # The API cannot be read: ask for whole GPUs and let the scheduler decide.
            self.gpu_event(f"GPU availability unknown ({reading.unknown}); "
                           "the scheduler places the server when a GPU is free", 20)
            request = PodGPURequest(choice.gpus, GPU_RESOURCE, (), cuda, capabilities)
            return request, EventContext("GPU", choice.gpus, GPU_RESOURCE, cuda)
        request = PodGPURequest(choice.gpus, placement.resource, placement.products, cuda, capabilities)
        return request, EventContext(placement.name, choice.gpus, placement.resource, cuda)

    async def reserve_gpus(self) -> tuple[GPU, ...]:
        """Check capacity and the quotas, count the GPUs as this server's and set the pod's GPU settings.

        The scheduler picks the exact GPUs; the hub's ledger holds this server's
        count (:meth:`claim_cluster_gpus`), checked against the quotas under the
        ledger's lock. A request over a quota, or that no node can take now or
        ever, is refused with HTTP 409 and a sentence, and nothing is created.
        """
        choice = await self._load_options()  # this spawn's options, whatever JupyterHub ran before
        self._gpu_events = []
        self._kueue_messages = []
        queue = self._kueue_queue = self.kueue_queue(choice.profile)
        if queue:
            self.extra_labels = {**self.extra_labels, QUEUE_LABEL: queue}
            self._record_spawn_changes()
        self.gpu_allocation = ()
        self.release_gpus()  # a failed earlier start of this server holds nothing
        if choice.gpus == 0:
            self._apply_request(PodGPURequest(0))
            self._event_context = EventContext("GPU", 0)
            self.gpu_event("Starting a CPU-only server (no GPU)", 10)
            self._options_loaded_for_start = True
            return ()
        self.gpu_event(f"Checking the cluster for {self.describe_request(choice)}", 10)
        self._apply_request(PodGPURequest(0))  # until the request is admitted, ask for no GPU
        try:
            await self.ensure_reconciled()
        except Exception as e:
            message = (f"The hub could not read its servers' pods from Kubernetes ({why_failed(e)}), so it cannot "
                       "count your GPUs against the quotas. Nothing was started; try again in a minute.")
            self.gpu_event(f"Refused: {message}", 100)
            raise user_error(503, message) from e
        counted = GPURequest(owner=self.gpu_owner, count=choice.gpus, models=choice.models)
        try:
            if choice.profile.queue:
                refusal = await self.never_fits(choice)
                if refusal is not None:  # no wait can cure it: refused at once, never queued
                    raise refusal
                request, context = await self._wait_for_room(choice, counted)
            else:
                request, context = self._claim_now(choice, counted, await self.cluster_capacity().read())
        except PlacementError as e:
            self.gpu_event(f"Refused: {e}", 100)
            raise user_error(409, str(e)) from e
        self._apply_request(request)
        self._event_context = context
        where = f" on nodes with CUDA >= {cuda_version_text(request.cuda)}" if request.cuda else ""
        via = f" through the Kueue queue {queue}" if queue else ""
        self.gpu_event(f"Asking Kubernetes for {request.count} x {context.name} ({request.resource}){where}{via}", 30)
        self._options_loaded_for_start = True
        return ()

    async def never_fits(self, choice: Choice) -> PlacementError | None:
        """The cluster's "no node could ever hold it" (:func:`~gpuspawner.backends.kube.capacity.place`), or None.

        Unknown capacity (the API does not answer) is never a reason; the image's CUDA is
        checked when the pod is asked for, once the profile's overrides are applied.
        """
        if not choice.gpus:
            return None
        reading = await self.cluster_capacity().read()
        if reading.unknown is not None:
            return None
        try:
            place(reading.nodes, choice.models, choice.gpus, None, refuse_now=False)
        except CapacityError as e:
            if e.never:
                return e
        return None

    def _claim_now(
        self, choice: Choice, counted: GPURequest, reading: ClusterReading,
    ) -> tuple[PodGPURequest, EventContext]:
        """Count the request as this server's if the quotas allow it and the cluster has room now."""
        refusal: PlacementError | None = None
        try:
            request, context = self._request_for(choice, reading)
        except CapacityError as e:  # a PlacementError: counted as a refusal, the ledger unchanged
            refusal = e
            request, context = PodGPURequest(choice.gpus, GPU_RESOURCE), EventContext("GPU", choice.gpus)
        if refusal is None and not self.kueue_queue(choice.profile):
            try:  # Kueue's own queue aside, requests of the hub's queue go first
                self.refuse_queue_jumping(counted, offered_models(reading.nodes))
            except PlacementError as e:
                refusal = e
        self.claim_cluster_gpus(counted, {request.resource: request.count}, refusal)
        return request, context

    async def _wait_for_room(self, choice: Choice, counted: GPURequest) -> tuple[PodGPURequest, EventContext]:
        """A ``queue: true`` profile: wait in the hub's queue until the cluster has room, then count it.

        The cluster is read again whenever the hub's servers give GPUs back and every
        ``gpu_queue_recheck`` seconds (other workloads free GPUs too); no pod exists meanwhile.
        """
        state = self.hub_state
        quota = self.gpu_quota()
        latest: list[ClusterReading] = []
        started = time.monotonic()

        async def read() -> tuple[GPU, ...]:
            latest[:] = [await self.cluster_capacity().read()]
            return offered_models(latest[0].nodes)

        def place(_models: tuple[GPU, ...]) -> tuple[PodGPURequest, EventContext]:
            # a CapacityError is a PlacementError: "none_free" waits; a request no node can ever take ends the wait
            request, context = self._request_for(choice, latest[0])
            state.ledger.claim(counted.owner, {request.resource: request.count},
                               admit=lambda held: check(quota, counted.count, held, counted.owner))
            return request, context

        try:
            result = await self.wait_in_queue(counted, choice.profile.slug, read, place)
        except PlacementError as e:
            state.metrics.refused(e.code, time.monotonic() - started)
            raise
        state.metrics.placed(time.monotonic() - started)
        return result

    # ------------------------------------------------------------ the cluster's truth

    reconciles_with_cluster = True
    backend_name = "gpu-kube"
    workload_word = "pod"

    async def live_workloads(self) -> list[Workload]:
        """This hub's live single-user pods (KubeSpawner's ``component_label``; notebook GPU job pods
        too), per server: the GPU resources they ask for, counted as the hub's claims count them.

        Every such pod is its owner's (the hub keeps no other record of pods): one the hub's
        database does not know is adopted, counted against the user its annotations name.
        """
        namespace = None if self.enable_user_namespaces else self.namespace
        pods = await list_server_pods(self.api, self.component_label, namespace, self.k8s_api_request_timeout)
        found = server_holdings(pods, self.component_label)
        for name in found.unnamed:
            self.log.warning("gpu-kube: pod %s holds GPUs but has no %s annotation; it is not counted",
                             name, USERNAME_ANNOTATION)
        return [Workload(",".join(found.pods[owner]), owner, cluster_tokens(owner, holdings),
                         what=f"pod {', '.join(found.pods[owner])}")
                for owner, holdings in found.holdings.items()]

    _replacing_pod = False

    async def _make_create_pod_request(self, pod, request_timeout):
        """KubeSpawner's pod creation; a leftover pod of this server is replaced without releasing the count."""
        self._replacing_pod = True  # KubeSpawner calls stop() on a name conflict, then creates the pod again
        try:
            return await super()._make_create_pod_request(pod, request_timeout)
        finally:
            self._replacing_pod = False

    async def poll(self):
        """KubeSpawner's poll; the first one after a hub restart also counts the pods' GPUs."""
        try:
            await self.ensure_reconciled()
        except Exception as e:  # a spawn tries again and says what is wrong
            self.log.warning("%s: GPUs of the hub's pods not counted yet: %s", self._log_name, why_failed(e))
        return await super().poll()

    # ------------------------------------------------------------ Kueue

    _kueue_queue: str | None = None
    _kueue_messages: list[str] = []  # noqa: RUF012 - replaced per spawn, never appended to in place
    _kueue_position_error: str | None = None
    _kueue_pod_uid: str | None = None
    _kueue_stale_uid: str | None = None
    _kueue_workload: str | None = None

    def kueue_queue(self, profile: Profile) -> str | None:
        """The Kueue LocalQueue of a profile's pods: its own ``kueue``, else ``kueue_queue_name``."""
        return profile.kueue or self.kueue_queue_name

    def kueue_reader(self) -> KueueReader:
        return KueueReader(self.api.api_client, timeout=self.k8s_api_request_timeout)

    async def _kueue_verdict(self, reader: KueueReader, queue: str, last: str | None) -> str | None:
        """One look at the queued pod: a new waiting message is recorded; an eviction or rejection is returned."""
        pod = await read_pod(self.api, self.namespace, self.pod_name, self.k8s_api_request_timeout)
        uid = ((pod or {}).get("metadata") or {}).get("uid")
        if uid and uid == self._kueue_stale_uid:  # a pod left from before this spawn, which KubeSpawner replaces
            return None
        seen, self._kueue_pod_uid = self._kueue_pod_uid, uid or self._kueue_pod_uid
        if seen and uid != seen:  # this spawn's pod was deleted between two looks (Kueue evicts by deleting)
            return await self._kueue_gone(reader, queue, seen)
        if pod is None:  # not created yet
            return None
        workload = workload_of(await reader.workloads(self.namespace, uid), self.pod_name)
        self._kueue_workload = ((workload or {}).get("metadata") or {}).get("name") or self._kueue_workload
        # an evicted pod's Workload goes with the pod Kueue deletes: the pod's own condition says it too
        problem = (workload_problem(workload, queue) if workload else None) or pod_problem(pod, queue)
        if problem:
            return problem
        if gated(pod):
            try:
                position = queue_position(await reader.pending_workloads(self.namespace, queue), self.pod_name)
            except Exception as e:  # noqa: BLE001 - still waiting in the queue, place unknown
                if why_failed(e) != self._kueue_position_error:  # once, not every poll
                    self._kueue_position_error = why_failed(e)
                    self.log.warning("%s: Kueue's queue positions not read: %s", self._log_name, why_failed(e))
                position = None
            message = waiting_message(queue, position)
            if message != last:
                self._kueue_messages = [*self._kueue_messages, message]
        return None

    async def _kueue_gone(self, reader: KueueReader, queue: str, uid: str) -> str:
        """Why this spawn's pod is gone: its Workload if still there, else the events Kueue left on it."""
        workload = workload_of(await reader.workloads(self.namespace, uid), self.pod_name)
        problem = workload_problem(workload, queue) if workload else None
        if not problem and self._kueue_workload:
            problem = events_problem(await reader.workload_events(self.namespace, self._kueue_workload), queue)
        return problem or pod_gone(queue)

    async def _watch_kueue(self, queue: str) -> str:
        """Until cancelled: record the pod's place in the queue; return the sentence once Kueue evicts or rejects."""
        reader = self.kueue_reader()
        while True:
            last = self._kueue_messages[-1] if self._kueue_messages else None
            try:
                problem = await self._kueue_verdict(reader, queue, last)
            except Exception as e:  # noqa: BLE001 - the pod still starts; Kueue's state is only shown
                self.log.warning("%s: Kueue state not read: %s", self._log_name, why_failed(e))
                problem = None
            if problem:
                return problem
            await asyncio.sleep(self.kueue_poll_interval)

    def start(self):
        """gpuspawner's start (GPUs reserved, then KubeSpawner's), begun at once as KubeSpawner's: the
        Future returned is also ``_start_future``, whose end ends :meth:`progress` (a caller may read
        the progress before it awaits the start, as kubespawner's own tests do)."""
        self._start_future = asyncio.ensure_future(super().start())
        return self._start_future

    async def _start(self):
        """KubeSpawner's start; with Kueue, watched so an eviction or rejection fails it with a sentence."""
        try:
            return await self._start_watched()
        finally:
            self._options_loaded_for_start = False  # loaded once, for this start only

    async def _start_watched(self):
        """KubeSpawner's ``_start``, raced against the Kueue watch where the pod goes to a Kueue queue."""
        queue = self._kueue_queue
        if not queue:
            return await super()._start()
        self._kueue_pod_uid = self._kueue_workload = None  # this spawn's pod and Workload, once the watch saw them
        stale = await read_pod(self.api, self.namespace, self.pod_name, self.k8s_api_request_timeout)
        self._kueue_stale_uid = ((stale or {}).get("metadata") or {}).get("uid")
        start = asyncio.ensure_future(super()._start())
        watch = asyncio.ensure_future(self._watch_kueue(queue))
        try:
            await asyncio.wait({start, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (start, watch):
                if not task.done():
                    task.cancel()
        if start.done() and not start.cancelled():
            return start.result()
        problem = watch.result()
        self.gpu_event(f"Refused: {problem}", 100)
        raise user_error(409, problem)

    # ------------------------------------------------------------ progress

    async def progress(self):
        """gpuspawner's own steps, then KubeSpawner's pod events in plain words, with Kueue's queue position."""
        for event in list(getattr(self, "_gpu_events", [])):
            yield event
        context = self._event_context or EventContext("GPU", 0)
        events = KubeSpawner.progress(self).__aiter__()
        sent = 0
        following = asyncio.ensure_future(events.__anext__())
        try:
            while True:
                await asyncio.wait({following}, timeout=self.kueue_poll_interval)  # Kueue's news between events
                for message in self._kueue_messages[sent:]:
                    sent += 1
                    yield {"progress": 40, "message": message}
                if not following.done():
                    continue
                try:
                    event = following.result()
                except StopAsyncIteration:
                    break
                raw = event.get("raw_event")
                plain = explain_event(raw, context) if isinstance(raw, dict) else None
                if plain:
                    event = {**event, "message": plain}
                yield event
                following = asyncio.ensure_future(events.__anext__())
        finally:
            if not following.done():
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
            await events.aclose()

    # ------------------------------------------------------------ for the job runner

    async def ensure_storage(self) -> None:
        """The user's namespace (``enable_user_namespaces``) and home volume (``storage_pvc_ensure``),
        made as KubeSpawner makes them for a server, for a pod that is no server (a notebook GPU job's):
        the volume of the user's default server where the hub remembers one, so the job mounts the same
        home. Public, so that :class:`~gpuspawner.backends.kube.jobs.KubeJobs` needs none of KubeSpawner's
        private methods."""
        from jupyterhub.utils import exponential_backoff

        spawners = getattr(self.user, "spawners", None)
        server = spawners.get("") if isinstance(spawners, dict) else None  # never creates one
        if getattr(server, "pvc_name", None) and getattr(server, "_pvc_exists", False):
            self.pvc_name, self._pvc_exists = server.pvc_name, True
        if self.enable_user_namespaces:
            await self._ensure_namespace()
        if self.storage_pvc_ensure and not self._pvc_exists:
            timeout = self.k8s_api_request_timeout
            await exponential_backoff(
                lambda: self._make_create_pvc_request(self.get_pvc_manifest(), timeout),
                f"Could not create PVC {self.pvc_name}", timeout=self.k8s_api_request_retry_timeout,
            )
            self._pvc_exists = True


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
