"""KubeSpawner trait overrides for a GPU request. Pure.

Like KubeSpawner's ``objects.py``: plain arguments in, plain dicts out.
:func:`gpu_overrides` says what a request needs (resources, node selection,
tolerations, runtime class, environment); :func:`merge_overrides` lays that
over the values the admin configured, *replacing* every GPU setting of an
earlier spawn. KubeSpawner reuses one spawner object across spawns
(kubespawner issue 546), so a CPU-only spawn after a GPU spawn must not keep
the GPU limit, the GPU node selector or the GPU runtime class.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...compat import CudaVersion
from ...gpu import NO_GPU_DEVICES
from .capacity import GPU_RESOURCE, PRODUCT_LABEL
from .cuda import cuda_affinity_terms

# The traits gpu-kube sets on every spawn (from the configured value plus the request).
GPU_TRAITS = (
    "extra_resource_limits",
    "extra_resource_guarantees",
    "node_selector",
    "node_affinity_required",
    "tolerations",
    "extra_pod_config",
    "environment",
)

DEFAULT_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)


@dataclass(frozen=True)
class PodGPURequest:
    """What one server asks of Kubernetes. ``count == 0``: explicitly no GPU."""

    count: int = 0
    resource: str = GPU_RESOURCE
    products: tuple[str, ...] = ()  # allowed nvidia.com/gpu.product values; () = any node with the resource
    cuda: CudaVersion | None = None  # the driver must support this CUDA version
    capabilities: tuple[str, ...] = ()  # NVIDIA_DRIVER_CAPABILITIES, e.g. ("compute", "utility")


@dataclass(frozen=True)
class PodGPUSettings:
    """How this cluster wants GPU pods (admin configuration)."""

    tolerations: tuple[Mapping[str, Any], ...] = DEFAULT_TOLERATIONS
    runtime_class: str | None = None
    product_label: str = PRODUCT_LABEL


def gpu_overrides(request: PodGPURequest, settings: PodGPUSettings = PodGPUSettings()) -> dict[str, Any]:
    """The GPU part of a pod spec as KubeSpawner trait values.

    A CPU-only request gets no GPU resource, no GPU node selection and
    ``NVIDIA_VISIBLE_DEVICES=void`` (:data:`~gpuspawner.gpu.NO_GPU_DEVICES`: no
    GPU, no driver libraries), so an image that sets
    ``NVIDIA_VISIBLE_DEVICES=all`` (every CUDA image does) sees no GPU even on
    a node whose default runtime is nvidia. A GPU request leaves that variable
    to the device plugin, which sets it to the GPUs it allocated.
    """
    if request.count < 0:
        raise ValueError(f"GPU count must be >= 0, not {request.count}")
    if request.count == 0:
        return {
            "extra_resource_limits": {},
            "extra_resource_guarantees": {},
            "node_selector": {},
            "node_affinity_required": [],
            "tolerations": [],
            "extra_pod_config": {},
            "environment": {"NVIDIA_VISIBLE_DEVICES": NO_GPU_DEVICES},
        }
    quantity = str(request.count)
    node_selector: dict[str, str] = {}
    product_terms: list[list[dict[str, Any]]] = [[]]
    if len(request.products) == 1:
        node_selector[settings.product_label] = request.products[0]
    elif request.products:
        product_terms = [[{"key": settings.product_label, "operator": "In", "values": list(request.products)}]]
    cuda_terms = cuda_affinity_terms(request.cuda) if request.cuda else [[]]
    terms = [p + c for p in product_terms for c in cuda_terms]
    affinity = [{"matchExpressions": t} for t in terms if t]
    return {
        "extra_resource_limits": {request.resource: quantity},
        "extra_resource_guarantees": {request.resource: quantity},
        "node_selector": node_selector,
        "node_affinity_required": affinity,
        "tolerations": [dict(t) for t in settings.tolerations],
        "extra_pod_config": {"runtimeClassName": settings.runtime_class} if settings.runtime_class else {},
        "environment": {"NVIDIA_DRIVER_CAPABILITIES": ",".join(request.capabilities)} if request.capabilities else {},
    }


_NVIDIA_ENV = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


def _without_gpu(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not str(k).startswith("nvidia.com/")}


def _and_terms(base: Sequence[Mapping[str, Any]], ours: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Node selector terms meaning (any base term) AND (any of ours)."""
    if not base:
        return [copy.deepcopy(dict(t)) for t in ours]
    if not ours:
        return [copy.deepcopy(dict(t)) for t in base]
    merged = []
    for b in base:
        for o in ours:
            term = copy.deepcopy(dict(b))
            term["matchExpressions"] = list(term.get("matchExpressions") or []) + copy.deepcopy(
                list(o.get("matchExpressions") or []))
            merged.append(term)
    return merged


def merge_overrides(configured: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The trait values for this spawn: what the admin configured, with this request's GPU settings.

    ``configured`` holds the values of :data:`GPU_TRAITS` as configured (before
    any spawn). GPU resources, the GPU node label and ``NVIDIA_VISIBLE_DEVICES``
    of the configured values are dropped first, so only this request's remain.
    """
    product_keys = set(overrides.get("node_selector", {})) | {PRODUCT_LABEL}
    tolerations = [copy.deepcopy(t) for t in configured.get("tolerations") or []]
    for t in overrides.get("tolerations", []):
        if t not in tolerations:
            tolerations.append(copy.deepcopy(t))
    pod_config = {k: copy.deepcopy(v) for k, v in (configured.get("extra_pod_config") or {}).items()}
    pod_config.update(copy.deepcopy(overrides.get("extra_pod_config", {})))
    environment = {k: v for k, v in (configured.get("environment") or {}).items() if k not in _NVIDIA_ENV}
    environment.update(overrides.get("environment", {}))
    return {
        "extra_resource_limits": {**_without_gpu(configured.get("extra_resource_limits") or {}),
                                  **overrides.get("extra_resource_limits", {})},
        "extra_resource_guarantees": {**_without_gpu(configured.get("extra_resource_guarantees") or {}),
                                      **overrides.get("extra_resource_guarantees", {})},
        "node_selector": {**{k: v for k, v in (configured.get("node_selector") or {}).items() if k not in product_keys},
                          **overrides.get("node_selector", {})},
        "node_affinity_required": _and_terms(configured.get("node_affinity_required") or [],
                                             overrides.get("node_affinity_required", [])),
        "tolerations": tolerations,
        "extra_pod_config": pod_config,
        "environment": environment,
    }


def replaced_settings(configured: Mapping[str, Any], *, gpu_choices: bool,
                      product_labels: Sequence[str] = (PRODUCT_LABEL,)) -> list[str]:
    """The configured (class-level) KubeSpawner settings gpu-kube would replace on some server, with why.

    ``configured`` holds the values of :data:`GPU_TRAITS` as the site configured them;
    ``gpu_choices``: some profile lets the user pick GPUs (``gpu_profiles``, the default
    profiles, a ``profile_list`` entry with ``gpu_counts``/``gpu_models``). Each sentence
    names the setting and says what to do: gpu-kube refuses such a configuration
    rather than drop a setting silently (:func:`merge_overrides` replaces these).
    """
    found = []
    environment = configured.get("environment") or {}
    for key in _NVIDIA_ENV:
        if key in environment:
            found.append(f"environment[{key!r}]: gpu-kube sets it for each server itself (NVIDIA_VISIBLE_DEVICES: "
                         "'void' for CPU-only servers, the device plugin's GPUs otherwise; "
                         "NVIDIA_DRIVER_CAPABILITIES: the profile's 'capabilities'). Remove it.")
    resources = [f"{trait}[{key!r}]" for trait in ("extra_resource_limits", "extra_resource_guarantees")
                 for key in (configured.get(trait) or {}) if str(key).startswith("nvidia.com/")]
    selector = configured.get("node_selector") or {}
    products = [f"node_selector[{label!r}]" for label in dict.fromkeys(product_labels) if label in selector]
    if gpu_choices and (resources or products):
        found.append(f"{', '.join(resources + products)}: a server of a profile with GPU choices gets the GPUs "
                     "its user picks, so this would be replaced. Set it in a profile_list entry's "
                     "kubespawner_override instead (a KubeSpawner-style GPU profile), or remove it.")
    elif products and not resources:
        found.append(f"{', '.join(products)}: without a GPU resource beside it, gpu-kube's servers ask for no GPU "
                     "and get no GPU node selection, so this would be dropped. Ask for 'nvidia.com/gpu' in "
                     "extra_resource_limits too, or set it in a profile's kubespawner_override.")
    return found
