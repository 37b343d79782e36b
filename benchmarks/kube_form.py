"""How long the gpu-kube spawn form takes with 1,000 GPU nodes: ``scripts/bench kube_form``.

Prints figures only; it asserts nothing about timing. The cluster is made of
node and pod objects shaped like the recorded ones in tests/kube/fixtures:
1,000 GPU nodes (8 x A100 or H100, some A100s in MIG mixed strategy, T4s with
4-way time-slicing) and about 4 GPU pods per node plus finished pods.

Measured, each as median and p99 over repeated runs:

1. capacity: node and pod JSON -> per-node pools -> free/total per pool
   (:func:`cluster_inventory` + :func:`pools`), what each form render does
   after a cache miss;
2. render: form context + Jinja2 template from those pools;
3. form: both together (capacity computation + template render);
4. baseline in the same run: the local backend's form (form_context from
   8,000 GPU records + the same template), for a ratio;
5. the Kueue form: capacity, each profile's Kueue quota line from 100
   LocalQueues and 100 ClusterQueues (shaped like tests/kube/fixtures/kueue,
   3 GPU flavors each) and the template, as gpu-kube's form does after a
   cache miss (JSON already decoded; the API round trips are not timed).
"""

from __future__ import annotations

import copy
import gc
import json
import platform
import random
import statistics
import time
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from gpuspawner.backends.kube.capacity import cluster_inventory, pools
from gpuspawner.backends.kube.kueue import quota_lines
from gpuspawner.form import form_context
from gpuspawner.gpu import GPU
from gpuspawner.inventory import InventoryReading
from gpuspawner.profiles import load_profiles

ROOT = Path(__file__).resolve().parent.parent
NODES = 1000
CLUSTER_QUEUES = 100
RUNS = 60
FIXTURES = ROOT / "tests" / "kube" / "fixtures"
TEMPLATES = Environment(loader=PackageLoader("gpuspawner", "templates"), autoescape=select_autoescape(["html"]))
PROFILES = load_profiles([
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "Whole GPUs", "gpu_models": ["any"], "gpu_counts": [1, 2, 4, 8], "default": True},
    {"slug": "mig", "display_name": "MIG slice", "gpu_models": ["mig"], "gpu_counts": [1, 2]},
    {"slug": "shared", "display_name": "Shared GPU", "gpu_models": ["shared"], "gpu_counts": [1]},
])


def make_cluster(rng: random.Random) -> tuple[list[dict], list[dict]]:
    templates = json.loads((FIXTURES / "nodes.json").read_text())["items"]
    a100, _, mig, t4, _ = templates
    h100 = copy.deepcopy(a100)
    h100["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    pod_template = json.loads((FIXTURES / "pods.json").read_text())["items"][0]
    nodes, pods = [], []
    for i in range(NODES):
        base, resources = rng.choices(
            [(a100, ["nvidia.com/gpu"]), (h100, ["nvidia.com/gpu"]),
             (mig, ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]), (t4, ["nvidia.com/gpu.shared"])],
            weights=[45, 25, 10, 20])[0]
        node = copy.deepcopy(base)
        name = f"gpu-{i:04d}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        nodes.append(node)
        for j in range(rng.randint(0, 6)):
            pod = copy.deepcopy(pod_template)
            pod["metadata"]["name"] = f"jupyter-{i}-{j}"
            pod["spec"]["nodeName"] = name
            pod["status"]["phase"] = rng.choice(["Running"] * 8 + ["Succeeded", "Pending"])
            pod["spec"]["containers"][0]["resources"] = {"limits": {rng.choice(resources): "1"}}
            pods.append(pod)
    return nodes, pods


def make_queues(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """100 LocalQueues (one per ClusterQueue, in the hub's namespace) and their ClusterQueues."""
    local_template = json.loads((FIXTURES / "kueue" / "localqueue.json").read_text())
    cluster_template = json.loads((FIXTURES / "kueue" / "clusterqueue.json").read_text())
    local, cluster = [], []
    for i in range(CLUSTER_QUEUES):
        name = f"team-{i:03d}"
        lq = copy.deepcopy(local_template)
        lq["metadata"]["name"] = lq["spec"]["clusterQueue"] = name
        cq = copy.deepcopy(cluster_template)
        cq["metadata"]["name"] = name
        flavors = cq["spec"]["resourceGroups"][0]["flavors"]
        flavors.append(copy.deepcopy(flavors[0]))
        flavors[2]["name"] = "t4-shared"
        for f in flavors:
            f["resources"][2]["nominalQuota"] = str(rng.choice([4, 8, 16]))
        cq["status"]["flavorsReservation"] = [
            {"name": f["name"], "resources": [{"name": "nvidia.com/gpu", "total": str(rng.randint(0, 4))}]}
            for f in flavors]
        local.append(lq)
        cluster.append(cq)
    return local, cluster


def timed(fn, runs: int = RUNS) -> list[float]:
    fn()  # warm up
    times = []
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def summary(label: str, times: list[float]) -> float:
    times = sorted(times)
    median = statistics.median(times)
    p99 = times[min(len(times) - 1, int(round(0.99 * (len(times) - 1))))]
    print(f"  {label:<48} median {median:8.2f} ms   p99 {p99:8.2f} ms")
    return median


def main() -> None:
    rng = random.Random(20240610)
    nodes, pods = make_cluster(rng)
    print(f"gpu-kube form, {NODES} GPU nodes, {len(pods)} pods; "
          f"Python {platform.python_version()}, {platform.machine()}")

    def capacity():
        return pools(cluster_inventory(nodes, pods))

    found = capacity()

    def render(found=found):
        availability = [p.availability() for p in found]
        context = form_context(PROFILES, InventoryReading(), (), {}, availability=availability)
        return TEMPLATES.get_template("form.html").render(**context)

    def form():
        return render(capacity())

    gpus = tuple(GPU(f"gpu-{h:04d}", i, f"GPU-{h:04d}-{i}", "NVIDIA A100-SXM4-80GB" if h % 2 else "Tesla T4")
                 for h in range(NODES) for i in range(8))
    held = frozenset(g.uuid for g in gpus[::3])

    def baseline():
        context = form_context(PROFILES, InventoryReading(gpus), held, {})
        return TEMPLATES.get_template("form.html").render(**context)

    summary("capacity (nodes + pods -> free/total per pool)", timed(capacity))
    summary("render (form context + template)", timed(render))
    kube = summary("form: capacity + render", timed(form))
    base = summary("baseline: local form from 8,000 GPU records", timed(baseline))
    print(f"  ratio form / baseline: {kube / base:.2f}x")
    print("  pools: " + "; ".join(f"{p.slug} {p.free}/{p.total}" for p in found))

    local_queues, cluster_queues = make_queues(rng)
    kueue_profiles = [f"team-{i:03d}" for i in range(0, CLUSTER_QUEUES, CLUSTER_QUEUES // len(PROFILES))]

    def kueue_form():
        found = capacity()
        lines = quota_lines(local_queues, cluster_queues, kueue_profiles)
        context = form_context(PROFILES, InventoryReading(), (), {},
                               availability=[p.availability() for p in found])
        for p, queue in zip(context["profiles"], kueue_profiles, strict=True):
            p["kueue"] = lines[queue]
        return TEMPLATES.get_template("form.html").render(**context)

    print(f"Kueue form, {CLUSTER_QUEUES} ClusterQueues and LocalQueues, one queue per profile:")
    summary("quota lines (100 LocalQueues + 100 ClusterQueues)",
            timed(lambda: quota_lines(local_queues, cluster_queues, kueue_profiles)))
    summary("kueue form: capacity + quota lines + render", timed(kueue_form))
    assert "Kueue quota: team-000:" in kueue_form()  # the line is on the form (not a timing check)


if __name__ == "__main__":
    main()
