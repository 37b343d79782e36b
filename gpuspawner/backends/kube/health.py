"""gpu-kube's GPU health: the devices NVIDIA's device plugin finds unhealthy, per node and model.

The device plugin health-checks its devices (XIDs, as :mod:`gpuspawner.health` counts them) and drops an
unhealthy one from the node's ``status.allocatable``; ``status.capacity`` keeps it. So a node's pool
(:mod:`.capacity`) has ``capacity - allocatable`` GPUs out of service: the scheduler places no pod on
them, the form counts them "out of service" (:func:`.capacity.pools`), and this module says so to the
hub (:class:`~gpuspawner.health_cluster.NodeHealth`): ``/hub/gpus``, ``gpuspawner_gpu_healthy`` and the
users to tell. The device plugin names no device, so the hub cannot know which pod holds the failed one:
it tells the users whose pod holds more of that node's GPUs of the model than remain in service (a
one-GPU node, a pod holding all of a node's GPUs): their pod certainly has it. When the device is healthy
again the plugin advertises it again, and it is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...health_cluster import NodeHealth
from .api import _json, list_server_pods, why_failed
from .capacity import cluster_inventory
from .holdings import server_holdings

#: why a node's GPUs are out of service, in words
UNHEALTHY = ("the NVIDIA device plugin reports {out} of {total} {resource} unhealthy "
             "(left out of the node's allocatable)")


def node_health(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                component: str = "singleuser-server") -> list[NodeHealth]:
    """Every GPU pool of every node, with what is out of service and the owners of this hub's pods
    (``component``: KubeSpawner's ``component_label``) that certainly hold a failed GPU."""
    pods = list(pods)
    found = server_holdings(pods, component)
    result = []
    for node in cluster_inventory(nodes, ()):
        for pool in node.pools:
            total = pool.allocatable + pool.out
            affected = () if not pool.out else tuple(sorted(
                owner for owner, where in found.placed.items()
                if (node.name, pool.resource) in where and found.holdings[owner][pool.resource] > pool.allocatable))
            reason = UNHEALTHY.format(out=pool.out, total=total, resource=pool.resource) if pool.out else ""
            result.append(NodeHealth(node.name, pool.slug, pool.name, total, pool.out, reason, None, affected))
    return result


class KubeHealthReader:
    """Reads node health through a gpu-kube spawner's Kubernetes client, made on first use (the client
    belongs to the hub's event loop)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._spawner: Any = None

    @classmethod
    def of(cls, spawner_class: type, config: Any) -> KubeHealthReader:
        return cls(lambda: spawner_class(config=config, _mock=True))  # its API client and settings; no pod

    async def read(self) -> list[NodeHealth]:
        """Every node's GPU health now; RuntimeError saying why when the Kubernetes API does not answer."""
        if self._spawner is None:
            self._spawner = self._make()
        s = self._spawner
        namespace = None if s.enable_user_namespaces else s.namespace
        try:
            nodes = await asyncio.wait_for(_json(s.api.list_node), s.k8s_api_request_timeout)
            pods = await list_server_pods(s.api, s.component_label, namespace, s.k8s_api_request_timeout)
        except Exception as e:  # any failure: health unknown this time
            raise RuntimeError(why_failed(e)) from e
        return node_health(nodes.get("items") or [], pods, s.component_label)


class KubeHealthMixin:
    """A parent of :class:`~.spawner.GPUKubeSpawner`: the hub reads node health through it."""

    @classmethod
    def cluster_health_reader(cls, config: Any) -> KubeHealthReader:
        """The reader of the cluster's GPU health (:mod:`gpuspawner.hub.health` calls it once per hub)."""
        return KubeHealthReader.of(cls, config)
