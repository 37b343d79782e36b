"""GPU health where the cluster places the GPUs (gpu-kube, gpu-slurm): what its nodes say.

The hub does not read these GPUs through NVML; the cluster knows their health and says it per node:

- **Kubernetes**: NVIDIA's device plugin drops an unhealthy device from the node's
  ``status.allocatable`` (``status.capacity`` keeps it): ``capacity - allocatable`` GPUs of that
  resource are out of service (:mod:`gpuspawner.backends.kube.health`);
- **Slurm**: a node drained, down or failing (``sinfo``'s state and flags) with a reason
  (``scontrol update nodename=... state=drain reason=...``, or Slurm's own, e.g. "Not responding")
  has all its GPUs out of service, since Slurm's reason time (:mod:`gpuspawner.backends.slurm.health`).

A backend's reader (its spawner class's ``cluster_health_reader(config)``) answers one
:class:`NodeHealth` per node and model; :class:`ClusterHealth` (one per hub, ``hub_state.health.cluster``)
keeps the newest answer and, where the cluster does not say since when, the first time the hub saw
it. Placement and the form read the same node objects themselves (a pool's unhealthy GPUs are
"unavailable"), so this is for ``/hub/gpus``, the metrics and the users to tell. A GPU comes back when
the cluster says so (the device plugin advertises it again; an administrator resumes the Slurm node):
the cluster's own administrators decide, not the hub's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

__all__ = ["ClusterHealth", "NodeHealth"]


@dataclass(frozen=True)
class NodeHealth:
    """The GPUs of one model on one cluster node: how many, how many out of service, why, since when."""

    node: str
    model: str  # the slug a user picks as gpu_model
    name: str  # how the form names the model
    total: int  # GPUs of this model on the node, in service or not
    out: int = 0  # of them out of service
    reason: str = ""  # why ("" while none is out)
    since: float | None = None  # time.time() it began, where the cluster says (Slurm's reason time)
    #: ledger owners (``user/server``, ``user/job/<id>``) whose workload on this node certainly uses a GPU
    #: that is out of service: every workload on a node Slurm took out; on Kubernetes, one holding more of
    #: the node's GPUs of this model than remain in service (the device plugin does not say which device failed)
    affected: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"node": self.node, "model": self.model, "name": self.name, "total": self.total, "out": self.out,
                "reason": self.reason, "since": self.since, "affected": list(self.affected)}


class ClusterHealth:
    """The newest word of the cluster on its nodes' GPUs (thread-safe; the metrics read it from any thread)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: tuple[NodeHealth, ...] = ()
        self._first_seen: dict[tuple[str, str], float] = {}  # (node, model) -> when the hub first saw GPUs out
        self.unknown: str | None = None  # why the last reading failed (the last good one is kept)

    def update(self, nodes: Iterable[NodeHealth]) -> tuple[tuple[NodeHealth, ...], tuple[NodeHealth, ...]]:
        """A new reading of every node: (what went out or changed reason, what came back)."""
        now = self._clock()
        with self._lock:
            before = {(n.node, n.model): n for n in self._nodes if n.out}
            kept: list[NodeHealth] = []
            first: dict[tuple[str, str], float] = {}
            for n in nodes:
                key = (n.node, n.model)
                if n.out:
                    first[key] = self._first_seen.get(key, now)
                    n = n if n.since is not None else replace(n, since=first[key])
                kept.append(n)
            self._nodes, self._first_seen, self.unknown = tuple(kept), first, None
            now_out = {(n.node, n.model): n for n in kept if n.out}
        went_out = tuple(n for key, n in now_out.items()
                         if key not in before or (before[key].reason, before[key].out) != (n.reason, n.out))
        came_back = tuple(n for key, n in before.items() if key not in now_out)
        return went_out, came_back

    def failed(self, why: str) -> None:
        """The cluster did not answer: the last reading stands, and says why it is not newer."""
        self.unknown = why

    def nodes(self) -> tuple[NodeHealth, ...]:
        """Every node and model of the last reading, healthy or not."""
        with self._lock:
            return self._nodes

    def outages(self) -> tuple[NodeHealth, ...]:
        """The nodes and models with GPUs out of service, by node."""
        return tuple(sorted((n for n in self.nodes() if n.out), key=lambda n: (n.node, n.model)))


def numbered(nodes: Iterable[NodeHealth]) -> Iterable[tuple[str, str, str, int]]:
    """``(gpu, host, model, healthy)`` for each GPU of ``nodes``, for ``gpuspawner_gpu_healthy``: the cluster
    names no device, so a node's GPUs of one model are numbered ``<node>/<model>/<n>`` from 0, those in
    service first (1) and those out of service last (0): the numbers say how many, not which device."""
    for n in nodes:
        for i in range(n.total):
            yield f"{n.node}/{n.model}/{i}", n.node, n.model, 1 if i < n.total - n.out else 0
