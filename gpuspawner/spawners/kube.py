"""``gpu-kube``: GPU profiles on KubeSpawner.

Same form and user_options as the other backends; the choice becomes pod
settings: ``nvidia.com/gpu`` (or a MIG resource such as ``nvidia.com/mig-1g.10gb``,
or a time-sliced ``nvidia.com/gpu.shared``) limits, a node selector on
``nvidia.com/gpu.product``, GPU tolerations, an optional runtime class, and
node affinity on the driver's CUDA version when the image needs one.

In Kubernetes the scheduler and the NVIDIA device plugin pick the exact GPUs,
so this backend reserves nothing in the hub's ledger: it checks the cluster's
capacity before creating the pod (refusing with HTTP 409 and a sentence when
no node can take the request) and lets the scheduler place it.
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
from ..kube.api import ClusterCapacity, ClusterReading
from ..kube.capacity import GPU_RESOURCE, PRODUCT_LABEL, CapacityError, place, pools
from ..kube.events import EventContext, explain_event
from ..kube.podspec import (
    DEFAULT_TOLERATIONS,
    GPU_TRAITS,
    PodGPURequest,
    PodGPUSettings,
    gpu_overrides,
    merge_overrides,
)
from ..profiles import Choice
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
        """Check capacity and set the pod's GPU settings; the scheduler picks the GPUs.

        Nothing is held in the hub's ledger. A request no node can take now, or
        ever, is refused with HTTP 409 and a sentence.
        """
        choice = self.gpu_choice
        if choice is None:  # spawned without apply_user_options
            await self._apply_gpu_options(self.user_options or {})
            choice = self.gpu_choice
        self._gpu_events = []
        self.gpu_allocation = ()
        if choice.gpus == 0:
            self._apply_request(PodGPURequest(0))
            self._event_context = EventContext("GPU", 0)
            self.gpu_event("Starting a CPU-only server (no GPU)", 10)
            return ()
        self.gpu_event(f"Checking the cluster for {self.describe_request(choice)}", 10)
        reading = await self.cluster_capacity().read()
        try:
            request, context = self._request_for(choice, reading)
        except CapacityError as e:
            self._apply_request(PodGPURequest(0))
            self.gpu_event(f"Refused: {e}", 100)
            raise user_error(409, str(e)) from e
        self._apply_request(request)
        self._event_context = context
        where = f" on nodes with CUDA >= {cuda_version_text(request.cuda)}" if request.cuda else ""
        self.gpu_event(f"Asking Kubernetes for {request.count} x {context.name} ({request.resource}){where}", 30)
        return ()

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
