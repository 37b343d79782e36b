"""gpu-kube's wait estimates (gpuspawner.backends.kube.estimates): the cluster's pools as slots, held by
the hub's servers and jobs of a known model first, the rest by the cluster's other workloads."""

from __future__ import annotations

from gpuspawner.backends.kube.capacity import NodeGPUs, NodePool
from gpuspawner.backends.kube.estimates import cluster_slots
from gpuspawner.ledger import Ledger
from gpuspawner.queue import GPUQueue
from gpuspawner.waits import WaitHistory, queue_estimate

HOUR = 3600.0
A100 = "a100-sxm4-80gb"


def node(name: str, allocatable: int, used: int, schedulable: bool = True) -> NodeGPUs:
    pool = NodePool(A100, "gpu", "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu", "NVIDIA-A100-SXM4-80GB", allocatable, used)
    return NodeGPUs(name, schedulable, None, None, (pool,))


def test_the_hubs_holders_of_a_model_take_its_used_slots_first_and_others_hold_the_rest():
    ledger = Ledger()
    ledger.claim("ann/job/7", {"nvidia.com/gpu": 1})
    ledger.claim("bob/", {"nvidia.com/gpu": 2})
    ledger.claim("cy/", {"nvidia.com/gpu": 1})  # its model is not known: it holds no slot of its own
    nodes = (node("a", 2, 2), node("b", 4, 3), node("down", 8, 0, schedulable=False))
    slots, held = cluster_slots(nodes, {"ann/job/7": A100, "bob/": A100}, ledger.allocations())
    assert [(g.host, g.name) for g in slots] == [("a", A100)] * 2 + [("b", A100)] * 4
    assert {owner: len(uuids) for owner, uuids in held.items()} == {"ann/job/7": 1, "bob/": 2, "other:b": 2}
    assert held["ann/job/7"] == ("kube/a/a100-sxm4-80gb/0",)


def test_a_request_queued_on_a_full_cluster_is_estimated_from_a_hub_jobs_time_limit():
    now = 100 * HOUR  # 04:00 UTC
    ledger = Ledger(clock=lambda: now - HOUR)
    ledger.claim("ann/job/7", {"nvidia.com/gpu": 1})
    queue = GPUQueue()
    waiter = queue.join("cy/", "cy", 1, (A100,), "wait")
    waiter.joined = now
    slots, held = cluster_slots((node("a", 2, 2),), {"ann/job/7": A100}, ledger.allocations())
    est = queue_estimate(waiter, slots, queue, held, ledger.since, WaitHistory(list, lambda uuid: ""),
                         job_time_limit=2 * HOUR, queue_timeout=3 * HOUR, now=now)
    # the job reaches its limit at 05:00; the other workload on the node has no known end
    assert est.likely == now + HOUR
    assert est.sentence(now).startswith("About 05:00 UTC.")
    assert "1 of the 2 holders must give their GPUs back by a known time, the first by 05:00 UTC" in est.sentence(now)
