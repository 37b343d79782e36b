"""jupyter-scheduler in a real single-user server, running jobs on the hub's GPUs.

The user's server (gpu-local, CPU only) has the real jupyter-scheduler with
gpuspawner's environment manager and scheduler; the test drives it through
jupyter-scheduler's own REST API (what its Create Job dialog and job list call).
"""

from __future__ import annotations

import time

import pytest
import requests

import fakenvml
from gpuspawner.labjobs.scheduler import MESSAGES
from gpuspawner.simulation import simulated_config
from hub import Hub, process_env
from jobnotebooks import GPU_REPORT, JOBS_CONFIG, PROFILES, holders, outputs_text, write

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hub(tmp_path_factory, fakenvml_libdir):
    tmp = tmp_path_factory.mktemp("jobs-scheduler")
    config_path = tmp / "gpus.json"
    fakenvml.write_config(config_path, simulated_config(a100=2, t4=2))
    hub = Hub(tmp / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES, extra_config=JOBS_CONFIG)
    hub.start()
    hub.add_users("dana")
    try:
        yield hub
    finally:
        hub.close()


def scheduler(hub: Hub, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, f"{hub.url}/user/dana/scheduler/{path}",
                            headers={"Authorization": f"token {hub.token}"}, timeout=60, **kwargs)


def test_create_job_runs_on_its_own_gpu_and_outlives_the_server(hub):
    r = hub.spawn("dana", {"profile": "cpu", "gpus": 0})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("dana")
    write(hub.home("dana") / "bench.ipynb", GPU_REPORT, parameters="seconds = 0")
    envs = scheduler(hub, "GET", "runtime_environments")
    assert envs.status_code == 200, envs.text
    env = envs.json()[0]
    assert "1 x Tesla T4 - 2 of 2 free" in env["compute_types"] and "CPU only" in env["compute_types"]
    created = scheduler(hub, "POST", "jobs", json={
        "input_uri": "bench.ipynb", "runtime_environment_name": env["name"], "name": "bench",
        "compute_type": "1 x Tesla T4 - 2 of 2 free", "output_formats": ["ipynb"], "parameters": {"seconds": "4"},
    })
    assert created.status_code == 200, created.text
    job_id = created.json()["job_id"]
    described = scheduler(hub, "GET", f"jobs/{job_id}").json()
    assert described["status"] in ("QUEUED", "IN_PROGRESS") and described["compute_type"] == "1 x Tesla T4"
    hub_jobs = hub.api("GET", "/users/dana/gpu-jobs").json()["jobs"]
    assert len(hub_jobs) == 1
    assert hub_jobs[0]["id"] == job_id, "the hub's job has the Job ID JupyterLab shows"
    uuid = hub_jobs[0]["gpus"][0]["uuid"]
    assert holders(hub)[uuid]["kind"] == "job"
    # stopping the interactive server does not stop the job
    hub.stop_server("dana")
    pids = [p for p in hub.marked_pids() if process_env(p).get("GPUSPAWNER_SPAWN") == hub_jobs[0]["id"]]
    assert pids and all(process_env(p)["CUDA_VISIBLE_DEVICES"] == uuid for p in pids)
    deadline = time.monotonic() + 60
    while hub.api("GET", f"/users/dana/gpu-jobs/{hub_jobs[0]['id']}").json()["state"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, hub.log()
        time.sleep(0.3)
    assert uuid not in holders(hub)
    # its usage row names it by that id too, and says how it ended
    rows = hub.api("GET", "/gpus/usage", params={"by": "allocation"}).json()["rows"]
    row = next(r for r in rows if r["kind"] == "job")
    assert (row["job_id"], row["owner"], row["end_reason"]) == (job_id, f"dana/job/{job_id}", "completed")
    # back in JupyterLab: the job list shows it completed, with its GPU, and its output notebook
    r = hub.spawn("dana", {"profile": "cpu", "gpus": 0})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("dana")
    listed = scheduler(hub, "GET", "jobs").json()["jobs"]
    done = next(j for j in listed if j["job_id"] == job_id)
    assert done["status"] == "COMPLETED", done
    assert f"GPU: Tesla T4 {uuid}" in done["tags"] and "ended: completed" in done["tags"]
    assert done["start_time"] and done["end_time"] and not done.get("status_message")
    output = next(f for f in done["job_files"] if f["file_format"] == "ipynb")
    staged = scheduler(hub, "GET", f"jobs/{job_id}").json()
    assert staged["status"] == "COMPLETED"
    staging = hub.home("dana") / ".jupyter" / "scheduler_staging_area"
    text = outputs_text(next(staging.rglob("bench-*.ipynb")))
    assert f"GPUS={uuid}" in text and "slept 4" in text
    assert output["display_name"]


def ensure_server(hub: Hub) -> None:
    if not hub.user("dana")["servers"]:
        hub.spawn("dana", {"profile": "cpu", "gpus": 0})
        hub.wait_ready("dana")


def test_a_refused_job_shows_the_hubs_sentence(hub):
    ensure_server(hub)
    write(hub.home("dana") / "bench.ipynb", GPU_REPORT, parameters="seconds = 0")
    env = scheduler(hub, "GET", "runtime_environments").json()[0]
    r = scheduler(hub, "POST", "jobs", json={
        "input_uri": "bench.ipynb", "runtime_environment_name": env["name"], "name": "big",
        "compute_type": "4 x Tesla T4", "output_formats": ["ipynb"],
    })
    assert r.status_code >= 400 and "Unknown compute type" in r.text
    assert not [j for j in scheduler(hub, "GET", "jobs").json()["jobs"] if j["name"] == "big"]


def test_a_job_without_its_notebook_is_refused_naming_what_is_missing(hub):
    """The Create Job form fills its read-only Input file from the file browser's selection (its
    notebook toolbar button too): with nothing selected it sends it empty (jupyter-scheduler#503)."""
    ensure_server(hub)
    env = scheduler(hub, "GET", "runtime_environments").json()[0]
    t4 = next(t for t in env["compute_types"] if t.startswith("1 x Tesla T4"))
    form = {"runtime_environment_name": env["name"], "name": "nothing", "compute_type": t4,
            "output_formats": ["ipynb"], "parameters": {}}
    hub_jobs = len(hub.api("GET", "/users/dana/gpu-jobs").json()["jobs"])

    empty = scheduler(hub, "POST", "jobs", json={**form, "input_uri": ""})
    assert empty.status_code == 500 and empty.json()["message"] == MESSAGES["no_input"], empty.text
    assert "Input file is empty" in empty.json()["message"]
    gone = scheduler(hub, "POST", "jobs", json={**form, "input_uri": "work/gone.ipynb"})
    assert gone.json()["message"].startswith("The input file work/gone.ipynb does not exist in your files"), gone.text
    schedule = {"schedule": "0 * * * *", "timezone": "UTC"}
    definition = scheduler(hub, "POST", "job_definitions", json={**form, **schedule, "input_uri": ""})
    assert definition.json()["message"] == MESSAGES["no_input"], definition.text
    # nothing was made: no job in the list, no definition, no job on the hub
    assert not [j for j in scheduler(hub, "GET", "jobs").json()["jobs"] if j["name"] == "nothing"]
    assert not scheduler(hub, "GET", "job_definitions").json()["job_definitions"]
    assert len(hub.api("GET", "/users/dana/gpu-jobs").json()["jobs"]) == hub_jobs
