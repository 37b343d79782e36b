"""Constants the gpu-kube tests share (a module of its own: every test folder has a conftest)."""

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import yaml

FIXTURES = Path(__file__).resolve().parent / "fixtures"

#: the hub's Role in its namespace, as the Helm chart grants it: only the verbs KubeSpawner and gpu-kube use
HUB_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
             {"apiGroups": [""], "resources": ["persistentvolumeclaims", "services", "secrets"],
              "verbs": ["get", "create", "delete"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch"]}]
#: cluster-wide, list only: GPU capacity
HUB_CLUSTER_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
                     {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
KUEUE_RULES = [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"], "verbs": ["list"]},
               {"apiGroups": ["visibility.kueue.x-k8s.io"], "resources": ["localqueues/pendingworkloads"],
                "verbs": ["get"]}]
KUEUE_CLUSTER_RULE = {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["list"]}


@contextlib.contextmanager
def namespace_of_its_own(kube_cluster):
    """A new namespace in ``kube_cluster`` (its ``default`` ServiceAccount made, so pods are accepted), deleted
    afterwards with all it holds: its pods at once (waited for), a hub's cluster-wide rights
    (:func:`hub_account`); the namespace itself goes in the background. Its name."""
    name = f"t-{os.urandom(4).hex()}"
    kube_cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": name}})
    until(lambda: kube_cluster.api("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default", ok=(404,)),
          f"the ServiceAccount controller makes {name}/default")
    try:
        yield name
    finally:
        kube_cluster.api("DELETE", f"/api/v1/namespaces/{name}", ok=(404,))  # no pod is made there any more
        for kind in ("clusterrolebindings", "clusterroles"):
            kube_cluster.api("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{name}-hub", ok=(404,))
        # its pods gone before the next test reads the shared cluster's capacity: at once (the fake nodes' pods
        # hold nothing to stop), not after the namespace controller's next pass
        pods = f"/api/v1/namespaces/{name}/pods"
        kube_cluster.api("DELETE", pods, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                         ok=(404,))
        until(lambda: not (kube_cluster.api("GET", pods, ok=(404,)) or {"items": []})["items"],
              f"the pods of {name} go")


def apply(cluster, obj: dict) -> dict:
    """Create or update ``obj`` in the real ``cluster`` as its admin (server-side apply)."""
    from gpuspawner.backends.kube.dev.kueue import object_path

    return cluster.api("PATCH", f"{object_path(obj)}?fieldManager=test&force=true", obj,
                       content_type="application/apply-patch+yaml")


def without(rules: list[dict], resource: str, verb: str) -> list[dict]:
    """``rules`` less ``verb`` on ``resource`` (a hub whose RBAC was narrowed)."""
    narrowed = [{**r, "verbs": [v for v in r["verbs"] if v != verb]} if resource in r["resources"] else r
                for r in rules]
    return [r for r in narrowed if r["verbs"]]


def _grants(rules: list[dict], resource: str, verb: str) -> bool:
    return any(resource in r["resources"] and verb in r["verbs"] and "" in r["apiGroups"] for r in rules)


#: the rights a test may take from a hub, checked after its RBAC changes (the authorizer's cache lags)
_CHECKED = (("pods", "create", True), ("pods", "list", True), ("pods", "list", False), ("nodes", "list", False))


def _rbac_in_force(cluster, namespace: str, rules: list[dict], cluster_rules: list[dict]) -> bool:
    user = f"system:serviceaccount:{namespace}:hub"
    for resource, verb, namespaced in _CHECKED:
        wanted = _grants(cluster_rules, resource, verb) or (namespaced and _grants(rules, resource, verb))
        review = cluster.api("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
                "user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                "resourceAttributes": {"verb": verb, "resource": resource,
                                       **({"namespace": namespace} if namespaced else {})}}})
        if review["status"].get("allowed", False) != wanted:
            return False
    return True


def hub_account(cluster, namespace: str, rules: list[dict] = HUB_RULES,
                cluster_rules: list[dict] = HUB_CLUSTER_RULES) -> str:
    """A hub in ``namespace`` as its ServiceAccount ``hub`` with the Helm chart's RBAC (not admin): the Role
    ``rules`` there, the ClusterRole ``cluster_rules`` (named ``<namespace>-hub``, deleted with the
    namespace by ``kube_namespace``); the path of its kubeconfig."""
    subjects = [{"kind": "ServiceAccount", "name": "hub", "namespace": namespace}]
    rbac = "rbac.authorization.k8s.io"
    apply(cluster, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hub", "namespace": namespace}})
    for kind, meta, role_rules in (("Role", {"name": "hub", "namespace": namespace}, rules),
                                   ("ClusterRole", {"name": f"{namespace}-hub"}, cluster_rules)):
        apply(cluster, {"apiVersion": f"{rbac}/v1", "kind": kind, "metadata": meta, "rules": role_rules})
        apply(cluster, {"apiVersion": f"{rbac}/v1", "kind": f"{kind}Binding", "metadata": meta, "subjects": subjects,
                        "roleRef": {"apiGroup": rbac, "kind": kind, "name": meta["name"]}})
    until(lambda: _rbac_in_force(cluster, namespace, rules, cluster_rules), f"the hub's RBAC in {namespace} in force")
    return str(cluster.service_account(namespace, "hub") / "kubeconfig")


def as_hub(monkeypatch, kubeconfig: str) -> None:
    """``KUBECONFIG`` (and kubernetes_asyncio's and KubeSpawner's cached client configuration) set to
    ``kubeconfig``, as for a hub started with it."""
    from kubespawner.clients import load_config

    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    monkeypatch.setattr("kubernetes_asyncio.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
    load_config.cache_clear()


#: what a recorded pod keeps when it is made again in a real cluster (no owners the garbage collector
#: would miss, no ServiceAccount or volumes of the cluster it was recorded in)
_POD_SPEC_KEPT = ("nodeName", "nodeSelector", "tolerations", "affinity")
_CONTAINER_KEPT = ("name", "image", "resources", "env")


def recorded_pod(pod: dict, namespace: str) -> dict:
    """A recorded pod (tests/kube/fixtures/pods.json) as a new pod of ``namespace``: its name, labels,
    annotations, containers' resources and node (bound there directly, as the scheduler left it)."""
    meta = pod["metadata"]
    spec = {key: value for key, value in pod["spec"].items() if key in _POD_SPEC_KEPT}
    for kind in ("containers", "initContainers"):
        if pod["spec"].get(kind):
            spec[kind] = [{k: v for k, v in c.items() if k in _CONTAINER_KEPT} for c in pod["spec"][kind]]
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": meta["name"], "namespace": namespace, "labels": meta.get("labels", {}),
                         "annotations": meta.get("annotations", {})}}


def load_pods(cluster, namespace: str, pods: list[dict]) -> None:
    """Make the recorded ``pods`` in ``namespace`` of the real ``cluster`` as they were: bound to their
    node (the fake kubelet runs them), those that ended given their phase, an unbound one left to the
    scheduler (it finds no room)."""
    for pod in pods:
        cluster.api("POST", f"/api/v1/namespaces/{namespace}/pods", recorded_pod(pod, namespace))
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
        if not pod["spec"].get("nodeName"):
            continue
        # the fake kubelet marks a bound pod Running once: wait for that before an ended pod's phase is set
        until(lambda path=path: cluster.api("GET", path)["status"].get("phase") == "Running",
              f"the kubelet runs {path}")
        if phase in ("Succeeded", "Failed"):
            cluster.api("PATCH", f"{path}/status", {"status": {"phase": phase}},
                        content_type="application/merge-patch+json")


def load(name: str) -> list[dict]:
    """The items of a recorded object list in tests/kube/fixtures."""
    return json.loads((FIXTURES / name).read_text())["items"]


def load_object(name: str, pod_name: str = "POD") -> dict:
    """A recorded object in tests/kube/fixtures, the placeholder pod name ``POD`` replaced."""
    return json.loads((FIXTURES / name).read_text().replace('"POD"', json.dumps(pod_name))
                      .replace("pod-POD-", f"pod-{pod_name}-"))


@contextlib.contextmanager
def nodes_added(kube_cluster, *nodes: dict, heartbeat: bool = True):
    """``nodes`` added beside the standing ones through the fake kubelet (kept Ready while ``heartbeat``), for
    a test that needs cluster state the standing nodes do not have; removed afterwards (waited for). Their names."""
    names = [node["metadata"]["name"] for node in nodes]
    try:
        for node in nodes:
            kube_cluster.kubelet.add_node(node, heartbeat=heartbeat)
        yield names
    finally:
        for name in names:
            kube_cluster.kubelet.remove_node(name)
        standing = lambda: {n["metadata"]["name"] for n in kube_cluster.api("GET", "/api/v1/nodes")["items"]}  # noqa: E731
        until(lambda: not standing() & set(names), f"nodes {', '.join(names)} are gone")


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "jhub"}}],
        "current-context": "test",
    }))
    return path


async def start_task(spawner, options: dict) -> asyncio.Task:
    spawner.user_options = options
    await spawner._run_apply_user_options(options)
    task = asyncio.ensure_future(asyncio.wait_for(spawner.start(), 90))
    while spawner._start_future is None and not task.done():  # the hub shows progress once the pod is asked for
        await asyncio.sleep(0.01)
    return task


async def progress_until(spawner, wanted: str, timeout: float = 60) -> list[str]:
    """Progress messages, as the hub's progress page gets them, until one contains ``wanted``."""
    messages: list[str] = []

    async def collect() -> bool:
        async for event in spawner.progress():
            messages.append(event["message"])
            if wanted in event["message"]:
                return True
        return False

    try:
        found = await asyncio.wait_for(collect(), timeout)
    except TimeoutError:
        found = False
    assert found, f"no progress message with {wanted!r}; got {messages}"
    return messages


def until(check: Callable[[], object], what: str, timeout: float = 60, period: float = 0.2):
    """``check()``'s first true answer, polling; fails naming ``what`` when none comes in ``timeout``
    seconds (a bound on waiting for the cluster, not a timing being tested)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s in vain: {what}")
        time.sleep(period)


class SpawnerMaker:
    """Makes GPUKubeSpawner instances of one hub (one traitlets Config, so one hub state)."""

    def __init__(self, url: str, namespace: str = "jhub") -> None:
        self.url = url
        self.namespace = namespace
        self.settings: dict = {}
        self.restart()

    def restart(self) -> None:
        """A new hub with the same settings: a new Config, so a new hub state, as after a restart."""
        from traitlets.config import Config

        self.config = Config()
        self.config.KubeSpawner.namespace = self.namespace
        self.config.KubeSpawner.image = "quay.io/jupyter/base-notebook:2024-05-27"
        self.config.KubeSpawner.k8s_api_host = self.url
        for key, value in self.settings.items():
            setattr(self.config.GPUKubeSpawner, key, value)

    def __call__(self, user: str | None = None, server: str = "", groups: tuple = (), **settings):
        """A spawner for ``user``'s server ``server`` (default: KubeSpawner's mock user)."""
        from gpuspawner.backends.kube.spawner import GPUKubeSpawner

        for key, value in settings.items():
            setattr(self.config.GPUKubeSpawner, key, value)
        self.settings.update(settings)
        extra = {}
        if user is not None:
            extra["user"] = SimpleNamespace(name=user, id=abs(hash(user)) % 10_000, url=f"/user/{user}/",
                                            groups=list(groups))
        if server:
            extra["orm_spawner"] = SimpleNamespace(name=server, display_name=server, server=None)
        return GPUKubeSpawner(_mock=True, config=self.config, **extra)
