"""Kueue for gpu-kube: queue labels, queue positions, quota lines and Workload verdicts.

A single-user pod labelled ``kueue.x-k8s.io/queue-name: Q`` is a Kueue
workload (Kueue's pod integration): Kueue's webhook adds the scheduling gate
``kueue.x-k8s.io/admission`` and removes it once the LocalQueue's ClusterQueue
has quota for the pod. The functions here read Kueue's objects as the API
returns them (JSON) and say what they mean in words; :class:`KueueReader`
is the only I/O (the hub's Kubernetes client, raw JSON).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...profiles import KUEUE_QUEUE_NAME
from .api import KubeAPIError, why_failed

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: On a pod's Workload (Kueue's pod integration): the pod's uid.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
GPU_RESOURCE_PREFIX = "nvidia.com/"


def check_queue_name(name: Any, where: str) -> str:
    """A LocalQueue name, or ValueError naming ``where``."""
    if not isinstance(name, str) or not KUEUE_QUEUE_NAME.fullmatch(name):
        raise ValueError(f"{where} {name!r} must be a LocalQueue name (lowercase letters, digits, '-' and '.', "
                         "at most 63 characters)")
    return name


def gated(pod: Mapping[str, Any] | None) -> bool:
    """Whether Kueue's admission gate holds ``pod`` (not scheduled until Kueue admits it)."""
    gates = ((pod or {}).get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def _owned_by_pod(meta: Mapping[str, Any], pod_name: str) -> bool:
    return any(ref.get("kind") == "Pod" and ref.get("name") == pod_name for ref in meta.get("ownerReferences") or [])


def queue_position(pending: Mapping[str, Any], pod_name: str) -> int | None:
    """The pod's place (1 = next) in its LocalQueue, from a visibility API ``pendingworkloads`` answer."""
    for item in pending.get("items") or []:
        if _owned_by_pod(item.get("metadata") or {}, pod_name):
            position = item.get("positionInLocalQueue")
            return position + 1 if isinstance(position, int) else None
    return None


def waiting_message(queue: str, position: int | None) -> str:
    if position is None:
        return f"waiting in queue {queue} (Kueue)"
    return f"waiting in queue {queue}: position {position} (Kueue)"


def _quantity(text: Any) -> int:
    """A GPU count (``"8"``, ``8``); anything else (GPUs are whole) counts as 0."""
    try:
        return int(str(text))
    except ValueError:
        return 0


def _gpu_total(flavors: Iterable[Mapping[str, Any]], key: str) -> int:
    return sum(_quantity(r.get(key)) for f in flavors for r in f.get("resources") or []
               if str(r.get("name", "")).startswith(GPU_RESOURCE_PREFIX))


@dataclass(frozen=True)
class QueueQuota:
    """A ClusterQueue's GPUs: nominal quota (all flavors of nvidia.com/ resources) and what is held."""

    name: str
    used: int
    quota: int

    @property
    def line(self) -> str:
        return f"{self.name}: {self.used} of {self.quota} GPU{'s' if self.quota != 1 else ''} in use"


def cluster_queue_quota(cluster_queue: Mapping[str, Any]) -> QueueQuota:
    """GPU quota and use of a ClusterQueue, from ``spec.resourceGroups`` and its status.

    Use is ``status.flavorsReservation`` (quota reserved by admitted and admitting
    workloads), or ``status.flavorsUsage`` where an older Kueue reports only that.
    """
    spec, status = cluster_queue.get("spec") or {}, cluster_queue.get("status") or {}
    flavors = [f for g in spec.get("resourceGroups") or [] for f in g.get("flavors") or []]
    held = status.get("flavorsReservation")
    if held is None:
        held = status.get("flavorsUsage") or []
    return QueueQuota((cluster_queue.get("metadata") or {}).get("name", "?"),
                      _gpu_total(held, "total"), _gpu_total(flavors, "nominalQuota"))


_EVICTED = {
    "Preempted": "a workload of higher priority (or of a queue reclaiming its quota) needed the GPUs",
    "PodsReadyTimeout": "the server did not become ready in time",
    "InactiveWorkload": "the workload was deactivated",
    "Deactivated": "the workload was deactivated",
    "ClusterQueueStopped": "an administrator stopped the ClusterQueue",
    "LocalQueueStopped": "an administrator stopped the LocalQueue",
    "AdmissionCheck": "an admission check withdrew its approval",
}


#: what Kueue (0.15) appends to a preemption's message: where preemptor and preemptee sit in the cohort tree
_COHORT_PATHS = re.compile(r";\s*preemptor path:.*$", re.S)


def _evicted(reason: str, message: str, queue: str) -> str:
    why = _EVICTED.get(reason, reason or "no reason given")
    detail = _COHORT_PATHS.sub("", message).strip().rstrip(".")
    return (f"Kueue evicted your server from queue {queue}: {why}"
            + (f" ({detail})" if detail else "") + ". Start it again to queue anew.")


def workload_problem(workload: Mapping[str, Any], queue: str) -> str | None:
    """A sentence when Kueue evicted or rejected the workload; ``None`` while it waits or runs."""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    evicted = conditions.get("Evicted")
    if evicted and evicted.get("status") == "True":
        return _evicted(evicted.get("reason") or "", evicted.get("message") or "", queue)
    reserved = conditions.get("QuotaReserved")
    if reserved and reserved.get("status") == "False" and reserved.get("reason") == "Inadmissible":
        detail = (reserved.get("message") or "no reason given").strip().rstrip(".")
        return f"Kueue rejected your server in queue {queue}: {detail}. Ask an administrator about the queue."
    finished = conditions.get("Finished")
    if finished and finished.get("status") == "True" and finished.get("reason") == "AdmissionChecksRejected":
        detail = (finished.get("message") or "an admission check rejected it").strip().rstrip(".")
        return f"Kueue rejected your server in queue {queue}: {detail}."
    return None


#: the condition Kueue's pod integration puts on a pod it stops: reason ``WorkloadEvictedDueTo<Evicted reason>``
#: when its Workload was evicted (Kueue then deletes the pod, and the pod's Workload goes with it)
TERMINATION_TARGET = "TerminationTarget"
_EVICTED_DUE_TO = "WorkloadEvictedDueTo"


def pod_problem(pod: Mapping[str, Any] | None, queue: str) -> str | None:
    """The eviction sentence when Kueue marked ``pod`` for termination because it evicted its Workload
    (the Workload may already be gone); ``None`` otherwise."""
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        reason = condition.get("reason") or ""
        if (condition.get("type") == TERMINATION_TARGET and condition.get("status") == "True"
                and reason.startswith(_EVICTED_DUE_TO)):
            return _evicted(reason.removeprefix(_EVICTED_DUE_TO), condition.get("message") or "", queue)
    return None


#: the reason of the event Kueue records on a Workload it evicts: ``EvictedDueTo<Evicted reason>``
_WORKLOAD_EVICTED_DUE_TO = "EvictedDueTo"


def events_problem(events: Iterable[Mapping[str, Any]], queue: str) -> str | None:
    """The eviction sentence from the events Kueue recorded on a Workload, the latest first; ``None`` if none."""
    evictions = [e for e in events if (e.get("reason") or "").startswith(_WORKLOAD_EVICTED_DUE_TO)]
    if not evictions:
        return None
    last = max(evictions, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return _evicted(last["reason"].removeprefix(_WORKLOAD_EVICTED_DUE_TO), last.get("message") or "", queue)


def pod_gone(queue: str) -> str:
    """The sentence when a queued server's pod was deleted before it started, and Kueue left no word why."""
    return (f"Your server's pod was deleted while it waited in Kueue queue {queue} (Kueue evicts a pod by"
            " deleting it, or an administrator removed it). Start it again to queue anew.")


def workload_of(workloads: Iterable[Mapping[str, Any]], pod_name: str) -> Mapping[str, Any] | None:
    """The Workload Kueue made for ``pod_name`` (its owner reference), if any."""
    return next((w for w in workloads if _owned_by_pod(w.get("metadata") or {}, pod_name)), None)


class KueueReader:
    """Kueue's objects through the hub's Kubernetes client (raw JSON, no models)."""

    def __init__(self, api_client, timeout: float = 10.0) -> None:
        self.api_client = api_client  # kubernetes_asyncio.client.ApiClient
        self.timeout = timeout

    async def _get(self, path: str, query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        async def call() -> dict[str, Any]:
            response = await self.api_client.call_api(
                path, "GET", query_params=query or [], header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"], _preload_content=False)
            response = response[0] if isinstance(response, tuple) else response
            try:
                if response.status >= 400:
                    raise KubeAPIError(response.status, response.reason)
                return await response.json()
            finally:
                response.release()
        return await asyncio.wait_for(call(), self.timeout)

    async def pending_workloads(self, namespace: str, queue: str) -> dict[str, Any]:
        return await self._get(f"/apis/{VISIBILITY_GROUP}/{VERSION}/namespaces/{namespace}"
                               f"/localqueues/{queue}/pendingworkloads")

    async def workloads(self, namespace: str, pod_uid: str | None = None) -> list[dict[str, Any]]:
        """The namespace's Workloads; with ``pod_uid``, only that pod's (label ``kueue.x-k8s.io/job-uid``)."""
        query = [("labelSelector", f"{JOB_UID_LABEL}={pod_uid}")] if pod_uid else None
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/workloads"
        return (await self._get(path, query)).get("items") or []

    async def workload_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The events recorded on one Workload (they outlive it, for the API server's event TTL)."""
        query = [("fieldSelector", f"involvedObject.kind=Workload,involvedObject.name={name}")]
        return (await self._get(f"/api/v1/namespaces/{namespace}/events", query)).get("items") or []

    async def quota_lines(self, namespace: str, queues: Iterable[str]) -> dict[str, str]:
        """Each LocalQueue's ClusterQueue GPU line (:func:`quota_lines`), from one list of each; or why unknown."""
        queues = sorted(set(queues))
        if not queues:
            return {}
        try:
            local = (await self._get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/localqueues")).get("items")
            cluster = (await self._get(f"/apis/{GROUP}/{VERSION}/clusterqueues")).get("items")
        except Exception as e:  # the form still renders; it says why the line is missing
            return {q: f"queue {q}: GPU quota unknown ({why_failed(e)})" for q in queues}
        return quota_lines(local or [], cluster or [], queues)


def quota_lines(local_queues: Iterable[Mapping[str, Any]], cluster_queues: Iterable[Mapping[str, Any]],
                queues: Iterable[str]) -> dict[str, str]:
    """LocalQueue name -> its ClusterQueue's line (``"team-a: 6 of 8 GPUs in use"``), from listed objects."""
    target = {(q.get("metadata") or {}).get("name"): (q.get("spec") or {}).get("clusterQueue")
              for q in local_queues}
    by_name = {(c.get("metadata") or {}).get("name"): c for c in cluster_queues}
    lines = {}
    for queue in queues:
        if queue not in target:
            lines[queue] = f"queue {queue}: no such LocalQueue in this namespace"
        elif target[queue] not in by_name:
            lines[queue] = f"queue {queue}: its ClusterQueue {target[queue]} does not exist"
        else:
            lines[queue] = cluster_queue_quota(by_name[target[queue]]).line
    return lines


__all__ = [
    "ADMISSION_GATE",
    "JOB_UID_LABEL",
    "QUEUE_LABEL",
    "KueueReader",
    "QueueQuota",
    "check_queue_name",
    "cluster_queue_quota",
    "gated",
    "events_problem",
    "pod_gone",
    "pod_problem",
    "queue_position",
    "quota_lines",
    "waiting_message",
    "workload_of",
    "workload_problem",
]
