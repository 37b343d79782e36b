"""Which GPUs a hub's single-user pods hold, read from the pods themselves. Pure.

After a hub restart the cluster is the truth: every pod KubeSpawner made for a
server carries the label ``component`` (KubeSpawner's ``component_label``,
``singleuser-server`` by default; its pod reflector selects by it too) and the
annotations ``hub.jupyter.org/username`` and, for a named server,
``hub.jupyter.org/servername`` (annotations hold the names as they are; labels
hold escaped ones). Its GPUs are its effective requests of GPU resources
(:func:`~gpuspawner.backends.kube.capacity.pod_requests`): whole GPUs, MIG slices,
time-sliced replicas.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...owner import Owner
from .capacity import is_gpu_resource, pod_requests

USERNAME_ANNOTATION = "hub.jupyter.org/username"
SERVERNAME_ANNOTATION = "hub.jupyter.org/servername"
COMPONENT_LABEL = "component"


@dataclass(frozen=True)
class ServerHoldings:
    """What :func:`server_holdings` found."""

    #: ledger owner ``"user/server"`` -> GPU resource -> count
    holdings: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: ledger owner -> its live pods holding GPUs (``namespace/name``)
    pods: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: names of this hub's pods holding GPUs that do not say whose they are
    unnamed: tuple[str, ...] = ()
    #: ledger owner -> (node, GPU resource) of each of its pods the scheduler has bound
    placed: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


def _ended(pod: Mapping[str, Any]) -> bool:
    """Terminated, or being deleted (a stop in progress gives its GPUs back)."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def server_holdings(pods: Iterable[Mapping[str, Any]], component: str = "singleuser-server") -> ServerHoldings:
    """Per server, the GPU resources its live pods ask for (scheduled or still pending).

    Only pods labelled ``component=<component>`` count (another hub in the same
    namespace uses another ``component_label``). Pods that ended or are being
    deleted hold nothing.
    """
    holdings: dict[str, dict[str, int]] = {}
    named: dict[str, list[str]] = {}
    unnamed: list[str] = []
    placed: dict[str, list[tuple[str, str]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(COMPONENT_LABEL) != component or _ended(pod):
            continue
        gpus = {r: n for r, n in pod_requests(pod).items() if is_gpu_resource(r)}
        if not gpus:
            continue
        annotations = meta.get("annotations") or {}
        user = annotations.get(USERNAME_ANNOTATION)
        if not user:
            unnamed.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
            continue
        owner = str(Owner.from_parts(user, annotations.get(SERVERNAME_ANNOTATION, "")))  # a job pod: "job/<id>"
        held = holdings.setdefault(owner, {})
        for resource, n in gpus.items():
            held[resource] = held.get(resource, 0) + n
        named.setdefault(owner, []).append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            placed.setdefault(owner, []).extend((node, resource) for resource in gpus)
    return ServerHoldings(holdings, {owner: tuple(pods) for owner, pods in named.items()}, tuple(unnamed),
                          {owner: tuple(where) for owner, where in placed.items()})


class PoolHolders(dict):
    """Ledger owner -> the pool slug (GPU model) its GPUs are of, where one was asked for (one per hub,
    ``hub_state.cache(PoolHolders)``); entries of owners no longer in the ledger are ignored."""

    def models_of(self, owner: str, keys: tuple[str, ...]) -> list[str]:
        """The model of each GPU ``owner`` holds (its ledger keys); none where not known."""
        slug = self.get(owner)
        return [slug] * len(keys) if slug else []
