"""Notebook GPU jobs on gpu-kube: a real JupyterHub with gpu-kube against the Kubernetes API test double.

The double (kmock's emulator, as in the other gpu-kube tests) runs in a thread
of the test process on loopback; the hub, a real JupyterHub process, reaches it
through a kubeconfig. Nothing runs the pods' containers: a stand-in kubelet
marks every created pod Running, and each test ends a job's pod as a kubelet
would, by setting its phase and the notebook container's exit code and
termination message. Every pod the hub creates is checked against the
Kubernetes OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading

import aiohttp
import kmock
import kubernetes_validate
import pytest
import requests

from hub import BASE_HUB_CONFIG, Hub
from jobnotebooks import submit, wait_state
from kubefixtures import NODES, PODS, load, write_kubeconfig
from profiles import A100, K8S_VERSION, PROFILES

pytestmark = pytest.mark.integration

GPU1 = {"profile": "gpu", "gpus": 1, "gpu_model": A100}
KUBE_CONFIG = BASE_HUB_CONFIG + """
from gpuspawner.hub.setup import configure
c.JupyterHub.spawner_class = "gpu-kube"
c.KubeSpawner.namespace = "jhub"
c.KubeSpawner.k8s_api_host = settings["k8s"]
c.KubeSpawner.image = "quay.io/jupyter/pytorch-notebook:cuda12-2024-05-27"
c.KubeSpawner.storage_pvc_ensure = True
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


class ThreadedCluster:
    """The API double on its own event loop thread, with a stand-in kubelet that starts every new pod."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._stack = contextlib.AsyncExitStack()
        self.url = ""

    def _call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, nodes: list[dict]) -> None:
        self.thread.start()
        self._call(self._open(nodes))

    async def _open(self, nodes: list[dict]) -> None:
        self.handler = await self._stack.enter_async_context(kmock.KubernetesEmulator())
        server = await self._stack.enter_async_context(kmock.Server(self.handler))
        self.handler.resources["v1/events"] = {}
        self.handler.resources["v1/pods"] = {}
        self.handler.resources["v1/persistentvolumeclaims"] = {}
        self.url = str(server.url).rstrip("/")
        for node in nodes:
            self.handler.objects[NODES, None, node["metadata"]["name"]] = copy.deepcopy(node)
        self._kubelet = asyncio.ensure_future(self._run_pods())

    async def _run_pods(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                for (resource, namespace, name), obj in list(self.handler.objects.items()):
                    if resource != PODS or obj.deleted or (obj.get("status") or {}).get("phase"):
                        continue
                    image = obj["spec"]["containers"][0].get("image", "")
                    await self._patch(session, namespace, name, {
                        "metadata": {"namespace": namespace, "uid": f"uid-{namespace}-{name}"},
                        "status": {"phase": "Running", "containerStatuses": [
                            {"name": "notebook", "ready": True, "restartCount": 0, "image": image,
                             "imageID": image, "state": {"running": {}}}]},
                    })
                await asyncio.sleep(0.05)

    async def _patch(self, session, namespace: str, name: str, body: dict) -> None:
        url = f"{self.url}/api/v1/namespaces/{namespace}/pods/{name}"
        headers = {"Content-Type": "application/merge-patch+json"}
        async with session.patch(url, data=json.dumps(body), headers=headers) as response:
            response.raise_for_status()

    async def _close(self) -> None:
        self._kubelet.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._kubelet
        await self._stack.aclose()

    def close(self) -> None:
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    # ------------------------------------------------------------ what the tests see and do

    def pods(self) -> dict[str, dict]:
        """Live pods by name."""
        return {name: copy.deepcopy(dict(obj)) for (resource, _ns, name), obj in list(self.handler.objects.items())
                if resource == PODS and not obj.deleted}

    def created(self) -> list[dict]:
        """Every pod body the hub posted."""
        return [r.data for r in self.handler if str(r.method.value).upper() == "POST" and r.url.path.endswith("/pods")]

    def deleted(self) -> list[str]:
        return [r.url.path.rsplit("/", 1)[1] for r in self.handler
                if str(r.method.value).upper() == "DELETE" and "/pods/" in r.url.path]

    def finish(self, name: str, phase: str, exit_code: int, message: str = "") -> None:
        """End a pod as its kubelet would: the phase, and the notebook container terminated."""
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
        if message:
            terminated["message"] = message
        body = {"status": {"phase": phase, "containerStatuses": [
            {"name": "notebook", "ready": False, "restartCount": 0, "image": "x", "imageID": "x",
             "state": {"terminated": terminated}}]}}
        r = requests.patch(f"{self.url}/api/v1/namespaces/jhub/pods/{name}", data=json.dumps(body),
                           headers={"Content-Type": "application/merge-patch+json"}, timeout=10)
        r.raise_for_status()


@pytest.fixture(scope="module")
def kube():
    cluster = ThreadedCluster()
    cluster.start(load("nodes.json"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, kube):
    tmp = tmp_path_factory.mktemp("jobs-kube")
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", kube.url)
    hub = Hub(tmp / "hub", {"KUBECONFIG": str(kubeconfig)}, PROFILES)
    hub.settings["k8s"] = kube.url
    hub.env["GPUSPAWNER_TEST_HUB"] = json.dumps(hub.settings)
    hub.config_file.write_text(KUBE_CONFIG)
    hub.start()
    hub.add_users("zoe", "yann")
    try:
        yield hub
    finally:
        for name in ("zoe", "yann"):
            for job in hub.api("GET", f"/users/{name}/gpu-jobs").json().get("jobs", []):
                hub.api("DELETE", f"/users/{name}/gpu-jobs/{job['id']}")
        hub.stop()




def job_pod(kube: ThreadedCluster, job_id: str) -> dict:
    found = [p for p in kube.created() if p["metadata"]["labels"].get("gpuspawner.org/job") == job_id]
    assert len(found) == 1, [p["metadata"]["name"] for p in kube.created()]
    kubernetes_validate.validate(found[0], K8S_VERSION, strict=True)
    return found[0]


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
    assert pod["metadata"]["name"] not in kube.pods() and pod["metadata"]["name"] in kube.deleted()


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
    assert name not in kube.pods()


def test_cancel_deletes_the_pod_and_frees_the_claim(hub, kube):
    r = submit(hub, "zoe", {**GPU1, "notebook": "long.ipynb"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_state(hub, "zoe", job_id, ("running",))
    name = job_pod(kube, job_id)["metadata"]["name"]
    r = hub.api("DELETE", f"/users/zoe/gpu-jobs/{job_id}")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled" and r.json()["reason"] == "cancelled"
    assert name in kube.deleted() and name not in kube.pods()
    assert f"zoe/job/{job_id}" not in counted(hub)


def test_quota_counts_job_pods(hub, kube):
    first = submit(hub, "yann", {"profile": "gpu", "gpus": 2, "gpu_model": A100, "notebook": "big.ipynb"})
    assert first.status_code == 201, first.text
    job_id = first.json()["id"]
    try:
        wait_state(hub, "yann", job_id, ("running",))
        assert job_pod(kube, job_id)["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert counted(hub)[f"yann/job/{job_id}"] == 2
        posted = len(kube.created())
        r = submit(hub, "yann", {**GPU1, "notebook": "more.ipynb"})
        assert r.status_code == 409, r.text
        assert r.json()["message"].startswith("Your quota is 2 GPUs"), r.json()
        assert f"job/{job_id}" in r.json()["message"]
        assert len(kube.created()) == posted, "a refused job creates no pod"
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
    running_pod, ending_pod = (job_pod(kube, j)["metadata"]["name"] for j in (running_id, ending_id))
    hub.stop()
    kube.finish(ending_pod, "Failed", 1, "ValueError: bad batch")
    hub.start()
    ended = wait_state(hub, "zoe", ending_id, ("completed", "failed"))
    assert ended["state"] == "failed"
    assert ended["reason"] == "ValueError: bad batch (ended while the hub was down)"
    assert ending_pod not in kube.pods()
    # the running one is counted again under its job (read from its pod), never started twice
    assert counted(hub) == {f"zoe/job/{running_id}": 1}
    assert wait_state(hub, "zoe", running_id, ("running",))["state"] == "running"
    assert len([p for p in kube.created() if p["metadata"]["name"] == running_pod]) == 1
    r = submit(hub, "zoe", {"profile": "gpu", "gpus": 2, "gpu_model": A100, "notebook": "c.ipynb"})
    assert r.status_code == 409 and f"job/{running_id}" in r.json()["message"], r.text
    kube.finish(running_pod, "Succeeded", 0)
    assert wait_state(hub, "zoe", running_id, ("completed", "failed"))["state"] == "completed"
    assert counted(hub) == {}
