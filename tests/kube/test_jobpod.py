"""A notebook GPU job's pod, and how it ended, read from pod objects (pure)."""

from __future__ import annotations

import pytest

from gpuspawner.backends.kube.holdings import server_holdings
from gpuspawner.backends.kube.jobpod import PodEnd, job_pod, pod_end

SERVER_POD = {
    "metadata": {"name": "jupyter-zoe", "labels": {"component": "singleuser-server"},
                 "annotations": {"hub.jupyter.org/username": "zoe"}},
    "spec": {"restartPolicy": "OnFailure", "containers": [
        {"name": "sidecar", "image": "proxy"},
        {"name": "notebook", "image": "torch", "args": ["jupyterhub-singleuser"],
         "ports": [{"containerPort": 8888, "name": "notebook-port"}],
         "resources": {"limits": {"nvidia.com/gpu": "2"}},
         "env": [{"name": "JUPYTERHUB_API_TOKEN", "value": "secret"}, {"name": "TORCH_HOME", "value": "/cache"}]},
    ]},
}
JOB = "3f2a9c0e1b7d4e5f8a6b0c1d2e3f4a5b"


def test_job_pod_from_the_server_pod():
    pod = job_pod(SERVER_POD, job_id=JOB, name="jupyter-zoe-job-3f2a9c0e1b7d", command=["python3", "-m", "x"],
                  env={"GPUSPAWNER_SPAWN": JOB}, working_dir="/home/jovyan")
    assert SERVER_POD["spec"]["restartPolicy"] == "OnFailure", "the server's pod is not changed"
    assert pod["spec"]["restartPolicy"] == "Never"
    sidecar, notebook = pod["spec"]["containers"]
    assert sidecar == {"name": "sidecar", "image": "proxy"}
    assert notebook["command"] == ["python3", "-m", "x"] and "args" not in notebook and "ports" not in notebook
    assert notebook["env"] == [{"name": "TORCH_HOME", "value": "/cache"}, {"name": "GPUSPAWNER_SPAWN", "value": JOB}]
    assert notebook["workingDir"] == "/home/jovyan"
    assert notebook["terminationMessagePath"] == "/dev/termination-log"
    # the hub's quota path counts it under the job's ledger owner
    assert server_holdings([pod]).holdings == {f"zoe/job/{JOB}": {"nvidia.com/gpu": 2}}


def pod(phase: str, state: dict | None = None, **status) -> dict:
    statuses = [{"name": "sidecar", "state": {"running": {}}}]
    if state is not None:
        statuses.append({"name": "notebook", "state": state})
    return {"status": {"phase": phase, "containerStatuses": statuses, **status}}


@pytest.mark.parametrize("obj, end", [
    (pod("Pending"), PodEnd(False)),
    (pod("Running", {"running": {}}), PodEnd(False)),
    (pod("Pending", {"waiting": {"reason": "ContainerCreating"}}), PodEnd(False)),
    # the notebook container decides, whatever a sidecar does
    (pod("Running", {"terminated": {"exitCode": 0, "reason": "Completed", "message": "completed"}}), PodEnd(True, 0)),
    (pod("Failed", {"terminated": {"exitCode": 1, "reason": "Error", "message": "RuntimeError: no convergence\n"}}),
     PodEnd(True, 1, "RuntimeError: no convergence")),
    (pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}),
     PodEnd(True, 137, "the job's container ended: OOMKilled")),
    (pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}}),
     PodEnd(True, None, "the job's container could not start: ImagePullBackOff (pull access denied)")),
    (pod("Failed", None, reason="Evicted", message="The node was low on resource: memory."),
     PodEnd(True, None, "Evicted The node was low on resource: memory.")),
    (None, PodEnd(True, None, "the job's pod is gone")),
])
def test_how_a_job_pod_ended(obj, end):
    assert pod_end(obj) == end
