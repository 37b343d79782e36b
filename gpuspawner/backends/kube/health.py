"""gpu-kube's GPU health: the devices NVIDIA's device plugin finds unhealthy, per node and model.

The device plugin health-checks its devices (XIDs, as :mod:`gpuspawner.health` counts them) and drops an
unhealthy one from the node's ``status.allocatable``; ``status.capacity`` keeps it. So a node's pool
(:mod:`.capacity`) has ``capacity - allocatable`` GPUs out of service: the scheduler places no pod on
them, the form counts them "out of service" (:func:`.capacity.pools`), and this module says so to the
hub (:class:`~gpuspawner.health_cluster.NodeHealth`): ``/hub/gpus``, ``gpuspawner_gpu_healthy`` and the
users to tell. The device plugin names no device, so the hub cannot know which pod holds the failed one:
it tells the users whose pod holds more of that node's GPUs of the model than remain in service (a
one-GPU node, a pod holding all of a node's GPUs): their pod certainly has it. When the device is healthy
again the plugin advertises it again, and it is back. Where a site knows more than the plugin (an
administrator, a health checker), a taint of ``kube_gpu_health_taints`` takes all the node's GPUs out and
tells every user with a pod holding them.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from traitlets import List, TraitError, Unicode, validate
from traitlets.config import Configurable

from ...health_cluster import NodeHealth
from .api import _json, list_server_pods, why_failed
from .capacity import cluster_inventory
from .holdings import server_holdings

_TAINT_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
#: why a node's GPUs are out of service, in words
UNHEALTHY = ("the NVIDIA device plugin reports {out} of {total} {resource} unhealthy "
             "(left out of the node's allocatable)")
TAINTED = "the node is tainted {taint} ({effect}): its GPUs are out of service"


def _since(time_added: str) -> float | None:
    try:
        return datetime.fromisoformat(time_added.replace("Z", "+00:00")).timestamp() if time_added else None
    except ValueError:
        return None


def node_health(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                component: str = "singleuser-server", unhealthy_taints: Iterable[str] = ()) -> list[NodeHealth]:
    """Every GPU pool of every node, with what is out of service and the owners of this hub's pods
    (``component``: KubeSpawner's ``component_label``) that certainly hold a failed GPU: on a node with one
    of ``unhealthy_taints``, every pod holding its GPUs."""
    found = server_holdings(pods, component)
    placed: dict[tuple[str, str], dict[str, int]] = {}  # (node, resource) -> owner -> GPUs it holds
    for owner, where in found.placed.items():
        for node_resource in where:
            placed.setdefault(node_resource, {})[owner] = found.holdings[owner][node_resource[1]]
    result = []
    for node in cluster_inventory(nodes, (), unhealthy_taints):
        for pool in node.pools:
            total = pool.allocatable + pool.out
            on_it = placed.get((node.name, pool.resource), {})
            if node.unhealthy_taint is not None:
                key, value, effect, added = node.unhealthy_taint
                reason = TAINTED.format(taint=f"{key}={value}" if value else key, effect=effect)
                result.append(NodeHealth(node.name, pool.slug, pool.name, total, total, reason, _since(added),
                                         tuple(sorted(on_it))))
                continue
            affected = tuple(sorted(owner for owner, n in on_it.items() if pool.out and n > pool.allocatable))
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
            try:
                self._spawner = self._make()
            except TraitError as e:  # a setting refused: said in the hub's log at every reading
                raise RuntimeError(str(e)) from e
        s = self._spawner
        namespace = None if s.enable_user_namespaces else s.namespace
        try:
            nodes = await asyncio.wait_for(_json(s.api.list_node), s.k8s_api_request_timeout)
            pods = await list_server_pods(s.api, s.component_label, namespace, s.k8s_api_request_timeout)
        except Exception as e:  # any failure: health unknown this time
            raise RuntimeError(why_failed(e)) from e
        # 1,000 nodes and 8,000 pods: about 0.1 s, off the event loop
        return await asyncio.to_thread(node_health, nodes.get("items") or [], pods, s.component_label,
                                       tuple(s.kube_gpu_health_taints))


class KubeHealthMixin(Configurable):
    """A parent of :class:`~.spawner.GPUKubeSpawner`: the hub reads node health through it."""

    kube_gpu_health_taints = List(
        Unicode(),
        help="""Taint keys that take all of a node's GPUs out of service (any value and effect), for what
        the device plugin does not see or cannot say per device: an administrator's
        ``kubectl taint nodes gpu-7 example.com/gpu-unhealthy=XID79:NoSchedule``, or a health checker
        that taints nodes. The form counts such a node's GPUs out of service, ``/hub/gpus`` shows the
        taint (since its ``timeAdded``, which Kubernetes sets for ``NoExecute``; else since the hub
        first saw it), and every user whose pod holds GPUs there is told. Removing the taint brings
        them back. Empty (the default): only the device plugin's unhealthy devices count. Each a taint
        key (``[prefix/]name``); anything else is an error naming this setting when a server
        starts (and in the hub's log when it reads node health).""",
    ).tag(config=True)

    @validate("kube_gpu_health_taints")
    def _check_health_taints(self, proposal):
        for key in proposal["value"]:
            if not isinstance(key, str) or not _TAINT_KEY.fullmatch(key):
                raise TraitError(f"kube_gpu_health_taints: {key!r} is not a taint key ([prefix/]name, e.g. "
                                 "example.com/gpu-unhealthy)")
        return proposal["value"]

    @classmethod
    def cluster_health_reader(cls, config: Any) -> KubeHealthReader:
        """The reader of the cluster's GPU health (:mod:`gpuspawner.hub.health` calls it once per hub)."""
        return KubeHealthReader.of(cls, config)
