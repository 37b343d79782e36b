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

The shared reservation path (:meth:`~gpuspawner.backends.base.GPUSpawnerMixin.reserve_gpus`)
calls this backend's :meth:`~GPUKubeSpawner.claim`: a :class:`~gpuspawner.backends.claim.Claim`
of a counted cluster resource (its name, count, allowed products and CUDA version), which
:meth:`~GPUKubeSpawner.apply_claim` turns into the pod's GPU settings. Notebook GPU jobs
(:class:`~gpuspawner.backends.kube.jobs.KubeJobs`) go through the same path (capacity check
and quota claim, owner ``user/job/<id>``) and run as pods with ``restartPolicy: Never``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping

from kubespawner import KubeSpawner
from traitlets import Callable, Dict, Float, List, TraitError, Unicode, Union, default, validate

from ...compat import CudaVersion, cuda_version_text, min_cuda
from ...gpu import GPU
from ...ledger import cluster_tokens
from ...placement import GPURequest, PlacementError
from ...profiles import Choice, OptionsError, load_profiles
from ...quota import check
from ...reconcile import Workload
from ..base import GPUSpawnerMixin, checked_cuda_map
from ..claim import Claim
from ..errors import user_error
from .api import ClusterCapacity, ClusterReading, list_server_pods, why_failed
from .booked import KubeBookingsMixin
from .caches import KubeCaches
from .capacity import GPU_RESOURCE, PRODUCT_LABEL, CapacityError, offered_models, place, pools
from .estimates import KubeEstimatesMixin
from .events import EventContext
from .health import KubeHealthMixin
from .holdings import USERNAME_ANNOTATION, server_holdings
from .kueue import QUEUE_LABEL, check_queue_name
from .objects import DEFAULT_TOLERATIONS, GPU_TRAITS, PodGPURequest, replaced_settings
from .options import KubeOptionsMixin, UserOptionsError
from .profiles import refuse_queue
from .waiting import KubeWaitingMixin

__all__ = ["GPUKubeSpawner", "UserOptionsError", "image_repository"]

# KubeSpawner settings gpu-kube cannot honour (it draws its own form): refused, never ignored.
_FORM_TRAITS = ("profile_form_template", "additional_profile_form_template_paths")


def image_repository(image: str) -> str:
    """``"ghcr.io/x/torch:2.3"`` -> ``"ghcr.io/x/torch"`` (digest or tag removed)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


class GPUKubeSpawner(KubeOptionsMixin, KubeWaitingMixin, KubeBookingsMixin, KubeEstimatesMixin, KubeHealthMixin,
                     GPUSpawnerMixin, KubeSpawner):
    """KubeSpawner with gpuspawner's GPU profiles, live capacity and plain-words progress.

    Its options and form (:mod:`~gpuspawner.backends.kube.options`) and its waiting in words
    (:mod:`~gpuspawner.backends.kube.waiting`) are mixins of their own; this class holds the
    settings, the claim (capacity, quotas, the pod's GPU request) and the reconciliation.
    """

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

    async def stop(self, now: bool = False):
        if self._replacing_pod:  # the old pod goes; the new one keeps this start's count and settings
            # KubeSpawner's, named: the mixin's stop (next in the MRO) would give this start's GPU count back
            return await KubeSpawner.stop(self, now=now)
        try:
            await super().stop(now=now)
        finally:
            self.restore_configured()

    @default("options_from_form")  # (the trait is declared again above: its default is set here)
    def _kube_default_options_from_form(self):
        return self.gpu_options_from_form

    # ------------------------------------------------------------ capacity

    def cluster_capacity(self) -> ClusterCapacity:
        """The capacity reader on this spawner's Kubernetes client, kept in the hub state.

        KubeSpawner shares one API client per event loop, so the hub's spawners share one reader.
        """
        readers = self.hub_state.cache(KubeCaches).kube_capacity
        reader = readers.get(self.api)
        if reader is None:
            reader = readers[self.api] = ClusterCapacity(self.api, ttl=self.gpu_inventory_ttl,
                                                         timeout=self.k8s_api_request_timeout,
                                                         unhealthy_taints=tuple(self.kube_gpu_health_taints))
        return reader

    async def offered_models(self) -> set[str]:
        reading = await self.cluster_capacity().read()
        return {p.slug for p in pools(reading.nodes)}

    def cuda_requirement(self, image: str) -> CudaVersion | None:
        text = self.image_cuda.get(image) or self.image_cuda.get(image_repository(image))
        return min_cuda(text) if text else None

    # ------------------------------------------------------------ claiming: the cluster places

    async def choice_for_start(self) -> Choice:
        """This spawn's options loaded (:meth:`load_user_options`), whatever JupyterHub ran before, and its
        pod labelled for its Kueue queue, if any."""
        choice = await self._load_options()
        self._kueue_messages, self.gpu_wait = [], None
        queue = self._kueue_queue = self.kueue_queue(choice.profile)
        if queue:
            self.extra_labels = {**self.extra_labels, QUEUE_LABEL: queue}
            self._record_spawn_changes()
        return choice

    opening_words = ("Checking the cluster for {}", "Starting {}")

    async def reconcile_before_claim(self, choice: Choice) -> None:
        """The GPUs of the hub's pods counted before a GPU request is (a CPU-only server counts none);
        where the hub cannot read them, the spawn is refused (503): the quotas could not be checked."""
        if not choice.gpus:
            return
        try:
            await self.ensure_reconciled()
        except Exception as e:
            message = (f"The hub could not read its servers' pods from Kubernetes ({why_failed(e)}), so it cannot "
                       "count your GPUs against the quotas. Nothing was started; try again in a minute.")
            self.gpu_event(f"Refused: {message}", 100)
            raise user_error(503, message) from e

    async def claim(self, choice: Choice) -> Claim:
        """Check capacity and the quotas, and count the GPUs as this server's: ``count`` of a cluster resource.

        The scheduler picks the exact GPUs; the hub's ledger holds this server's count
        (:meth:`claim_cluster_gpus`), checked against the quotas under the ledger's lock. A
        request over a quota, or that no node can take now or ever, is refused and nothing is
        created. A ``queue: true`` profile first waits in the hub's queue for room.
        """
        self._apply_request(PodGPURequest(0))  # until the request is admitted, ask for no GPU
        counted = GPURequest(owner=self.gpu_owner, count=choice.gpus, models=choice.models)
        if choice.profile.queue and not self.within_kube_booking(counted, (await self.cluster_capacity().read()).nodes):
            refusal = await self.never_fits(choice)
            if refusal is not None:  # no wait can cure it: refused at once, never queued
                raise refusal
            claim = await self._wait_for_room(choice, counted)
        else:
            claim = self._claim_now(choice, counted, await self.cluster_capacity().read())
        where = f" on nodes with CUDA >= {cuda_version_text(claim.cuda)}" if claim.cuda else ""
        via = f" through the Kueue queue {self._kueue_queue}" if self._kueue_queue else ""
        return dataclasses.replace(
            claim, progress=f"Asking Kubernetes for {claim.count} x {claim.name} ({claim.resource}){where}{via}")

    def apply_claim(self, claim: Claim) -> None:
        """The pod's GPU settings from the claim (explicitly none for a CPU-only server); KubeSpawner's
        ``_start`` then loads no options again (:meth:`load_user_options`)."""
        if claim.count:
            capabilities = tuple(self.gpu_choice.profile.capabilities)
            self._apply_request(PodGPURequest(claim.count, claim.resource, claim.products, claim.cuda, capabilities))
            self._event_context = EventContext(claim.name, claim.count, claim.resource, claim.cuda)
        else:
            self._apply_request(PodGPURequest(0))
            self._event_context = EventContext("GPU", 0)
        self._options_loaded_for_start = True

    def _request_for(self, choice: Choice, reading: ClusterReading) -> Claim:
        """What to ask the cluster for ``choice``: the resource and products of the nodes that fit."""
        cuda = self.cuda_requirement(self.image)
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
            return Claim(count=choice.gpus, resource=GPU_RESOURCE, cuda=cuda)
        return Claim(count=choice.gpus, resource=placement.resource, name=placement.name,
                     products=placement.products, cuda=cuda)

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

    def _claim_now(self, choice: Choice, counted: GPURequest, reading: ClusterReading) -> Claim:
        """Count the request as this server's if the quotas allow it and the cluster has room now."""
        asked, refusal, said = self.booked_choice(choice, counted, reading.nodes)  # a refusal: the booking's
        try:
            claim = self._request_for(asked, reading)
        except CapacityError as e:  # a PlacementError: counted as a refusal, the ledger unchanged
            refusal = refusal or e
            claim = Claim(count=choice.gpus, resource=GPU_RESOURCE)
        if refusal is None and not self.kueue_queue(choice.profile):
            try:  # Kueue's own queue aside, requests of the hub's queue go first
                self.refuse_queue_jumping(counted, offered_models(reading.nodes))
            except PlacementError as e:
                refusal = e
        self.claim_cluster_gpus(counted, {claim.resource: claim.count}, refusal)
        self.note_kube_claim(claim, reading.nodes, said)
        return claim

    async def _wait_for_room(self, choice: Choice, counted: GPURequest) -> Claim:
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

        def take(_models: tuple[GPU, ...]) -> Claim:
            # a CapacityError is a PlacementError: "none_free" waits; a request no node can ever take ends the wait
            asked, refusal, said = self.booked_choice(choice, counted, latest[0].nodes, waiting=True)
            if refusal is not None:  # only booked GPUs could serve it: it waits on
                raise refusal
            claim = self._request_for(asked, latest[0])
            state.ledger.claim(counted.owner, {claim.resource: claim.count},
                               admit=lambda held: check(quota, counted.count, held, counted.owner))
            self.note_kube_claim(claim, latest[0].nodes, said)
            return claim

        try:
            result = await self.wait_in_queue(counted, choice.profile.slug, read, take,
                                              known=lambda waiter, _: self.kube_queue_known(waiter, latest[0].nodes))
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
        self.note_pod_models(found.placed, (await self.cluster_capacity().read()).nodes)  # (after a hub restart)
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

    def start(self):
        """gpuspawner's start (GPUs reserved, then KubeSpawner's), begun at once as KubeSpawner's: the
        Future returned is also ``_start_future``, whose end ends :meth:`progress` (a caller may read
        the progress before it awaits the start, as kubespawner's own tests do)."""
        self._start_future = asyncio.ensure_future(super().start())
        return self._start_future

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
