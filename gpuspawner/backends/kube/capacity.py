"""GPU capacity of a Kubernetes cluster, from its node and pod objects. Pure.

Nodes say what they have through the labels NVIDIA GPU Feature Discovery sets
(``nvidia.com/gpu.product``, ``nvidia.com/gpu.count``, ``nvidia.com/gpu.memory``,
``nvidia.com/cuda.driver.major``/``.minor``, ``nvidia.com/mig.strategy``,
``nvidia.com/gpu.replicas``) and through ``status.allocatable`` (what the
NVIDIA device plugin advertises: ``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``,
``nvidia.com/gpu.shared``). What is free on a node is its allocatable minus the
requests of the pods bound to it that have not terminated. A device the plugin
finds unhealthy leaves the allocatable and stays in ``status.capacity``: the
difference is out of service (:mod:`gpuspawner.backends.kube.health`).

Every GPU resource of a node falls in one *pool*, named by the slug a user
picks as ``gpu_model``:

==========  ==================================  =============================
kind        example slug                        resource
==========  ==================================  =============================
``gpu``     ``a100-sxm4-80gb``                  ``nvidia.com/gpu``
``mig``     ``mig-1g-10gb-a100-sxm4-80gb``      ``nvidia.com/mig-1g.10gb``
                                                (``nvidia.com/gpu`` with the
                                                single MIG strategy)
``shared``  ``shared-t4``                       ``nvidia.com/gpu.shared``
                                                (``nvidia.com/gpu`` when
                                                time-slicing does not rename)
==========  ==================================  =============================

Profiles select pools with the same prefix patterns as elsewhere: ``"a100"``
picks whole A100s only, ``"mig"`` every MIG slice, ``"shared"`` every shared pool.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...availability import ModelAvailability, Tally
from ...compat import CudaVersion, cuda_version_text
from ...gpu import GPU, model_rank, model_slug, slug_matches
from ...queue import Known
from ...refusals import PlacementError, Refusal, refuse, words
from .cuda import node_cuda

PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
MEMORY_LABEL = "nvidia.com/gpu.memory"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
_MIG_RESOURCE = re.compile(r"nvidia\.com/mig-([0-9]+g\.[0-9]+gb)")
_MIG_PRODUCT = re.compile(r"(.+)-MIG-([0-9]+g\.[0-9]+gb)")
SHARED_NOTE = "shared, no memory isolation"


class CapacityError(PlacementError):
    """A request the cluster cannot take: ``never`` when no node ever could.

    A :class:`~gpuspawner.refusals.PlacementError` like the hub's own refusals: its ``code``
    (``no_matching_model``, ``driver_too_old``, ``exceeds_host_size``, ``none_usable`` or
    ``none_free``) and sentence come from :data:`~gpuspawner.refusals.SENTENCES`.
    """

    def __init__(self, message: str, *, code: Refusal | str, never: bool, **details: Any) -> None:
        super().__init__(message, code=code, **details)
        self.never = never


@dataclass(frozen=True)
class NodePool:
    """One GPU resource on one node."""

    slug: str
    kind: str  # "gpu" | "mig" | "shared"
    name: str
    resource: str
    product: str  # the node's nvidia.com/gpu.product label value
    allocatable: int
    used: int
    out: int = 0  # unhealthy: in the node's capacity, dropped from its allocatable by the device plugin

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.used)


@dataclass(frozen=True)
class NodeGPUs:
    """What one node offers."""

    name: str
    schedulable: bool  # Ready and not cordoned
    cuda: CudaVersion | None
    memory_mib: int | None
    pools: tuple[NodePool, ...]
    #: a taint of ``kube_gpu_health_taints`` on it (all its GPUs out of service): ``(key, value, effect, timeAdded)``
    unhealthy_taint: tuple[str, str, str, str] | None = None

    def free(self, pool: NodePool) -> int:
        return pool.free if self.schedulable else 0


@dataclass(frozen=True)
class Pool:
    """One pool across the cluster."""

    slug: str
    kind: str
    name: str
    resource: str
    products: tuple[str, ...]
    free: int  # free, total, largest, max_per_node, unavailable: see gpuspawner.availability
    total: int  # on schedulable nodes
    largest: int  # most free on one node: the biggest request that fits now
    max_per_node: int  # most on one node at all: the biggest request that can ever fit
    nodes: int
    unavailable: int = 0  # on nodes that are not Ready or are cordoned

    @property
    def note(self) -> str:
        return SHARED_NOTE if self.kind == "shared" else ""

    def availability(self, known: bool = True) -> ModelAvailability:
        """What the spawn form shows for this pool."""
        return ModelAvailability(self.slug, self.name, self.free, self.total, self.largest, self.unavailable,
                                 self.max_per_node, self.note, known)


@dataclass(frozen=True)
class Placement:
    """What a pod must ask for: the resource, and the node products allowed."""

    kind: str
    resource: str
    products: tuple[str, ...]
    name: str  # what the user asked for, in words: "NVIDIA-A100-SXM4-80GB", "GPU"
    count: int


# ---------------------------------------------------------------- parsing


def _count(value: Any) -> int:
    """An extended-resource quantity (always a whole number) as an int; 0 if odd."""
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0, value)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        match = re.fullmatch(r"([0-9]+)(k|M|G)", text)
        if match:
            return int(match.group(1)) * {"k": 10**3, "M": 10**6, "G": 10**9}[match.group(2)]
    return 0


def _kind_of(resource: str, product: str, labels: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(slug, kind, name) of a node resource, or None when it is not a GPU resource."""
    mig = _MIG_RESOURCE.fullmatch(resource)
    if mig:
        size = mig.group(1)
        parent = product or "GPU"
        return f"mig-{model_slug(size)}-{model_slug(parent)}", "mig", f"MIG {size} slice of {parent}"
    if resource == SHARED_RESOURCE:
        base = product.removesuffix("-SHARED") or "GPU"
        return f"shared-{model_slug(base)}", "shared", base
    if resource != GPU_RESOURCE:
        return None
    single = _MIG_PRODUCT.fullmatch(product)
    if single:
        parent, size = single.groups()
        return f"mig-{model_slug(size)}-{model_slug(parent)}", "mig", f"MIG {size} slice of {parent}"
    replicas = _count(labels.get(REPLICAS_LABEL, "1"))
    if product.endswith("-SHARED") or replicas > 1:
        base = product.removesuffix("-SHARED") or "GPU"
        return f"shared-{model_slug(base)}", "shared", base
    return model_slug(product) if product else "unknown", "gpu", product or "unknown GPU"


def is_gpu_resource(resource: str) -> bool:
    """Whether a pod resource is a GPU the hub counts: a whole GPU, a MIG slice or a time-sliced replica."""
    return resource in (GPU_RESOURCE, SHARED_RESOURCE) or _MIG_RESOURCE.fullmatch(resource) is not None


def _schedulable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The NVIDIA extended resources a pod holds (its effective requests).

    Extended resources have requests equal to limits; a container that sets
    only the limit requests the same. The effective request is the larger of
    the sum over containers and the largest init container.
    """
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> dict[str, int]:
        resources = container.get("resources") or {}
        values = dict(resources.get("limits") or {})
        values.update(resources.get("requests") or {})
        return {k: _count(v) for k, v in values.items() if k.startswith("nvidia.com/")}

    total: dict[str, int] = defaultdict(int)
    for container in spec.get("containers") or []:
        for key, n in of(container).items():
            total[key] += n
    for container in spec.get("initContainers") or []:
        for key, n in of(container).items():
            total[key] = max(total[key], n)
    return {k: v for k, v in total.items() if v}


def _holds_resources(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def _taint(node: Mapping[str, Any], keys: Iterable[str]) -> tuple[str, str, str, str] | None:
    """The node's first taint whose key is one of ``keys``, as (key, value, effect, timeAdded)."""
    wanted = set(keys)
    for taint in (node.get("spec") or {}).get("taints") or () if wanted else ():
        if taint.get("key") in wanted:
            return (taint["key"], str(taint.get("value") or ""), str(taint.get("effect") or ""),
                    str(taint.get("timeAdded") or ""))
    return None


def cluster_inventory(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                      unhealthy_taints: Iterable[str] = ()) -> tuple[NodeGPUs, ...]:
    """Every node's GPU pools with what its running pods use. Nodes without GPUs are left out. A node with
    a taint whose key is one of ``unhealthy_taints`` has all its GPUs out of service (not schedulable)."""
    unhealthy_taints = tuple(unhealthy_taints)
    used: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pod in pods:
        if not _holds_resources(pod):
            continue
        node_name = pod["spec"]["nodeName"]
        for key, n in pod_requests(pod).items():
            used[node_name][key] += n
    result = []
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        capacity = (node.get("status") or {}).get("capacity") or {}
        product = labels.get(PRODUCT_LABEL, "")
        name = meta.get("name", "")
        pools = []
        for resource in sorted(allocatable.keys() | capacity.keys()):
            kind = _kind_of(resource, product, labels)
            n = _count(allocatable.get(resource))
            out = max(0, _count(capacity.get(resource)) - n)  # the device plugin's unhealthy devices
            if kind is None or n + out == 0:
                continue
            slug, pool_kind, pool_name = kind
            pools.append(NodePool(slug, pool_kind, pool_name, resource, product, n, used[name].get(resource, 0), out))
        if not pools:
            continue
        memory = _count(labels.get(MEMORY_LABEL)) or None
        taint = _taint(node, unhealthy_taints)
        result.append(NodeGPUs(name, _schedulable(node) and taint is None, node_cuda(labels), memory, tuple(pools),
                               taint))
    return tuple(result)


# ---------------------------------------------------------------- pools


def pools(nodes: Iterable[NodeGPUs], cuda: CudaVersion | None = None) -> list[Pool]:
    """Free/total per pool across nodes (only nodes whose driver supports ``cuda``, when given).

    Counted by :class:`~gpuspawner.availability.Tally`, so free and total mean
    what they mean on the form everywhere: a pool's GPUs on a node that is not
    Ready or is cordoned, and those the device plugin dropped from a node's
    allocatable as unhealthy, are ``unavailable``, not part of the total.
    """
    tally = Tally()
    first: dict[str, NodePool] = {}
    products: dict[str, set[str]] = defaultdict(set)
    node_count: Counter[str] = Counter()
    for node in nodes:
        if cuda is not None and (node.cuda is None or node.cuda < cuda):
            continue
        for p in node.pools:
            if first.setdefault(p.slug, p).resource != p.resource:
                continue  # the same model under another resource name: cannot be asked for in one pod
            products[p.slug].add(p.product)
            node_count[p.slug] += 1
            tally.add(p.slug, p.name, node.name, p.allocatable, node.free(p), node.schedulable)
            if p.out:  # unhealthy devices: out of service wherever they are
                tally.add(p.slug, p.name, node.name, p.out, 0, in_service=False)
    return sorted(
        (
            Pool(slug, first[slug].kind, m.name, first[slug].resource, tuple(sorted(products[slug])),
                 m.free, m.total, m.largest, m.most_on_one_host, node_count[slug], m.unavailable)
            for slug, m in tally.models().items()
        ),
        key=lambda p: ({"gpu": 0, "mig": 1, "shared": 2}[p.kind], p.name, p.slug),
    )


def _label(pool: Pool) -> str:
    return f"{pool.name} ({pool.note})" if pool.note else pool.name


def _inventory_sentence(all_pools: Sequence[Pool]) -> str:
    if not all_pools:
        return "This cluster has no GPU nodes."
    listed = ", ".join(f"{_label(p)} (up to {p.max_per_node} per node)" for p in all_pools)
    return f"GPU models here: {listed}."


def _cuda_ceiling(nodes: Iterable[NodeGPUs], slugs: set[str]) -> str:
    versions = sorted({n.cuda for n in nodes if n.cuda and any(p.slug in slugs for p in n.pools)})
    return cuda_version_text(versions[-1]) if versions else "unknown"


def place(
    nodes: Sequence[NodeGPUs],
    patterns: Sequence[str],
    count: int,
    cuda: CudaVersion | None = None,
    refuse_now: bool = True,
) -> Placement:
    """Which pool a request of ``count`` from ``patterns`` (``()`` = any whole GPU) goes to.

    Raises :class:`CapacityError` with a sentence for the user when no node
    could ever hold it (``never``) or none has room now (unless not
    ``refuse_now``: when the data may be stale, only the scheduler can tell). The scheduler picks
    the node and the device plugin the GPUs; this only decides the resource and
    the node products the pod may land on.
    """
    all_pools = pools(nodes)
    asked = {"requested": count, "models": tuple(patterns)}
    if patterns:
        candidates = [p for p in all_pools if any(slug_matches(pat, p.slug) for pat in patterns)]
        names = sorted({_label(p) for p in candidates})
        what = names[0] if len(names) == 1 else " or ".join(pat.upper() for pat in patterns)
    else:
        candidates = [p for p in all_pools if p.kind == "gpu"]
        what = "GPU"
    if not candidates:
        raise refuse("kube_no_matching_model", {"what": what, "inventory": _inventory_sentence(all_pools)},
                     CapacityError, never=True, **asked)
    # One pod asks for one resource: keep whole GPUs when the choice allows them,
    # else the resource with the most free.
    by_resource: dict[str, list[Pool]] = defaultdict(list)
    for p in candidates:
        by_resource[(p.kind, p.resource)].append(p)
    key = ("gpu", GPU_RESOURCE) if ("gpu", GPU_RESOURCE) in by_resource else max(
        by_resource, key=lambda k: (sum(p.free for p in by_resource[k]), k))
    group = by_resource[key]
    slugs = {p.slug for p in group}
    if cuda is not None:
        usable = [p for p in pools(nodes, cuda) if p.slug in slugs]
        if not usable:
            raise refuse("kube_driver_too_old", {
                "what": what, "cuda": cuda_version_text(cuda), "newest": _cuda_ceiling(nodes, slugs),
                "inventory": _inventory_sentence(all_pools)}, CapacityError, never=True, **asked)
        group = usable
    fits_ever = [p for p in group if p.max_per_node >= count]
    if not fits_ever:
        most = max(p.max_per_node for p in group)
        raise refuse("kube_exceeds_host_size", {"what": what, "count": count, "most": most,
                                                "inventory": _inventory_sentence(all_pools)},
                     CapacityError, never=True, **asked)
    if refuse_now and not any(p.largest >= count for p in fits_ever):
        free = sum(p.free for p in group)
        total = sum(p.total for p in group)
        largest = max(p.largest for p in group)
        down = sum(p.unavailable for p in group)
        are = "is" if down == 1 else "are"
        others = "".join(words("has_free", name=_label(p), free=p.free)
                         for p in [p for p in all_pools if p.slug not in slugs and p.largest >= count][:3])
        if total == 0:
            raise refuse("kube_none_usable", {"what": what, "down": down, "are": are, "others": others},
                         CapacityError, never=False, **asked)
        unavailable = words("kube_unavailable", down=down, are=are) if down else ""
        raise refuse("kube_none_free", {"what": what, "free": free, "total": total, "largest": largest, "count": count,
                                        "unavailable": unavailable, "others": others},
                     CapacityError, never=False, **asked)
    products = tuple(sorted({prod for p in fits_ever for prod in p.products}))
    if "" in products:  # nodes without GPU Feature Discovery's product label: only the resource can select them
        products = ()
    return Placement(key[0], key[1], products, what, count)


def offered_models(nodes: Iterable[NodeGPUs]) -> tuple[GPU, ...]:
    """One entry per pool the cluster's nodes offer, named by its slug.

    The hub's queue compares waiting requests by the GPU models they could use; on
    Kubernetes the device plugin owns the GPUs themselves, so this is all it needs.
    """
    slugs = sorted({pool.slug for node in nodes for pool in node.pools})
    return tuple(GPU(host="cluster", index=n, uuid=f"pool/{slug}", name=slug) for n, slug in enumerate(slugs))


def queue_known(nodes: Iterable[NodeGPUs], models: tuple[str, ...]) -> Known:
    """What the hub's queue tells a request waiting for ``models`` (patterns; none: any) on this
    cluster: the pools' GPUs in service and how many of them are in use (by anyone)."""
    mine = [p for p in pools(nodes) if model_rank(models, p.slug) is not None]
    names = {p.name for p in mine}
    return Known(sum(p.total for p in mine), sum(p.total - p.free for p in mine),
                 names.pop() if len(names) == 1 else "GPUs")
