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
is given back on stop and on every failed start, and after a hub restart it is
rebuilt from the hub's live single-user pods. The hub's queue is not used: the
cluster's scheduler (or Kueue) is the queue, so ``queue: true`` profiles are
refused at configuration.
"""

from __future__ import annotations

import copy
from typing import Any

from kubespawner import KubeSpawner
from traitlets import Dict, List, TraitError, Unicode, validate

from ..compat import CudaVersion, cuda_version_text, min_cuda
from ..form import form_context
from ..gpu import GPU
from ..inventory import InventoryReading
from ..kube.api import ClusterCapacity, ClusterReading, list_server_pods, why_failed
from ..kube.capacity import GPU_RESOURCE, PRODUCT_LABEL, CapacityError, place, pools
from ..kube.events import EventContext, explain_event
from ..kube.holdings import USERNAME_ANNOTATION, server_holdings
from ..kube.podspec import (
    DEFAULT_TOLERATIONS,
    GPU_TRAITS,
    PodGPURequest,
    PodGPUSettings,
    gpu_overrides,
    merge_overrides,
)
from ..ledger import cluster_tokens
from ..placement import GPURequest, PlacementError
from ..profiles import Choice, load_profiles
from .base import GPUSpawnerMixin, user_error

# Traits a profile sets: restored to their configured values at every spawn.
_PROFILE_TRAITS = ("image", "cpu_limit", "mem_limit")


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
        help="Tolerations added to GPU pods (GPU nodes are often tainted nvidia.com/gpu:NoSchedule).",
    ).tag(config=True)

    gpu_runtime_class = Unicode(
        None, allow_none=True,
        help="runtimeClassName for GPU pods (e.g. 'nvidia' where the GPU Operator does not make it the default).",
    ).tag(config=True)

    gpu_product_label = Unicode(
        PRODUCT_LABEL, help="The node label naming the GPU model (set by NVIDIA GPU Feature Discovery)."
    ).tag(config=True)

    image_cuda = Dict(
        Unicode(),
        help="""
        The CUDA version each image needs: ``{"ghcr.io/x/torch:2.3": "12.4"}``. Keys are
        whole image names or repositories without a tag; values are versions (``"12.4"``)
        or an image's ``NVIDIA_REQUIRE_CUDA`` value. GPU pods of such an image only go to
        nodes whose driver supports that CUDA version (GPU Feature Discovery labels).
        """,
    ).tag(config=True)

    @validate("image_cuda")
    def _check_image_cuda(self, proposal):
        for image, text in proposal["value"].items():
            try:
                min_cuda(text)
            except ValueError as e:
                raise TraitError(f"image_cuda[{image!r}]: {e}") from e
        return proposal["value"]

    @validate("gpu_profiles")
    def _check_profiles(self, proposal):
        """As for every backend, and no ``queue: true`` profile: the cluster's scheduler is the queue."""
        value = super()._check_profiles(proposal)
        queued = [p.slug for p in load_profiles(value) if p.queue]
        if queued:
            raise TraitError(
                f"Invalid GPU profile configuration: profile(s) {', '.join(map(repr, queued))} set "
                "'queue': True, but gpu-kube has no hub queue: a GPU pod waits in the cluster's own "
                "scheduler (or Kueue) until a GPU is free. Remove 'queue' from these profiles."
            )
        return value

    _configured: dict[str, Any] | None = None
    _event_context: EventContext | None = None

    # ------------------------------------------------------------ capacity

    def cluster_capacity(self) -> ClusterCapacity:
        """The capacity reader on this spawner's Kubernetes client, kept in the hub state.

        KubeSpawner shares one API client per event loop, so the hub's spawners share one reader.
        """
        caches = self.hub_state.caches
        key = ("kube-capacity", id(self.api))
        entry = caches.get(key)
        if entry is None or entry[0] is not self.api:  # (an id can be reused once a client is gone)
            reader = ClusterCapacity(self.api, ttl=self.gpu_inventory_ttl, timeout=self.k8s_api_request_timeout)
            entry = caches[key] = (self.api, reader)
        return entry[1]

    async def offered_models(self) -> set[str]:
        reading = await self.cluster_capacity().read()
        return {p.slug for p in pools(reading.nodes)}

    async def options_form_context(self) -> dict:
        reading = await self.cluster_capacity().read()
        known = reading.unknown is None
        availability = [p.availability(known) for p in pools(reading.nodes)]
        return form_context(
            self.profiles, InventoryReading(), (), self.user_options or {},
            availability=availability, unknown=reading.unknown,
        )

    def cuda_requirement(self, image: str) -> CudaVersion | None:
        text = self.image_cuda.get(image) or self.image_cuda.get(image_repository(image))
        return min_cuda(text) if text else None

    # ------------------------------------------------------------ applying a choice

    def _configured_values(self) -> dict[str, Any]:
        """The GPU- and profile-related traits as configured, taken before the first spawn changes them."""
        if self._configured is None:
            self._configured = {t: copy.deepcopy(getattr(self, t)) for t in GPU_TRAITS + _PROFILE_TRAITS}
        return self._configured

    def apply_profile(self, choice: Choice) -> None:
        configured = self._configured_values()
        for trait in _PROFILE_TRAITS:  # a profile's limits never outlive its spawn
            setattr(self, trait, copy.deepcopy(configured[trait]))
        super().apply_profile(choice)
        image = choice.image or (choice.profile.images[0] if choice.profile.images else None)
        if image:
            self.image = image
        # Until capacity is checked at start, ask for no GPU at all.
        self._apply_request(PodGPURequest(0))

    def _apply_request(self, request: PodGPURequest) -> None:
        settings = PodGPUSettings(tuple(self.gpu_tolerations), self.gpu_runtime_class, self.gpu_product_label)
        values = merge_overrides(self._configured_values(), gpu_overrides(request, settings))
        for trait, value in values.items():
            setattr(self, trait, value)

    async def load_user_options(self):
        """user_options were checked and applied by apply_user_options and reserve_gpus;
        KubeSpawner's profile_list is not used by gpu-kube."""

    def _request_for(self, choice: Choice, reading: ClusterReading) -> tuple[PodGPURequest, EventContext]:
        cuda = self.cuda_requirement(self.image)
        capabilities = tuple(choice.profile.capabilities)
        try:
            placement = place(reading.nodes, choice.models, choice.gpus, cuda, refuse_now=reading.unknown is None)
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
        choice = self.gpu_choice
        if choice is None:  # spawned without apply_user_options
            await self._apply_gpu_options(self.user_options or {})
            choice = self.gpu_choice
        self._gpu_events = []
        self.gpu_allocation = ()
        self.release_gpus()  # a failed earlier start of this server holds nothing
        if choice.gpus == 0:
            self._apply_request(PodGPURequest(0))
            self._event_context = EventContext("GPU", 0)
            self.gpu_event("Starting a CPU-only server (no GPU)", 10)
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
        reading = await self.cluster_capacity().read()
        refusal: PlacementError | None = None
        try:
            request, context = self._request_for(choice, reading)
        except CapacityError as e:
            refusal = PlacementError(str(e), code=e.code, requested=choice.gpus, models=choice.models)
            request, context = PodGPURequest(choice.gpus, GPU_RESOURCE), EventContext("GPU", choice.gpus)
        counted = GPURequest(owner=self.gpu_owner, count=choice.gpus, models=choice.models)
        try:
            self.claim_cluster_gpus(counted, {request.resource: request.count}, refusal)
        except PlacementError as e:
            self.gpu_event(f"Refused: {e}", 100)
            raise user_error(409, str(e)) from e
        self._apply_request(request)
        self._event_context = context
        where = f" on nodes with CUDA >= {cuda_version_text(request.cuda)}" if request.cuda else ""
        self.gpu_event(f"Asking Kubernetes for {request.count} x {context.name} ({request.resource}){where}", 30)
        return ()

    # ------------------------------------------------------------ the cluster's truth

    async def reconcile_allocations(self) -> None:
        """Count in the ledger what this hub's live single-user pods hold (after a hub restart).

        Runs once per hub (tried again until it succeeds) before any GPU spawn is
        admitted, so the ledger counts nothing else yet; a server it already
        counts would keep its count.
        """
        namespace = None if self.enable_user_namespaces else self.namespace
        pods = await list_server_pods(self.api, self.component_label, namespace, self.k8s_api_request_timeout)
        found = server_holdings(pods, self.component_label)
        for name in found.unnamed:
            self.log.warning("gpu-kube: pod %s holds GPUs but has no %s annotation; it is not counted",
                             name, USERNAME_ANNOTATION)
        ledger = self.ledger
        counted = ledger.allocations()
        for owner, holdings in found.holdings.items():
            if owner not in counted:
                ledger.adopt(owner, cluster_tokens(owner, holdings))
        self.log.info(
            "gpu-kube: ledger rebuilt from %d single-user pod(s) in %s: %d server(s) hold %d GPU(s)",
            len(pods), "every namespace" if namespace is None else f"namespace {namespace}",
            len(found.holdings), sum(sum(h.values()) for h in found.holdings.values()),
        )

    _replacing_pod = False

    async def _make_create_pod_request(self, pod, request_timeout):
        """KubeSpawner's pod creation; a leftover pod of this server is replaced without releasing the count."""
        self._replacing_pod = True  # KubeSpawner calls stop() on a name conflict, then creates the pod again
        try:
            return await super()._make_create_pod_request(pod, request_timeout)
        finally:
            self._replacing_pod = False

    async def stop(self, now: bool = False):
        if self._replacing_pod:  # the old pod goes, the new one keeps this start's count
            return await KubeSpawner.stop(self, now=now)
        return await super().stop(now=now)

    async def poll(self):
        """KubeSpawner's poll; the first one after a hub restart also counts the pods' GPUs."""
        try:
            await self.ensure_reconciled()
        except Exception as e:  # a spawn tries again and says what is wrong
            self.log.warning("%s: GPUs of the hub's pods not counted yet: %s", self._log_name, why_failed(e))
        return await super().poll()

    # ------------------------------------------------------------ progress

    async def progress(self):
        """gpuspawner's own steps, then KubeSpawner's pod events in plain words."""
        for event in list(getattr(self, "_gpu_events", [])):
            yield event
        context = self._event_context or EventContext("GPU", 0)
        async for event in KubeSpawner.progress(self):
            raw = event.get("raw_event")
            plain = explain_event(raw, context) if isinstance(raw, dict) else None
            if plain:
                event = {**event, "message": plain}
            yield event
