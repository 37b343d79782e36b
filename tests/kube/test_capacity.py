"""Inventory, capacity and refusals of gpu-kube against recorded cluster objects.

The recorded cluster (tests/kube/fixtures): two 8 x A100-80GB nodes (drivers
for CUDA 12.4 and 12.2), one A100 node in MIG mixed strategy (all-balanced),
one T4 node with time-slicing (4 replicas, renamed to nvidia.com/gpu.shared)
and a CPU node, with pods using some of them (running, finished, failed,
pending). Through the API: the real control plane's standing fake nodes (the recorded ones), the
recorded pods made again in the test's namespace (``cluster``), read by the real kubernetes_asyncio
client as the hub's ServiceAccount with the Helm chart's RBAC. The inventory's arithmetic and its
sentences are also tested pure, on the recorded objects.
"""

from __future__ import annotations

import os
import re

import pytest
from kubernetes_asyncio import client
from tornado.web import HTTPError

from gpuspawner.backends.kube.api import ClusterCapacity
from gpuspawner.backends.kube.capacity import CapacityError, cluster_inventory, place, pod_requests, pools
from kubefixtures import HUB_CLUSTER_RULES, HUB_RULES, nodes_added, without
from profiles import A100, MIG_1G, PROFILES, SHARED_T4, TORCH

H100 = "NVIDIA-H100-80GB-HBM3"


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


@pytest.fixture
async def api(cluster):
    """The Kubernetes API as the hub's ServiceAccount (its kubeconfig: ``KUBECONFIG``)."""
    from kubernetes_asyncio import config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client)


def hub_cannot_list_nodes(cluster, monkeypatch) -> None:
    cluster.hub(monkeypatch, HUB_RULES, without(HUB_CLUSTER_RULES, "nodes", "list"))


async def test_inventory_from_the_api(api):
    reading = await ClusterCapacity(api).read()
    assert reading.unknown is None
    assert [n.name for n in reading.nodes] == ["gpu-a100-0", "gpu-a100-1", "gpu-a100-mig-0", "gpu-t4-0"]
    by_slug = {p.slug: p for p in pools(reading.nodes)}
    # A100: node 0 has 8 - 4 (alice) - 3 (training) = 1 free; node 1 has 8 - 6 (bob, two containers) = 2 free;
    # the finished and failed pods hold nothing, the unscheduled one holds nothing yet.
    a100 = by_slug[A100]
    assert (a100.free, a100.total, a100.largest, a100.max_per_node, a100.nodes) == (3, 16, 2, 8, 2)
    assert a100.kind == "gpu" and a100.resource == "nvidia.com/gpu"
    mig = by_slug[MIG_1G]
    assert (mig.kind, mig.resource, mig.free, mig.total) == ("mig", "nvidia.com/mig-1g.10gb", 14, 16)
    # init container asks for 2, app container 1: the pod holds 2
    assert (by_slug["mig-3g-40gb-a100-sxm4-80gb"].free, by_slug["mig-3g-40gb-a100-sxm4-80gb"].total) == (6, 8)
    shared = by_slug[SHARED_T4]
    # dave, erin and frank (bound, pulling its image) hold one replica each
    assert (shared.kind, shared.resource, shared.free, shared.total, shared.note) == (
        "shared", "nvidia.com/gpu.shared", 13, 16, "shared, no memory isolation")
    assert "cpu-0" not in {n.name for n in reading.nodes}


async def test_reading_is_cached_briefly(cluster, api):
    """Within its ttl a reading is not taken again: a pod bound since is seen only by a fresh reading."""
    capacity = ClusterCapacity(api, ttl=60)
    assert {p.slug: p.free for p in pools((await capacity.read()).nodes)}[A100] == 3
    cluster.api("POST", f"/api/v1/namespaces/{cluster.namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "training"}, "spec": {
            "nodeName": "gpu-a100-1", "containers": [{"name": "train", "image": "ghcr.io/example/torch:2.3",
                                                      "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
    assert {p.slug: p.free for p in pools((await capacity.read()).nodes)}[A100] == 3
    assert {p.slug: p.free for p in pools((await ClusterCapacity(api, ttl=0).read()).nodes)}[A100] == 1


async def test_api_failure_means_availability_unknown(cluster, monkeypatch, api):
    hub_cannot_list_nodes(cluster, monkeypatch)  # the API server refuses the hub's read of the nodes
    reading = await ClusterCapacity(api).read()
    assert reading.nodes == ()
    assert reading.unknown == "Kubernetes API answered 403 Forbidden"


async def test_unreachable_api_means_availability_unknown():
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:9")) as api_client:
        reading = await ClusterCapacity(client.CoreV1Api(api_client), timeout=5).read()
    assert reading.nodes == () and "unreachable" in reading.unknown


def test_refusals_say_why(node_items, pod_items):
    nodes = cluster_inventory(node_items, pod_items)
    with pytest.raises(CapacityError) as now:
        place(nodes, [A100], 4)
    assert not now.value.never
    assert str(now.value) == (
        "No NVIDIA-A100-SXM4-80GB is free right now: 3 of 16 free, at most 2 on one node, and you asked for 4. "
        "MIG 1g.10gb slice of NVIDIA-A100-SXM4-80GB has 14 free. "
        "MIG 2g.20gb slice of NVIDIA-A100-SXM4-80GB has 8 free. "
        "MIG 3g.40gb slice of NVIDIA-A100-SXM4-80GB has 6 free. Pick another model or try again later.")
    with pytest.raises(CapacityError) as never:
        place(nodes, [A100], 16)
    assert never.value.never
    assert "No node has 16 x NVIDIA-A100-SXM4-80GB: at most 8 on one node." in str(never.value)
    with pytest.raises(CapacityError) as missing:
        place(nodes, ["h100"], 1)
    assert missing.value.never
    assert str(missing.value).startswith(
        "No node in this cluster has a H100. GPU models here: NVIDIA-A100-SXM4-80GB (up to 8 per node), ")
    assert "Tesla-T4 (shared, no memory isolation) (up to 16 per node)" in str(missing.value)
    with pytest.raises(CapacityError) as cuda:
        place(nodes, [A100], 1, cuda=(12, 6))
    assert cuda.value.never and "driver new enough for CUDA 12.6" in str(cuda.value)
    assert "supports CUDA 12.4" in str(cuda.value)
    # with CUDA 12.4 only gpu-a100-0 counts: 1 free there
    assert place(nodes, [A100], 1, cuda=(12, 4)).products == ("NVIDIA-A100-SXM4-80GB",)
    with pytest.raises(CapacityError) as busy:
        place(nodes, [A100], 2, cuda=(12, 4))
    assert not busy.value.never and "1 of 8 free" in str(busy.value)


def test_single_strategy_mig_and_unrenamed_time_slicing(node_items):
    a100 = node_items[0]
    single = {**a100, "metadata": {**a100["metadata"], "name": "mig-single", "labels": {
        **a100["metadata"]["labels"], "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/mig.strategy": "single"}}, "status": {**a100["status"], "allocatable": {"nvidia.com/gpu": "56"}}}
    t4 = {**a100, "metadata": {**a100["metadata"], "name": "t4-shared", "labels": {
        **a100["metadata"]["labels"], "nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4"}},
        "status": {**a100["status"], "allocatable": {"nvidia.com/gpu": "16"}}}
    found = {p.slug: p for p in pools(cluster_inventory([single, t4], []))}
    assert found["mig-1g-5gb-a100-sxm4-40gb"].resource == "nvidia.com/gpu"
    assert found["mig-1g-5gb-a100-sxm4-40gb"].products == ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",)
    assert (found["shared-t4"].kind, found["shared-t4"].products) == ("shared", ("Tesla-T4-SHARED",))


def test_nodes_without_the_product_label_are_asked_for_by_resource_only(node_items):
    """GKE's and other clusters without GPU Feature Discovery: no nvidia.com/gpu.product label to select on."""
    gke = {**node_items[0], "metadata": {"name": "gke-t4", "labels": {"cloud.google.com/gke-accelerator":
                                                                      "nvidia-tesla-t4"}}}
    assert place(cluster_inventory([gke], []), (), 1).products == ()  # any node with nvidia.com/gpu
    mixed = cluster_inventory([gke, *node_items], [])
    assert place(mixed, (), 1).products == ()
    assert place(mixed, [A100], 1).products == ("NVIDIA-A100-SXM4-80GB",)  # a model picked: its labelled nodes


def test_cordoned_and_not_ready_nodes_are_unavailable_not_free(node_items):
    """Their GPUs leave the total and are said apart, as unhealthy GPUs are on the other backends."""
    node_items[0]["spec"]["unschedulable"] = True
    a100 = {p.slug: p for p in pools(cluster_inventory(node_items, []))}[A100]
    assert (a100.free, a100.total, a100.unavailable, a100.max_per_node) == (8, 8, 8, 8)
    assert a100.availability().label == "NVIDIA-A100-SXM4-80GB - 8 of 8 free, 8 more unavailable"

    node_items[1]["status"]["conditions"][-1]["status"] = "False"
    nodes = cluster_inventory(node_items, [])
    a100 = {p.slug: p for p in pools(nodes)}[A100]
    assert (a100.free, a100.total, a100.unavailable) == (0, 0, 16)
    assert a100.availability().label == "NVIDIA-A100-SXM4-80GB - none usable: 16 of 16 unavailable"
    with pytest.raises(CapacityError) as down:
        place(nodes, [A100], 1)
    assert not down.value.never
    assert str(down.value).startswith(
        "No NVIDIA-A100-SXM4-80GB is usable right now: 16 of 16 are unavailable "
        "(node not ready or cordoned, or GPU unhealthy).")


def test_pod_requests_effective_value():
    two = {"nvidia.com/gpu": "2"}
    pod = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}},
                                   {"resources": {"requests": two, "limits": two}}],
                    "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    assert pod_requests(pod) == {"nvidia.com/gpu": 4}


# ------------------------------------------------------------ through the spawner


async def test_spawn_refused_now_with_409_and_no_pod(cluster, make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES)
    spawner.user_options = {"profile": "gpu", "gpus": 4, "gpu_model": A100}
    await spawner._run_apply_user_options(spawner.user_options)
    with pytest.raises(HTTPError) as e:
        await spawner.start()
    assert e.value.status_code == 409
    assert e.value.jupyterhub_message.startswith("No NVIDIA-A100-SXM4-80GB is free right now: 3 of 16 free")
    assert cluster.made_pods() == [] and cluster.made_claims() == []  # no pod, no PVC, nothing created


async def test_spawn_refused_never_names_the_models(cluster, make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES)
    spawner.user_options = {"profile": "hopper", "gpus": 1}
    await spawner._run_apply_user_options(spawner.user_options)
    with pytest.raises(HTTPError) as e:
        await spawner.start()
    assert e.value.status_code == 409
    assert e.value.jupyterhub_message.startswith(
        "No node in this cluster has a H100. GPU models here: NVIDIA-A100-SXM4-80GB")
    assert cluster.made_pods() == [] and cluster.made_claims() == []


async def test_spawn_refused_for_cuda(cluster, make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES, image_cuda={TORCH: "12.6"})
    spawner.user_options = {"profile": "gpu", "gpus": 1, "gpu_model": A100, "image": TORCH}
    await spawner._run_apply_user_options(spawner.user_options)
    with pytest.raises(HTTPError) as e:
        await spawner.start()
    assert "driver new enough for CUDA 12.6" in e.value.jupyterhub_message


async def test_form_shows_models_mig_and_shared_pools(make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES)
    html = await spawner._render_options_form()
    words = text(html)
    assert "NVIDIA-A100-SXM4-80GB - 3 of 16 free" in words
    assert "MIG 1g.10gb slice of NVIDIA-A100-SXM4-80GB - 14 of 16 free" in words
    assert "Tesla-T4 (shared, no memory isolation) - 13 of 16 free" in words
    assert "availability unknown" not in words
    # 4 A100s are not free on one node now: the count is offered but disabled
    assert re.search(r'<option value="4"\s+disabled>4 GPUs \(not free now\)', html)
    # 16 never fit: no node has more than 8
    assert re.search(r'<option value="16"\s+disabled>16 GPUs \(never fits here: needs 16 GPUs on one node; '
                     r'the largest here has 8\)', html)


async def test_form_still_works_when_the_api_fails(cluster, monkeypatch, make_spawner):
    hub_cannot_list_nodes(cluster, monkeypatch)
    spawner = make_spawner(gpu_profiles=PROFILES)
    html = await spawner._render_options_form()
    assert "GPU availability unknown right now (Kubernetes API answered 403 Forbidden)" in text(html)
    assert " disabled>" not in html  # nothing disabled: the scheduler decides
    # and a spawn goes ahead without a capacity check, asking for whole GPUs of any model
    spawner.user_options = {"profile": "gpu", "gpus": 2}
    await spawner._run_apply_user_options(spawner.user_options)
    await spawner.reserve_gpus()
    assert spawner.extra_resource_limits == {"nvidia.com/gpu": "2"}
    assert "nvidia.com/gpu.product" not in spawner.node_selector
    assert any("availability unknown" in e["message"] for e in spawner._gpu_events)


@pytest.fixture
def h100_nodes(cluster):
    """Two H100 nodes added for this test: one cordoned by an admin, one whose kubelet reports NotReady;
    removed afterwards (the standing nodes are left as they are)."""
    from gpuspawner.backends.kube.dev.cluster import gpu_node

    names = ("gpu-h100-cordoned", "gpu-h100-down")
    with (nodes_added(cluster.kube, gpu_node(names[0], H100, 8, cuda=(12, 4))),
          nodes_added(cluster.kube, gpu_node(names[1], H100, 8, cuda=(12, 4)), heartbeat=False)):
        cluster.api("PATCH", f"/api/v1/nodes/{names[0]}", {"spec": {"unschedulable": True}},  # kubectl cordon
                    content_type="application/merge-patch+json")
        node = cluster.api("GET", f"/api/v1/nodes/{names[1]}")
        for condition in node["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition.update(status="False", reason="KubeletNotReady", message="container runtime is down")
        cluster.api("PATCH", f"/api/v1/nodes/{names[1]}/status",
                    {"status": {"conditions": node["status"]["conditions"]}},
                    content_type="application/strategic-merge-patch+json")
        yield names


async def test_cordoned_and_not_ready_nodes_of_the_cluster_are_unavailable(h100_nodes, make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES)
    words = text(await spawner._render_options_form())
    assert f"{H100} - none usable: 16 of 16 unavailable" in words
    assert "NVIDIA-A100-SXM4-80GB - 3 of 16 free" in words  # the standing nodes as they are
    spawner.user_options = {"profile": "gpu", "gpus": 1, "gpu_model": "h100-80gb-hbm3"}
    await spawner._run_apply_user_options(spawner.user_options)
    with pytest.raises(HTTPError) as e:
        await spawner.reserve_gpus()
    assert e.value.status_code == 409
    assert e.value.jupyterhub_message.startswith(
        f"No {H100} is usable right now: 16 of 16 are unavailable (node not ready or cordoned, or GPU unhealthy).")
