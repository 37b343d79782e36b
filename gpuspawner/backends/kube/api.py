"""Reading nodes and pods from the Kubernetes API: the only I/O of gpuspawner.backends.kube.

:class:`ClusterCapacity` lists nodes and pods through a kubernetes_asyncio
``CoreV1Api`` (KubeSpawner's own client in the hub), turns them into
:func:`~gpuspawner.backends.kube.capacity.cluster_inventory`, and keeps the result for
a few seconds. A failed read never raises: the reading says availability is
unknown (and why), keeping the last good inventory if there is one, so the
form still renders and spawns still go to the scheduler.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from .capacity import NodeGPUs, cluster_inventory

# Pods that hold nothing: leave them out server-side (capacity.py filters again).
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class ClusterReading:
    nodes: tuple[NodeGPUs, ...] = ()
    unknown: str | None = None  # why availability is unknown; None when this reading is fresh
    read_at: float = 0.0  # time.monotonic() of the data in nodes


def why_failed(error: BaseException) -> str:
    status = getattr(error, "status", None)
    reason = getattr(error, "reason", None)
    if status:
        return f"Kubernetes API answered {status} {reason or ''}".strip()
    if isinstance(error, asyncio.TimeoutError):
        return "Kubernetes API did not answer in time"
    return f"Kubernetes API unreachable ({type(error).__name__})"


class KubeAPIError(Exception):
    """The API answered with an error status."""

    def __init__(self, status: int, reason: str | None) -> None:
        super().__init__(f"{status} {reason or ''}".strip())
        self.status = status
        self.reason = reason


async def _json(call, **kwargs) -> dict[str, Any]:
    # Raw JSON (no model objects): 1,000 nodes parse in milliseconds instead of seconds.
    response = await call(_preload_content=False, **kwargs)
    try:
        if response.status >= 400:  # raw responses do not raise by themselves
            raise KubeAPIError(response.status, response.reason)
        return await response.json()
    finally:
        response.release()


async def list_server_pods(api, component: str, namespace: str | None, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The live pods labelled ``component=<component>`` in ``namespace`` (``None``: every namespace).

    Raises on any failure (:class:`KubeAPIError`, a timeout, a connection error).
    """
    selectors = {"label_selector": f"component={component}", "field_selector": ACTIVE_PODS}
    if namespace is None:
        call = _json(api.list_pod_for_all_namespaces, **selectors)
    else:
        call = _json(api.list_namespaced_pod, namespace=namespace, **selectors)
    return (await asyncio.wait_for(call, timeout)).get("items") or []


class ClusterCapacity:
    """Cached GPU inventory of one cluster."""

    def __init__(self, api, ttl: float = 5.0, timeout: float = 10.0, unhealthy_taints: tuple[str, ...] = ()) -> None:
        self.api = api  # kubernetes_asyncio.client.CoreV1Api
        self.unhealthy_taints = unhealthy_taints  # kube_gpu_health_taints
        self.ttl = ttl
        self.timeout = timeout
        self._reading: ClusterReading | None = None
        self._failure: ClusterReading | None = None
        self._failed_at = 0.0
        self._lock = asyncio.Lock()

    async def _fetch(self) -> tuple[NodeGPUs, ...]:
        nodes = await _json(self.api.list_node)
        pods = await _json(self.api.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS)
        return cluster_inventory(nodes.get("items") or [], pods.get("items") or [], self.unhealthy_taints)

    async def read(self) -> ClusterReading:
        now = time.monotonic()
        cached = self._reading
        if cached is not None and now - cached.read_at < self.ttl:
            return cached
        if self._failure is not None and now - self._failed_at < self.ttl:
            return self._failure  # do not hammer an API that just failed
        async with self._lock:  # one request at a time; others reuse its answer
            cached = self._reading
            if cached is not None and time.monotonic() - cached.read_at < self.ttl:
                return cached
            try:
                nodes = await asyncio.wait_for(self._fetch(), self.timeout)
            except Exception as e:  # any failure means "availability unknown"
                last = self._reading
                self._failure = ClusterReading(last.nodes if last else (), why_failed(e), last.read_at if last else 0.0)
                self._failed_at = time.monotonic()
                return self._failure
            self._failure = None
            self._reading = ClusterReading(nodes, None, time.monotonic())
            return self._reading


async def create_pod(api, namespace: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Create a pod from its JSON; raises :class:`KubeAPIError` (409: one of that name exists) and the like."""
    return await asyncio.wait_for(_json(api.create_namespaced_pod, namespace=namespace, body=body), timeout)


async def read_pod(api, namespace: str, name: str, timeout: float = 10.0) -> dict[str, Any] | None:
    """The pod as JSON, or ``None`` when there is none of that name."""
    try:
        return await asyncio.wait_for(_json(api.read_namespaced_pod, name=name, namespace=namespace), timeout)
    except KubeAPIError as e:
        if e.status == 404:
            return None
        raise


async def delete_pod(api, namespace: str, name: str, grace_seconds: int | None = None, timeout: float = 10.0) -> bool:
    """Delete a pod (its containers get SIGTERM, then SIGKILL after ``grace_seconds``); False if it was gone."""
    kwargs: dict[str, Any] = {"name": name, "namespace": namespace}
    if grace_seconds is not None:
        kwargs["grace_period_seconds"] = grace_seconds
    try:
        await asyncio.wait_for(_json(api.delete_namespaced_pod, **kwargs), timeout)
    except KubeAPIError as e:
        if e.status == 404:
            return False
        raise
    return True
