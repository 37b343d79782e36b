"""The real control plane (``kube_cluster``): the real scheduler, quota admission and node controller
with the recorded GPU nodes kept Ready by the fake kubelet. Objects are plain API objects here; how
gpu-kube's own pods fare is tested elsewhere."""

from __future__ import annotations

import json
import re

import pytest

from gpuspawner.backends.kube.dev.cluster import NODE_MONITOR_GRACE_SECONDS, APIError, gpu_node
from gpuspawner.backends.kube.events import EventContext, explain_scheduling
from kubefixtures import until

A100 = "NVIDIA-A100-SXM4-80GB"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pod(name: str, resources: dict[str, int], selector: dict[str, str] | None = None,
        affinity: list[dict] | None = None) -> dict:
    spec = {"containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook:2024-05-27",
                            "resources": {"limits": {r: str(n) for r, n in resources.items()}}}],
            "tolerations": [GPU_TOLERATION], "nodeSelector": selector or {}}
    if affinity:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": affinity}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def events(cluster, namespace: str, name: str, reason: str) -> list[dict]:
    found = cluster.api("GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{name}")
    return [e for e in found["items"] if e["reason"] == reason]


@pytest.mark.parametrize("resources, selector, affinity, node", [
    # 1 GPU on the A100 node whose driver runs CUDA 12.4 (the MIG node has that driver too, but no whole GPU)
    ({"nvidia.com/gpu": 1}, {"nvidia.com/gpu.product": A100},
     [{"key": "nvidia.com/cuda.driver.minor", "operator": "Gt", "values": ["3"]}], "gpu-a100-0"),
    # 2 GPUs on the other A100 node, by its driver's label
    ({"nvidia.com/gpu": 2}, {"nvidia.com/gpu.product": A100},
     [{"key": "nvidia.com/cuda.driver.minor", "operator": "In", "values": ["2"]}], "gpu-a100-1"),
    # a MIG slice and a time-sliced GPU: only one node offers each resource
    ({"nvidia.com/mig-1g.10gb": 1}, {}, None, "gpu-a100-mig-0"),
    ({"nvidia.com/gpu.shared": 1}, {"nvidia.com/gpu.product": "Tesla-T4"}, None, "gpu-t4-0"),
], ids=["1-gpu", "2-gpus", "mig", "shared"])
def test_the_scheduler_binds_gpu_pods_to_the_right_node(kube_cluster, kube_namespace, resources, selector,
                                                       affinity, node):
    base = f"/api/v1/namespaces/{kube_namespace}/pods"
    kube_cluster.api("POST", base, pod("gpu", resources, selector, affinity))
    running = until(lambda: (p := kube_cluster.api("GET", f"{base}/gpu"))["status"].get("phase") == "Running" and p,
                    "the pod is bound and marked Running")
    assert running["spec"]["nodeName"] == node
    assert running["status"]["podIP"]
    scheduled = until(lambda: events(kube_cluster, kube_namespace, "gpu", "Scheduled"), "the Scheduled event")
    assert f"Successfully assigned {kube_namespace}/gpu to {node}" in scheduled[0]["message"]
    kube_cluster.api("DELETE", f"{base}/gpu")  # graceful: the fake kubelet finishes it
    until(lambda: kube_cluster.api("GET", f"{base}/gpu", ok=(404,)) is None, "the deletion is finished")


def test_a_pod_too_big_for_any_node_waits_with_the_schedulers_words(kube_cluster, kube_namespace):
    base = f"/api/v1/namespaces/{kube_namespace}/pods"
    kube_cluster.api("POST", base, pod("too-big", {"nvidia.com/gpu": 9}, {"nvidia.com/gpu.product": A100}))
    failed = until(lambda: events(kube_cluster, kube_namespace, "too-big", "FailedScheduling"),
                   "the scheduler's FailedScheduling event")
    message = failed[0]["message"]
    assert re.match(r"0/\d+ nodes are available: .*\d+ Insufficient nvidia\.com/gpu", message), message
    # the current wording of a selector mismatch (v1.20 said "didn't match Pod's node affinity.")
    assert "node(s) didn't match Pod's node affinity/selector" in message, message
    held = kube_cluster.api("GET", f"{base}/too-big")
    assert held["status"]["phase"] == "Pending" and "nodeName" not in held["spec"]
    assert "too few free right now" in explain_scheduling(message, EventContext(A100, 9))


def test_a_resource_quota_refuses_with_its_own_sentence(kube_cluster, kube_namespace):
    quotas = f"/api/v1/namespaces/{kube_namespace}/resourcequotas"
    kube_cluster.api("POST", quotas, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-quota"},
                                      "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}})
    # admission refuses every pod until the quota controller has filled in the quota's status
    until(lambda: kube_cluster.api("GET", f"{quotas}/gpu-quota").get("status", {}).get("hard"),
          "the quota controller fills in the quota's status")
    base = f"/api/v1/namespaces/{kube_namespace}/pods"
    kube_cluster.api("POST", base, pod("first", {"nvidia.com/gpu": 1}))
    with pytest.raises(APIError) as refused:
        kube_cluster.api("POST", base, pod("over-quota", {"nvidia.com/gpu": 2}))
    assert refused.value.status == 403
    assert refused.value.message == (
        'pods "over-quota" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=2, '
        "used: requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=2")


def test_nodes_stay_ready_while_a_silent_node_goes_unknown(kube_cluster):
    """The node controller is at work (a node whose heartbeat stops turns Unknown after the grace period),
    and the nodes the fake kubelet beats for stay Ready through it."""
    kube_cluster.kubelet.add_node(gpu_node("silent-0", "NVIDIA-L4", 1))
    kube_cluster.kubelet.stop_heartbeat("silent-0")
    try:
        def ready(name: str) -> dict:
            node = kube_cluster.api("GET", f"/api/v1/nodes/{name}")
            return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")

        gone = until(lambda: (c := ready("silent-0"))["status"] != "True" and c,
                     "the node controller marks the silent node", timeout=NODE_MONITOR_GRACE_SECONDS * 4)
        assert gone["status"] == "Unknown" and gone["reason"] == "NodeStatusUnknown", gone
        for name in ("gpu-a100-0", "gpu-a100-1", "gpu-a100-mig-0", "gpu-t4-0", "cpu-0"):
            assert ready(name)["status"] == "True", name
            taints = kube_cluster.api("GET", f"/api/v1/nodes/{name}")["spec"].get("taints", [])
            assert not [t for t in taints if t["key"].startswith("node.kubernetes.io/")], (name, taints)
    finally:
        kube_cluster.kubelet.remove_node("silent-0")


def test_a_service_account_gets_only_what_its_rbac_grants(kube_cluster, kube_namespace):
    """RBAC is on: the token files and kubeconfig ``service_account`` writes (as a hub in a pod would
    read them) are refused the nodes until a ClusterRoleBinding grants them."""
    import kubernetes

    kube_cluster.api("POST", f"/api/v1/namespaces/{kube_namespace}/serviceaccounts",
                     {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hub"}})
    folder = kube_cluster.service_account(kube_namespace, "hub")
    assert (folder / "namespace").read_text() == kube_namespace and (folder / "token").read_text()
    api = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(str(folder / "kubeconfig")))
    with pytest.raises(kubernetes.client.ApiException) as refused:
        api.list_node()
    assert refused.value.status == 403
    assert json.loads(refused.value.body)["message"] == (
        f'nodes is forbidden: User "system:serviceaccount:{kube_namespace}:hub" cannot list resource "nodes" '
        'in API group "" at the cluster scope')
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    name = f"read-nodes-{kube_namespace}"
    kube_cluster.api("POST", f"{rbac}/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]})
    kube_cluster.api("POST", f"{rbac}/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": kube_namespace}]})
    try:
        def nodes():
            try:
                return api.list_node().items
            except kubernetes.client.ApiException as error:
                if error.status != 403:
                    raise
                return None

        assert "gpu-a100-0" in {node.metadata.name for node in until(nodes, "the binding takes effect")}
        with pytest.raises(kubernetes.client.ApiException) as still:
            api.list_pod_for_all_namespaces()
        assert still.value.status == 403
    finally:
        kube_cluster.api("DELETE", f"{rbac}/clusterrolebindings/{name}", ok=(404,))
        kube_cluster.api("DELETE", f"{rbac}/clusterroles/{name}", ok=(404,))


def test_a_pod_runner_starts_what_must_serve_and_stops_it_on_deletion(kube_cluster, kube_namespace):
    """The hook for pods that really serve: the runner is asked to start each bound pod once, its address
    becomes the pod's IP, and it is asked to stop the pod before the deletion is finished."""
    from gpuspawner.backends.kube.dev.cluster import PodRunner

    class Runner(PodRunner):
        def __init__(self) -> None:
            self.started: list[str] = []
            self.stopped: list[str] = []

        def start(self, pod: dict) -> str | None:  # (pods other tests left may come by too)
            self.started.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
            return "127.0.0.1"

        def stop(self, pod: dict) -> None:
            self.stopped.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")

    runner = Runner()
    mine = f"{kube_namespace}/serving"
    kubelet = kube_cluster.kubelet
    default, kubelet.runner = kubelet.runner, runner
    try:
        base = f"/api/v1/namespaces/{kube_namespace}/pods"
        kube_cluster.api("POST", base, pod("serving", {"nvidia.com/gpu": 1}))
        running = until(lambda: (p := kube_cluster.api("GET", f"{base}/serving"))["status"].get("phase") == "Running"
                        and p, "the pod is bound and marked Running")
        assert running["status"]["podIP"] == "127.0.0.1" and runner.started.count(mine) == 1
        kube_cluster.api("DELETE", f"{base}/serving")
        until(lambda: kube_cluster.api("GET", f"{base}/serving", ok=(404,)) is None, "the deletion is finished")
        assert runner.stopped.count(mine) == 1 and runner.started.count(mine) == 1
    finally:
        kubelet.runner = default
