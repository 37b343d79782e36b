"""Notebook GPU jobs on gpu-kube: a real JupyterHub with gpu-kube on the real control plane.

The hub, a real JupyterHub process, runs as its ServiceAccount with the Helm chart's RBAC in a namespace
of this module's own in ``kube_cluster`` (the standing fake GPU nodes), its users' home claims bound to
PersistentVolumes made for them. The real scheduler binds the job pods and the fake kubelet marks them
Running; nothing runs their containers: each test ends a job's pod as a kubelet would, by setting its
phase and the notebook container's exit code and termination message. Every pod the hub creates is
checked against the Kubernetes OpenAPI schema.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import kubernetes_validate
import pytest

from hub import BASE_HUB_CONFIG, Hub
from jobnotebooks import submit, wait_state
from kubefixtures import hub_account, namespace_of_its_own, until
from profiles import A100, K8S_VERSION, PROFILES

pytestmark = pytest.mark.integration

GPU1 = {"profile": "gpu", "gpus": 1, "gpu_model": A100}
USERS = ("zoe", "yann")
KUBE_CONFIG = BASE_HUB_CONFIG + """
from gpuspawner.hub.setup import configure
c.JupyterHub.spawner_class = "gpu-kube"
c.KubeSpawner.namespace = settings["namespace"]
c.KubeSpawner.k8s_api_host = settings["k8s"]
c.KubeSpawner.image = "quay.io/jupyter/pytorch-notebook:cuda12-2024-05-27"
c.KubeSpawner.storage_pvc_ensure = True
c.KubeSpawner.storage_capacity = "1Gi"
c.KubeSpawner.pvc_name_template = "claim-{username}"
c.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}}]
c.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/jovyan"}]
c.KubeSpawner.notebook_dir = "/home/jovyan"
c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]
c.GPUSpawnerMixin.gpu_inventory_ttl = 0.5
c.GPUSpawnerMixin.gpu_profiles = settings["profiles"]
c.GPUSpawnerMixin.gpu_quota_per_user = 2
c.GPUSpawnerMixin.gpu_job_time_limit = 600
c.JupyterHub.load_roles[0]["scopes"] += ["custom:gpus:read"]
configure(c)
"""


class JobCluster(SimpleNamespace):
    """``kube_cluster`` (``kube``) seen from the module's namespace (``namespace``)."""

    def pods(self) -> dict[str, dict]:
        """Live pods (not being deleted) by name, as the API server holds them."""
        items = self.kube.api("GET", f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}

    def finish(self, name: str, phase: str, exit_code: int, message: str = "") -> None:
        """End a pod as its kubelet would: the phase, and the notebook container terminated."""
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
        if message:
            terminated["message"] = message
        body = {"status": {"phase": phase, "containerStatuses": [
            {"name": "notebook", "ready": False, "restartCount": 0, "image": "x", "imageID": "x",
             "state": {"terminated": terminated}}]}}
        self.kube.api("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{name}/status", body,
                      content_type="application/merge-patch+json")

    def gone(self, name: str) -> bool:
        return self.kube.api("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}", ok=(404,)) is None


def home_volume(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/srv/{name}"}}}


@pytest.fixture(scope="module")
def kube(kube_cluster):
    """The module's namespace, with a PersistentVolume for each user's home claim (deleted afterwards)."""
    with namespace_of_its_own(kube_cluster) as namespace:
        volumes = [f"{namespace}-{user}" for user in USERS]
        for name in volumes:
            kube_cluster.api("POST", "/api/v1/persistentvolumes", home_volume(name))
        try:
            yield JobCluster(kube=kube_cluster, namespace=namespace)
        finally:
            for name in volumes:
                kube_cluster.api("DELETE", f"/api/v1/persistentvolumes/{name}", ok=(404,))


@pytest.fixture(scope="module")
def hub(tmp_path_factory, kube):
    """A real JupyterHub with gpu-kube, as its ServiceAccount in the module's namespace."""
    tmp = tmp_path_factory.mktemp("jobs-kube")
    kubeconfig = hub_account(kube.kube, kube.namespace)
    hub = Hub(tmp / "hub", {"KUBECONFIG": kubeconfig}, PROFILES)
    hub.settings.update(k8s=kube.kube.server, namespace=kube.namespace)
    hub.env["GPUSPAWNER_TEST_HUB"] = json.dumps(hub.settings)
    hub.config_file.write_text(KUBE_CONFIG)
    hub.start()
    hub.add_users(*USERS)
    try:
        yield hub
    finally:
        for name in USERS:
            for job in hub.api("GET", f"/users/{name}/gpu-jobs").json().get("jobs", []):
                hub.api("DELETE", f"/users/{name}/gpu-jobs/{job['id']}")
        hub.stop()




def job_pods(kube: JobCluster, job_id: str) -> list[dict]:
    return [p for p in kube.pods().values() if p["metadata"]["labels"].get("gpuspawner.org/job") == job_id]


def job_pod(kube: JobCluster, job_id: str) -> dict:
    """The job's one pod, as the API server holds it, once the scheduler has bound it."""
    found = job_pods(kube, job_id)
    assert len(found) == 1, list(kube.pods())
    pod = until(lambda: kube.pods().get(found[0]["metadata"]["name"], {}).get("spec", {}).get("nodeName")
                and kube.pods()[found[0]["metadata"]["name"]], f"the scheduler binds {found[0]['metadata']['name']}")
    sent = {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"], "spec": pod["spec"]}
    kubernetes_validate.validate(sent, K8S_VERSION, strict=True)
    return pod


def counted(hub: Hub) -> dict[str, int]:
    """owner -> GPUs the hub counts for it (cluster placements in /hub/api/gpus)."""
    r = hub.api("GET", "/gpus")
    assert r.status_code == 200, r.text
    return {c["owner"]: c["gpus"] for c in r.json()["cluster"]}


def test_job_pod_runs_the_executor_with_the_gpu_and_completes(hub, kube):
    r = submit(hub, "zoe", {**GPU1, "notebook": "work/train.ipynb", "parameters": {"epochs": 3}})
    assert r.status_code == 201, r.text
    created = r.json()
    job_id = created["id"]
    assert created["gpu_count"] == 1 and created["gpus"] == []  # the cluster picks the GPU
    running = wait_state(hub, "zoe", job_id, ("running",))
    pod = job_pod(kube, job_id)
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert spec["restartPolicy"] == "Never"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert container["image"] == "quay.io/jupyter/pytorch-notebook:cuda12-2024-05-27"
    assert container["command"][:3] == ["python3", "-m", "gpuspawner.jobs.execute"]
    assert container["command"][container["command"].index("--notebook") + 1] == "work/train.ipynb"
    assert "--termination-log" in container["command"] and "ports" not in container
    assert container["workingDir"] == "/home/jovyan"
    assert {"name": "home", "mountPath": "/home/jovyan"} in container["volumeMounts"]
    assert {"name": "home", "persistentVolumeClaim": {"claimName": "claim-zoe"}} in spec["volumes"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUSPAWNER_SERVER"] == f"zoe/job/{job_id}" and env["GPUSPAWNER_SPAWN"] == job_id
    assert not [k for k in env if k.startswith("JUPYTERHUB_")], "a job holds no server token"
    assert pod["metadata"]["annotations"]["hub.jupyter.org/servername"] == f"job/{job_id}"
    assert pod["metadata"]["labels"]["component"] == "singleuser-server"
    # while it runs, the hub counts its GPU under the job
    assert counted(hub)[f"zoe/job/{job_id}"] == 1
    kube.finish(pod["metadata"]["name"], "Succeeded", 0, "completed")
    done = wait_state(hub, "zoe", job_id, ("completed", "failed"))
    assert done["state"] == "completed" and done["exit_code"] == 0, done
    assert done["started"] == running["started"] and done["ended"]
    assert f"zoe/job/{job_id}" not in counted(hub), "the claim is freed"
    until(lambda: kube.gone(pod["metadata"]["name"]), "the hub deletes the job's pod")


def test_failed_pod_fails_the_job_with_its_termination_message(hub, kube):
    r = submit(hub, "yann", {**GPU1, "notebook": "fail.ipynb"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_state(hub, "yann", job_id, ("running",))
    name = job_pod(kube, job_id)["metadata"]["name"]
    kube.finish(name, "Failed", 1, "RuntimeError: no convergence")
    done = wait_state(hub, "yann", job_id, ("completed", "failed"))
    assert done["state"] == "failed" and done["reason"] == "RuntimeError: no convergence", done
    assert done["exit_code"] == 1
    assert f"yann/job/{job_id}" not in counted(hub)
    until(lambda: kube.gone(name), f"the hub deletes {name}")


def test_cancel_deletes_the_pod_and_frees_the_claim(hub, kube):
    r = submit(hub, "zoe", {**GPU1, "notebook": "long.ipynb"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_state(hub, "zoe", job_id, ("running",))
    name = job_pod(kube, job_id)["metadata"]["name"]
    r = hub.api("DELETE", f"/users/zoe/gpu-jobs/{job_id}")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled" and r.json()["reason"] == "cancelled"
    until(lambda: kube.gone(name), f"the hub deletes {name}")
    assert f"zoe/job/{job_id}" not in counted(hub)


def test_quota_counts_job_pods(hub, kube):
    first = submit(hub, "yann", {"profile": "gpu", "gpus": 2, "gpu_model": A100, "notebook": "big.ipynb"})
    assert first.status_code == 201, first.text
    job_id = first.json()["id"]
    try:
        wait_state(hub, "yann", job_id, ("running",))
        assert job_pod(kube, job_id)["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert counted(hub)[f"yann/job/{job_id}"] == 2
        pods = set(kube.pods())
        r = submit(hub, "yann", {**GPU1, "notebook": "more.ipynb"})
        assert r.status_code == 409, r.text
        assert r.json()["message"].startswith("Your quota is 2 GPUs"), r.json()
        assert f"job/{job_id}" in r.json()["message"]
        assert set(kube.pods()) == pods, "a refused job creates no pod"
    finally:
        hub.api("DELETE", f"/users/yann/gpu-jobs/{job_id}")
    assert f"yann/job/{job_id}" not in counted(hub)


def test_compute_types_come_from_the_cluster(hub):
    r = hub.api("GET", "/users/zoe/gpu-job-options")
    assert r.status_code == 200, r.text
    by_label = {t["label"]: t for t in r.json()["compute_types"]}
    assert "CPU only" in by_label
    a100 = by_label["1 x NVIDIA-A100-SXM4-80GB"]  # the GPU Feature Discovery product label
    assert (a100["profile"], a100["gpus"], a100["free"], a100["total"]) == ("gpu", 1, 16, 16)


def test_a_restarted_hub_counts_a_running_job_pod_and_records_one_that_ended(hub, kube):
    running_id, ending_id = (submit(hub, "zoe", {**GPU1, "notebook": n}).json()["id"] for n in ("a.ipynb", "b.ipynb"))
    for job_id in (running_id, ending_id):
        wait_state(hub, "zoe", job_id, ("running",))
    running, ending_pod = (job_pod(kube, j) for j in (running_id, ending_id))
    running_pod, ending_pod = running["metadata"]["name"], ending_pod["metadata"]["name"]
    hub.stop()
    kube.finish(ending_pod, "Failed", 1, "ValueError: bad batch")
    hub.start()
    ended = wait_state(hub, "zoe", ending_id, ("completed", "failed"))
    assert ended["state"] == "failed"
    assert ended["reason"] == "ValueError: bad batch (ended while the hub was down)"
    until(lambda: kube.gone(ending_pod), f"the hub deletes {ending_pod}")
    # the running one is counted again under its job (read from its pod), never started twice
    assert counted(hub) == {f"zoe/job/{running_id}": 1}
    assert wait_state(hub, "zoe", running_id, ("running",))["state"] == "running"
    assert kube.pods()[running_pod]["metadata"]["uid"] == running["metadata"]["uid"]  # the same pod
    r = submit(hub, "zoe", {"profile": "gpu", "gpus": 2, "gpu_model": A100, "notebook": "c.ipynb"})
    assert r.status_code == 409 and f"job/{running_id}" in r.json()["message"], r.text
    kube.finish(running_pod, "Succeeded", 0)
    assert wait_state(hub, "zoe", running_id, ("completed", "failed"))["state"] == "completed"
    assert counted(hub) == {}
