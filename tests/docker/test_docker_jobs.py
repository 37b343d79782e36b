"""Notebook GPU jobs on gpu-docker: a container of the user's image and volume, its GPU by UUID.

A real JupyterHub with gpu-docker on the private engine; the job's container
runs the real executor in the single-user image, writes the executed notebook
into the user's volume, and is gone when the job has ended.
"""

from __future__ import annotations

import json
import time

import pytest

from engine import device_requests, process_environ
from jobnotebooks import GPU_REPORT, outputs_text, write

pytestmark = pytest.mark.docker

JOBS = """
from gpuspawner.hub.setup import configure
c.JupyterHub.load_roles[0]["scopes"] += ["custom:gpus:read"]
configure(c)
"""


def test_job_runs_in_its_own_container_and_leaves_none(docker_hub, tmp_path):
    hub = docker_hub(start=False)
    homes = tmp_path / "homes"
    (homes / "erin").mkdir(parents=True)
    (homes / "erin").chmod(0o777)
    hub.settings["volumes"][str(homes / "{username}")] = {"bind": "/home/jovyan/work", "mode": "rw"}
    hub.env["GPUSPAWNER_TEST_HUB"] = json.dumps(hub.settings)
    with open(hub.dir / "jupyterhub_config.py", "a") as config:
        config.write(JOBS)
    hub.start()
    hub.add_users("erin")
    write(homes / "erin" / "report.ipynb", GPU_REPORT, parameters="seconds = 0")
    r = hub.api("POST", "/users/erin/gpu-jobs", json={
        "profile": "gpu", "gpus": 1, "notebook": "work/report.ipynb", "parameters": {"seconds": 6},
        "outputs": {"ipynb": "work/report-run.ipynb"}})
    assert r.status_code == 201, r.text
    job = r.json()
    uuid = job["gpus"][0]["uuid"]
    deadline = time.monotonic() + 120
    containers = []
    while time.monotonic() < deadline and not containers:
        containers = hub.engine.client.containers.list(filters={"label": f"org.gpuspawner.job={job['id']}"})
        time.sleep(0.3)
    assert containers, hub.log()
    container = containers[0]
    assert [r["DeviceIDs"] for r in device_requests(container)] == [[uuid]]
    env = dict(process_environ(container))
    assert env["CUDA_VISIBLE_DEVICES"] == uuid and env["GPUSPAWNER_SERVER"] == f"erin/job/{job['id']}"
    holders = {g["uuid"]: g["holder"] for g in hub.api("GET", "/gpus").json()["gpus"] if g.get("holder")}
    assert holders[uuid]["kind"] == "job"
    while time.monotonic() < deadline:
        state = hub.api("GET", f"/users/erin/gpu-jobs/{job['id']}").json()
        if state["state"] not in ("starting", "running"):
            break
        time.sleep(0.3)
    assert state["state"] == "completed", (state, hub.log())
    text = outputs_text(homes / "erin" / "report-run.ipynb")
    assert f"GPUS={uuid}" in text and "slept 6" in text
    def left() -> list:
        return hub.engine.client.containers.list(all=True, filters={"label": f"org.gpuspawner.job={job['id']}"})

    gone = time.monotonic() + 30  # removed right after its GPUs were given back
    while left() and time.monotonic() < gone:
        time.sleep(0.3)
    assert not left(), "the job's container is removed"
    holders = {g["uuid"]: g["holder"] for g in hub.api("GET", "/gpus").json()["gpus"] if g.get("holder")}
    assert uuid not in holders
