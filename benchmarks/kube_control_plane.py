"""What the private Kubernetes control plane costs: ``scripts/bench kube_control_plane``.

Prints figures only (asserts nothing about timing):

1. the build (gpuspawner/backends/kube/dev/cluster.py ``build``): with ``--cold``, into an empty cache folder
   of its own (Go's own build cache is kept unless ``--cold-go``, which uses an empty GOCACHE too:
   the cost on a fresh machine); else the cached case, which only checks the binaries are there;
2. start-to-ready, over ``--rounds`` starts in fresh folders: certificates, etcd, kube-apiserver
   (``/readyz``), kube-scheduler and kube-controller-manager (``/healthz``), the ``default``
   ServiceAccount made; each step's figure too;
3. the real scheduler binding a 1-GPU pod to a fake node and the fake kubelet marking it Running
   (create to Running), median over ``--pods`` pods;
4. the resident memory of the four processes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpuspawner.backends.kube.dev import cluster as devcluster

ROOT = Path(__file__).resolve().parent.parent


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cold", action="store_true", help="build into an empty cache folder")
    parser.add_argument("--cold-go", action="store_true", help="with --cold: an empty Go build cache too")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pods", type=int, default=5)
    args = parser.parse_args()
    print(f"Kubernetes {devcluster.kube_version()}, {os.cpu_count()} cores, {platform.platform()}")
    with tempfile.TemporaryDirectory() as scratch:
        if args.cold:
            os.environ["GPUSPAWNER_KUBE_CACHE"] = str(Path(scratch) / "cache")
            if args.cold_go:
                os.environ["GOCACHE"] = str(Path(scratch) / "gocache")
        started = time.monotonic()
        devcluster.build(log=lambda line: print("  " + line))
        print(f"build ({'cold' if args.cold else 'cached'}{', empty Go cache' if args.cold_go else ''}): "
              f"{time.monotonic() - started:.1f}s")
        for round_ in range(args.rounds):
            cluster = devcluster.KubeCluster(Path(scratch) / f"c{round_}")
            try:
                cluster.start(nodes=[devcluster.gpu_node("gpu-0", gpus=8)])
                steps = ", ".join(f"{k} {v:.2f}s" for k, v in cluster.timings.items() if k != "control plane ready")
                print(f"start-to-ready: {cluster.timings['control plane ready']:.2f}s ({steps})")
                if round_ == 0:
                    figures = []
                    for n in range(args.pods):
                        base = "/api/v1/namespaces/default/pods"
                        t0 = time.monotonic()
                        cluster.api("POST", base, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{n}"},
                                                   "spec": {"containers": [{"name": "c", "image": "x", "resources": {
                                                       "limits": {"nvidia.com/gpu": "1"}}}]}})
                        while cluster.api("GET", f"{base}/p{n}")["status"].get("phase") != "Running":
                            time.sleep(0.01)
                        figures.append(time.monotonic() - t0)
                    print(f"create-to-Running of a 1-GPU pod: median {statistics.median(figures):.2f}s "
                          f"(each: {', '.join(f'{f:.2f}' for f in figures)})")
                    memory = {name: rss_mib(pid) for name, pid in cluster.pids().items()}
                    print("resident memory: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in memory.items())
                          + f" (total {sum(memory.values()):.0f} MiB)")
            finally:
                cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
