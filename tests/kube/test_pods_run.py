"""Pods that really run on the test run's real control plane (``kube_cluster``): the fake kubelet's
:class:`~gpuspawner.backends.kube.dev.pods.ProcessRunner` starts their containers as local processes on loopback
pod IPs, and each fake node's kubelet API serves ``exec`` (gpuspawner.backends.kube.dev.exec), reached through
the real API server by the real ``kubectl`` and the Python client. Then a real JupyterHub with
gpu-kube spawns a GPU server there and reaches it through its proxy."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests

from gpuspawner.backends.kube.dev.pods import gpu_uuid
from hub import BASE_HUB_CONFIG, Hub, process_env
from kubefixtures import until

SINGLEUSER = "quay.io/jupyter/base-notebook:2024-05-27"
TOLERATE_ALL = [{"operator": "Exists"}]


@pytest.fixture
def running_namespace(kube_cluster, kube_namespace):
    """``kube_namespace``, whose pods the fake kubelet really runs."""
    runner = kube_cluster.kubelet.runner
    runner.namespaces.add(kube_namespace)
    yield kube_namespace
    runner.namespaces.discard(kube_namespace)


def run_pod(cluster, namespace: str, name: str, container: dict) -> dict:
    """Create a pod of ``container`` and wait until it is no longer Pending; the pod as the API holds it."""
    base = f"/api/v1/namespaces/{namespace}/pods"
    cluster.api("POST", base, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                               "spec": {"containers": [container], "tolerations": TOLERATE_ALL,
                                        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1}})
    return until(lambda: (p := cluster.api("GET", f"{base}/{name}"))["status"].get("phase", "Pending") != "Pending"
                 and p, f"pod {name} leaves Pending")


def test_kubectl_and_the_python_client_exec_into_a_pod_in_its_environment(kube_cluster, running_namespace):
    pod = run_pod(kube_cluster, running_namespace, "shell", {
        "name": "python", "image": "python:3.12-slim", "args": ["/bin/sh", "-c", "while true; do sleep 5; done"],
        "env": [{"name": "GREETING", "value": "hello"}, {"name": "WHO", "value": "$(GREETING) pod"}],
        "securityContext": {"runAsUser": 1234, "runAsGroup": 1234}})
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["podIP"].startswith("127.")

    kubectl = subprocess.run(
        [str(kube_cluster.bin / "kubectl"), "--kubeconfig", str(kube_cluster.admin_kubeconfig), "-n",
         running_namespace, "exec", "shell", "--", "sh", "-c", 'echo "$WHO as $(id -u)"; echo oops >&2; exit 3'],
        capture_output=True, text=True, timeout=60)
    assert kubectl.stdout == "hello pod as 1234\n", kubectl.stderr
    assert kubectl.stderr == "oops\ncommand terminated with exit code 3\n"
    assert kubectl.returncode == 3

    from kubernetes import client, config
    from kubernetes.stream import stream

    api = client.CoreV1Api(config.new_client_from_config(str(kube_cluster.admin_kubeconfig)))
    ws = stream(api.connect_get_namespaced_pod_exec, "shell", running_namespace, container="python",
                command=["python3", "-c", "import os, sys; print(os.environ['GREETING']); sys.exit(7)"],
                stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False)
    ws.run_forever(timeout=60)
    assert (ws.returncode, ws.read_stdout()) == (7, "hello\n")
    ws = stream(api.connect_get_namespaced_pod_exec, "shell", running_namespace, command=["true"],
                stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False)
    ws.run_forever(timeout=60)
    assert ws.returncode == 0


def test_a_pod_whose_process_ends_is_failed_with_its_exit_code(kube_cluster, running_namespace):
    pod = run_pod(kube_cluster, running_namespace, "ends", {
        "name": "python", "image": "python:3.12-slim", "command": ["python3", "-c", "import sys; sys.exit(4)"]})
    base = f"/api/v1/namespaces/{running_namespace}/pods/ends"
    pod = until(lambda: (p := kube_cluster.api("GET", base))["status"]["phase"] == "Failed" and p,
                f"the pod fails (it was {pod['status']['phase']})")
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (4, "Error")
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "False"


KUBE_HUB_CONFIG = """
# the hub's API where its pods reach it (a pod's own 127.0.0.1 is the pod's, as in a real pod)
c.JupyterHub.hub_bind_url = settings["hub_bind_url"].replace("127.0.0.1", "127.0.0.2")
c.JupyterHub.spawner_class = "gpu-kube"
c.KubeSpawner.namespace = {namespace!r}
c.KubeSpawner.image = {image!r}
c.KubeSpawner.start_timeout = 90
c.KubeSpawner.http_timeout = 60
c.GPUKubeSpawner.gpu_profiles = {profiles!r}
"""
PROFILES = [{"slug": "gpu", "display_name": "Two GPUs", "gpu_models": ["any"], "gpu_counts": [2]}]


@pytest.mark.integration
def test_a_hub_spawns_a_gpu_server_that_answers_through_it(kube_cluster, running_namespace, tmp_path):
    folder = tmp_path / "hub"
    folder.mkdir()
    config = folder / "jupyterhub_config.py"
    config.write_text(BASE_HUB_CONFIG + KUBE_HUB_CONFIG.format(namespace=running_namespace, image=SINGLEUSER,
                                                                profiles=PROFILES))
    hub = Hub(folder, {"KUBECONFIG": str(kube_cluster.admin_kubeconfig)}, config_file=config)
    hub.start()
    try:
        hub.add_users("ada")
        r = hub.spawn("ada", {"profile": "gpu", "gpus": 2})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("ada", timeout=120)
        # the server answers through the hub's proxy (the tests' service may access servers)
        answer = requests.get(f"{hub.url}/user/ada/api/status", headers={"Authorization": f"token {hub.token}"},
                              timeout=30)
        assert answer.status_code == 200 and "started" in answer.json(), answer.text

        pod = next(p for p in kube_cluster.api("GET", f"/api/v1/namespaces/{running_namespace}/pods")["items"]
                   if p["metadata"]["name"].startswith("jupyter-ada"))
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        entry = kube_cluster.kubelet.runner.pods[pod["metadata"]["uid"]]
        process = entry.containers["notebook"].process
        env = process_env(process.pid)
        node = pod["spec"]["nodeName"]
        devices = env["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(devices) == 2 and set(devices) <= {gpu_uuid(node, i) for i in range(8)}
        assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"]
        uid = int(next(line for line in Path(f"/proc/{process.pid}/status").read_text().splitlines()
                       if line.startswith("Uid:")).split()[1])
        assert uid != 0
        assert json.loads(json.dumps(pod["status"]["podIP"])).startswith("127.")

        hub.stop_server("ada", timeout=60)
        until(lambda: process.poll() is not None, "the server's process is stopped with its pod")
    finally:
        hub.close()
