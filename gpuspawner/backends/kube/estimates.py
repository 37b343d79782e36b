"""Wait estimates for gpu-kube's ``queue: true`` profiles (the hub's own queue, no Kueue).

The estimator (:func:`gpuspawner.waits.queue_estimate`) works on GPUs and their holders. Here the
device plugin owns the GPUs, so :func:`cluster_slots` makes one slot per allocatable unit of each
pool on each schedulable node (host: the node, model: the pool's slug), the free ones free, the used
ones held: first by the hub's servers and jobs of that model (the ledger's cluster tokens,
:class:`~.holdings.PoolHolders`; each since its claim, a job until its time limit), the rest by
``other:<node>``, the cluster's other workloads, of which the hub knows nothing but that they hold
(each counts as just started and ends as the hub's own sessions do). Which node a hub pod runs on
is not read: its slots are taken from the nodes in order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ...gpu import GPU
from ...queue import Known, Waiter
from ...waits import queue_estimate, wait_history
from .capacity import NodeGPUs, queue_known
from .holdings import PoolHolders

__all__ = ["KubeEstimatesMixin", "cluster_slots"]

_log = logging.getLogger("gpuspawner.waits")


def cluster_slots(nodes: Sequence[NodeGPUs], models: Mapping[str, str], allocations: Mapping[str, tuple[str, ...]],
                  ) -> tuple[tuple[GPU, ...], dict[str, tuple[str, ...]]]:
    """(slots, holder -> its slots' ids) of the cluster's GPU pools: ``models`` is ledger owner -> pool
    slug (:class:`~.holdings.PoolHolders`), ``allocations`` the ledger's owner -> cluster tokens."""
    waiting: dict[str, list[list]] = {}  # slug -> [[owner, GPUs not yet given a slot]]
    for owner, tokens in sorted(allocations.items()):
        if models.get(owner):
            waiting.setdefault(models[owner], []).append([owner, len(tokens)])
    slots: list[GPU] = []
    held: dict[str, list[str]] = {}
    for node in nodes:
        if not node.schedulable:
            continue
        for pool in node.pools:
            used = pool.allocatable - node.free(pool)
            for i in range(pool.allocatable):
                slot = GPU(host=node.name, index=len(slots), uuid=f"kube/{node.name}/{pool.slug}/{i}", name=pool.slug)
                slots.append(slot)
                if i >= used:
                    continue
                mine = waiting.get(pool.slug)
                owner = mine[0][0] if mine else f"other:{node.name}"
                if mine:
                    mine[0][1] -= 1
                    if not mine[0][1]:
                        mine.pop(0)
                held.setdefault(owner, []).append(slot.uuid)
    return tuple(slots), {owner: tuple(uuids) for owner, uuids in held.items()}


class KubeEstimatesMixin:
    """What gpu-kube's queue tells a waiting request, with its wait estimate (a mixin of the spawner)."""

    def kube_queue_known(self, waiter: Waiter, nodes: Sequence[NodeGPUs]) -> Known:
        """The pools' GPUs in service and in use (:func:`~.capacity.queue_known`), and the estimate."""
        known = queue_known(nodes, waiter.models)
        state = self.hub_state
        try:
            slots, held = cluster_slots(nodes, state.cache(PoolHolders), self.ledger.allocations())
            estimate = queue_estimate(waiter, slots, state.queue, held, self.ledger.since, wait_history(state),
                                      job_time_limit=self.gpu_job_time_limit, queue_timeout=self.gpu_queue_timeout,
                                      quota=self.gpu_quota_per_user, idle_timeout=self.gpu_culler_idle_timeout)
        except Exception:  # an estimate must never break a wait: the queue's own words then
            _log.exception("wait estimate for %s failed", waiter.owner)
            return known
        return replace(known, estimate=estimate)
