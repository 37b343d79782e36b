"""What one reading of a cluster's GPU health costs the hub, beside the API calls: working out every node's
health and whose workload is on a failed GPU, from nodes and pods (gpu-kube) or nodes and jobs (gpu-slurm)
as the cluster answers them. The hub does it every ``gpu_health_poll_interval`` seconds, in a worker thread.
Figures only; the tests assert behaviour.

    scripts/bench health_cluster [--nodes 100 1000] [--gpus 8]
"""

from __future__ import annotations

import argparse
import time

from gpuspawner.backends.kube.dev.kubelet import gpu_node
from gpuspawner.backends.kube.health import node_health as kube_health
from gpuspawner.backends.slurm.capacity import GresTypes, SlurmNode
from gpuspawner.backends.slurm.health import node_health as slurm_health
from gpuspawner.backends.slurm.queue import SlurmJob, job_comment


def kube_objects(nodes: int, gpus: int) -> tuple[list[dict], list[dict]]:
    """``nodes`` Ready nodes of ``gpus`` GPUs (one in 50 with one unhealthy), one 1-GPU server pod per GPU."""
    made = []
    for i in range(nodes):
        node = gpu_node(f"gpu-{i:04d}", gpus=gpus)
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        node["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus - (1 if i % 50 == 0 else 0))
        made.append(node)
    pods = [{"metadata": {"name": f"jupyter-u{n}", "namespace": "hub", "labels": {"component": "singleuser-server"},
                          "annotations": {"hub.jupyter.org/username": f"u{n}"}},
             "spec": {"nodeName": f"gpu-{n // gpus:04d}",
                      "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
             "status": {"phase": "Running"}} for n in range(nodes * gpus)]
    return made, pods


def slurm_objects(nodes: int, gpus: int) -> tuple[list[SlurmNode], list[SlurmJob]]:
    """``nodes`` nodes of ``gpus`` A100s (one in 50 drained), one 1-GPU job of this hub per GPU."""
    made = [SlurmNode(f"gpu-{i:04d}", ("gpu",), "mixed", ("DRAIN",) if i % 50 == 0 else (), {"a100": gpus}, {},
                      "XID 79" if i % 50 == 0 else "") for i in range(nodes)]
    jobs = [SlurmJob(str(n), "RUNNING", "None", "gpu", comment=job_comment("hub", f"u{n}", ""),
                     nodes=f"gpu-{n // gpus:04d}", gpus="gres:gpu:a100:1") for n in range(nodes * gpus)]
    return made, jobs


def best_of(work, *args, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    print("| backend | nodes | GPUs | workloads | one reading worked out (ms, best of 5) |")
    print("| --- | --- | --- | --- | --- |")
    for nodes in args.nodes:
        kube_nodes, pods = kube_objects(nodes, args.gpus)
        seconds = best_of(kube_health, kube_nodes, pods)
        print(f"| gpu-kube | {nodes} | {nodes * args.gpus} | {len(pods)} pods | {seconds * 1000:.1f} |")
        slurm_nodes, jobs = slurm_objects(nodes, args.gpus)
        seconds = best_of(slurm_health, slurm_nodes, jobs, GresTypes(), "hub")
        print(f"| gpu-slurm | {nodes} | {nodes * args.gpus} | {len(jobs)} jobs | {seconds * 1000:.1f} |")


if __name__ == "__main__":
    main()
