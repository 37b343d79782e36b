"""Notebook GPU jobs on a real JupyterHub with gpu-local, through the hub's job API.

The jobs run the real executor (nbclient, a real ipykernel) as processes of the
hub; each test reads what the job's process held from its own environment
(``/proc/PID/environ``) and what the user would see: the job's state and
reason, the executed notebook in their files, and ``/hub/api/gpus``.
"""

from __future__ import annotations

import time

import pytest
import requests

import devcgroup
import fakenvml
from gpuspawner.simulation import simulated_config
from hub import Hub, pid_alive, process_env
from jobnotebooks import GPU_REPORT, JOBS_CONFIG, PROFILES, holders, job, outputs_text, submit, wait_state, write

pytestmark = pytest.mark.integration

T4 = {"profile": "gpu", "gpus": 1, "gpu_model": "t4"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory, fakenvml_libdir):
    tmp = tmp_path_factory.mktemp("jobs-local")
    config_path = tmp / "gpus.json"
    fakenvml.write_config(config_path, simulated_config(a100=2, t4=2))
    hub = Hub(tmp / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES, extra_config=JOBS_CONFIG)
    hub.start()
    hub.add_users("alice", "bob", "carol")
    try:
        yield hub
    finally:
        for name in ("alice", "bob", "carol"):
            for job in hub.api("GET", f"/users/{name}/gpu-jobs").json().get("jobs", []):
                hub.api("DELETE", f"/users/{name}/gpu-jobs/{job['id']}")
        hub.close()


def home(hub: Hub, user: str):
    return hub.home(user)


def job_pid(text: str) -> int:
    return int(next(line for line in text.splitlines() if line.startswith("PID=")).split("=", 1)[1])


def test_job_runs_on_its_gpu_and_frees_it(hub):
    write(home(hub, "alice") / "work" / "report.ipynb", GPU_REPORT, parameters="seconds = 0")
    r = submit(hub, "alice", {**T4, "notebook": "work/report.ipynb", "parameters": {"seconds": 3},
                              "outputs": {"ipynb": "work/out/report-run.ipynb", "html": "work/out/report-run.html"}})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["state"] in ("starting", "running")
    assert len(created["gpus"]) == 1 and created["gpus"][0]["name"] == "Tesla T4"
    uuid = created["gpus"][0]["uuid"]
    running = wait_state(hub, "alice", created["id"], ("running",))
    # while it runs: /hub/api/gpus shows the GPU held by alice's job
    holder = holders(hub)[uuid]
    assert holder["user"] == "alice" and holder["kind"] == "job" and holder["server"] == f"job/{created['id']}"
    # ... and the job's process environment holds exactly that GPU
    pids = [p for p in hub.marked_pids() if process_env(p).get("GPUSPAWNER_SPAWN") == created["id"]]
    assert pids, "the job's process carries the hub's marks"
    for pid in pids:
        env = process_env(pid)
        assert env["CUDA_VISIBLE_DEVICES"] == uuid and env["NVIDIA_VISIBLE_DEVICES"] == uuid
    done = wait_state(hub, "alice", created["id"], ("completed", "failed"))
    assert done["state"] == "completed", done
    assert done["started"] and done["ended"] and done["exit_code"] == 0 and running["started"] == done["started"]
    text = outputs_text(home(hub, "alice") / "work" / "out" / "report-run.ipynb")
    assert f"GPUS={uuid}" in text and "slept 3" in text
    assert "slept 3" in (home(hub, "alice") / "work" / "out" / "report-run.html").read_text()
    assert "cell" in (home(hub, "alice") / "work" / "out" / "report-run.log").read_text()
    assert uuid not in holders(hub), "the GPU is free again"
    assert not pid_alive(job_pid(text))


# a notebook that starts a process which leaves its session and clears its environment, then ends
HIDE = ("import subprocess, sys\n"
        f"hidden = subprocess.run([sys.executable, '-c', {devcgroup.ESCAPER!r}], capture_output=True, text=True)\n"
        "print('HIDDEN=' + hidden.stdout.strip())")


def test_a_job_ends_with_every_process_it_started(hub):
    write(home(hub, "alice") / "hide.ipynb", HIDE)
    r = submit(hub, "alice", {**T4, "notebook": "hide.ipynb"})
    assert r.status_code == 201, r.text
    uuid = r.json()["gpus"][0]["uuid"]
    done = wait_state(hub, "alice", r.json()["id"], ("completed", "failed"))
    assert done["state"] == "completed", done
    text = outputs_text(home(hub, "alice") / "hide-output.ipynb")
    hidden = int(next(line for line in text.splitlines() if line.startswith("HIDDEN=")).split("=", 1)[1])
    assert not pid_alive(hidden), "the process the job hid outlived it"
    assert uuid not in holders(hub)


def test_failing_notebook_is_marked_failed_and_frees_gpus(hub):
    write(home(hub, "bob") / "fail.ipynb", "print('before')", "raise RuntimeError('no convergence')")
    r = submit(hub, "bob", {"profile": "gpu", "gpus": 2, "gpu_model": "a100-sxm4-80gb", "notebook": "fail.ipynb"})
    assert r.status_code == 201, r.text
    uuids = {g["uuid"] for g in r.json()["gpus"]}
    assert len(uuids) == 2
    done = wait_state(hub, "bob", r.json()["id"], ("completed", "failed"))
    assert done["state"] == "failed" and "RuntimeError: no convergence" in done["reason"]
    assert done["exit_code"] == 1
    assert "before" in outputs_text(home(hub, "bob") / "fail-output.ipynb"), "the output keeps what ran"
    assert not uuids & set(holders(hub))


def test_cancel_frees_gpus_within_seconds(hub):
    write(home(hub, "carol") / "long.ipynb", GPU_REPORT, parameters="seconds = 600")
    r = submit(hub, "carol", {**T4, "notebook": "long.ipynb"})
    assert r.status_code == 201, r.text
    job_id, uuid = r.json()["id"], r.json()["gpus"][0]["uuid"]
    wait_state(hub, "carol", job_id, ("running",))
    time.sleep(2)  # the kernel is in its sleep
    asked = time.monotonic()
    r = hub.api("DELETE", f"/users/carol/gpu-jobs/{job_id}")
    assert r.status_code == 200, r.text
    cancelled = wait_state(hub, "carol", job_id, ("cancelled",), timeout=5)
    assert time.monotonic() - asked < 5
    assert cancelled["reason"] == "cancelled"
    assert uuid not in holders(hub)
    assert not [p for p in hub.marked_pids() if process_env(p).get("GPUSPAWNER_SPAWN") == job_id]


def test_time_limit_stops_and_marks_the_job(hub):
    write(home(hub, "carol") / "slow.ipynb", GPU_REPORT, parameters="seconds = 600")
    r = submit(hub, "carol", {**T4, "notebook": "slow.ipynb", "time_limit": 6})
    assert r.status_code == 201, r.text
    done = wait_state(hub, "carol", r.json()["id"], ("timed_out", "completed", "failed", "cancelled"), timeout=60)
    assert done["state"] == "timed_out" and "time limit (6 s)" in done["reason"]
    assert r.json()["gpus"][0]["uuid"] not in holders(hub)


def test_quota_refuses_a_job_like_a_server(hub):
    write(home(hub, "alice") / "q.ipynb", GPU_REPORT, parameters="seconds = 30")
    first = submit(hub, "alice", {"profile": "gpu", "gpus": 2, "gpu_model": "any", "notebook": "q.ipynb"})
    assert first.status_code == 201, first.text
    try:
        r = submit(hub, "alice", {**T4, "notebook": "q.ipynb"})
        assert r.status_code == 409, r.text
        assert "quota" in r.json()["message"].lower()
        server = hub.spawn("alice", T4)
        assert server.status_code == 409 and r.json()["message"] == server.json()["message"]
    finally:
        hub.api("DELETE", f"/users/alice/gpu-jobs/{first.json()['id']}")
    assert len(hub.api("GET", "/users/alice/gpu-jobs").json()["jobs"]) >= 1


@pytest.mark.parametrize("body, status, field", [
    ({"profile": "nope", "notebook": "a.ipynb"}, 400, "profile"),
    ({"profile": "gpu", "gpus": 64, "notebook": "a.ipynb"}, 400, "gpus"),
    ({"profile": "gpu", "gpus": 1, "notebook": "/etc/passwd.ipynb"}, 400, "notebook"),
    ({"profile": "gpu", "gpus": 1, "notebook": "../bob/fail.ipynb"}, 400, "notebook"),
    ({"profile": "gpu", "gpus": 1, "notebook": "missing.ipynb"}, 400, "notebook"),
    ({"profile": "gpu", "gpus": 1, "notebook": "q.ipynb", "outputs": {"ipynb": "../../x.ipynb"}}, 400, "outputs"),
    ({"profile": "gpu", "gpus": 1, "notebook": "q.ipynb", "partition": "x"}, 400, "partition"),
    ({"profile": "gpu", "gpus": 1, "notebook": "q.ipynb", "time_limit": 10**9}, 400, "time_limit"),
])
def test_bad_input_is_refused_and_starts_nothing(hub, body, status, field):
    before = holders(hub)
    count = len(hub.api("GET", "/users/alice/gpu-jobs").json()["jobs"])
    r = submit(hub, "alice", body)
    assert r.status_code == status, r.text
    assert r.json()["message"].startswith(field), r.json()
    assert holders(hub) == before
    assert len(hub.api("GET", "/users/alice/gpu-jobs").json()["jobs"]) == count


def test_jobs_of_others_are_not_visible_to_a_user(hub):
    r = hub.api("POST", "/users/bob/tokens", json={"note": "jobs test"})
    assert r.status_code in (200, 201), r.text
    token = r.json()["token"]
    import requests

    own = requests.get(f"{hub.url}/hub/api/users/bob/gpu-jobs", headers={"Authorization": f"token {token}"})
    assert own.status_code == 200 and all(j["user"] == "bob" for j in own.json()["jobs"])
    other = requests.get(f"{hub.url}/hub/api/users/alice/gpu-jobs", headers={"Authorization": f"token {token}"})
    assert other.status_code == 404
    options = requests.get(f"{hub.url}/hub/api/users/bob/gpu-job-options", headers={"Authorization": f"token {token}"})
    assert options.status_code == 200
    labels = [t["label"] for t in options.json()["compute_types"]]
    assert "CPU only" in labels and "1 x Tesla T4" in labels and "2 x NVIDIA A100-SXM4-80GB" in labels


def test_queued_job_waits_then_runs_when_a_gpu_frees(hub):
    write(home(hub, "alice") / "hold.ipynb", GPU_REPORT, parameters="seconds = 600")
    write(home(hub, "carol") / "quick.ipynb", GPU_REPORT, parameters="seconds = 0")
    holding = [submit(hub, user, {**T4, "notebook": "hold.ipynb"}) for user in ("alice", "alice")]
    assert [r.status_code for r in holding] == [201, 201], [r.text for r in holding]
    try:
        queued = submit(hub, "carol", {"profile": "queued", "gpus": 1, "gpu_model": "t4", "notebook": "quick.ipynb"})
        assert queued.status_code == 201, queued.text
        assert queued.json()["state"] == "queued" and queued.json()["gpus"] == []
        time.sleep(1)
        assert job(hub, "carol", queued.json()["id"])["state"] == "queued"
        freed = holding[0].json()["gpus"][0]["uuid"]
        hub.api("DELETE", f"/users/alice/gpu-jobs/{holding[0].json()['id']}")
        done = wait_state(hub, "carol", queued.json()["id"], ("completed", "failed"), timeout=60)
        assert done["state"] == "completed" and [g["uuid"] for g in done["gpus"]] == [freed]
    finally:
        for r in holding:
            hub.api("DELETE", f"/users/alice/gpu-jobs/{r.json()['id']}")


def test_hub_crash_neither_loses_nor_reruns_jobs(hub):
    """SIGKILL the hub: a running job goes on and is watched again; one that ended meanwhile is recorded."""
    import signal

    write(home(hub, "alice") / "long.ipynb", GPU_REPORT, parameters="seconds = 12")
    write(home(hub, "bob") / "short.ipynb", GPU_REPORT, parameters="seconds = 1")
    long = submit(hub, "alice", {**T4, "notebook": "long.ipynb"}).json()
    short = submit(hub, "bob", {**T4, "notebook": "short.ipynb"}).json()
    for user, j in (("alice", long), ("bob", short)):
        wait_state(hub, user, j["id"], ("running",))
    pids_before = {p for p in hub.marked_pids() if process_env(p).get("GPUSPAWNER_SPAWN") == long["id"]}
    hub.stop(signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (home(hub, "bob") / "short-output.ipynb").exists():
        time.sleep(0.2)
    time.sleep(1)
    hub.start()
    # the short job ended while the hub was down: recorded with its outcome, its GPU free
    done = wait_state(hub, "bob", short["id"], ("completed", "failed"), timeout=30)
    assert done["state"] == "completed" and "while the hub was down" in done["reason"]
    # the long one still runs, in the same process, its GPU held by it
    still = job(hub, "alice", long["id"])
    assert still["state"] == "running" and still["started"] == job(hub, "alice", long["id"])["started"]
    held = holders(hub)
    assert held[long["gpus"][0]["uuid"]]["server"] == f"job/{long['id']}"
    assert short["gpus"][0]["uuid"] not in held
    pids_after = {p for p in hub.marked_pids() if process_env(p).get("GPUSPAWNER_SPAWN") == long["id"]}
    assert min(pids_before) in pids_after, "the same executor process runs on (not started a second time)"
    finished = wait_state(hub, "alice", long["id"], ("completed", "failed"), timeout=60)
    assert finished["state"] == "completed"
    assert outputs_text(home(hub, "alice") / "long-output.ipynb").count("slept 12") == 1
    assert long["gpus"][0]["uuid"] not in holders(hub)
    # usage: one row per job, each ended with the job's own outcome (the short one's learnt after the restart)
    rows = hub.api("GET", "/gpus/usage", params={"by": "allocation"}).json()["rows"]
    for user, j in (("alice", long), ("bob", short)):
        mine = [r for r in rows if r["owner"] == f"{user}/job/{j['id']}"]
        assert [(r["job_id"], r["end_reason"]) for r in mine] == [(j["id"], "completed")], rows


def test_a_job_whose_own_time_limit_ends_before_a_booked_window_runs_one_that_may_run_into_it_is_refused(hub):
    r = hub.api("POST", "/users/bob/tokens", json={"note": "booking"})
    assert r.status_code == 201, r.text
    as_bob = {"Authorization": f"token {r.json()['token']}"}
    start = time.time() + 300  # before the hub's job time limit (600 s) runs out
    r = requests.post(f"{hub.url}/hub/api/gpus/bookings", headers=as_bob, timeout=60,
                      json={"model": "t4", "count": 2, "start": start, "end": start + 3600})
    assert r.status_code == 201, r.text
    booking = r.json()["id"]
    try:
        write(home(hub, "carol") / "brief.ipynb", GPU_REPORT, parameters="seconds = 0")
        r = submit(hub, "carol", {**T4, "notebook": "brief.ipynb"})  # may run for the hub's 600 s: into the window
        assert r.status_code == 409, r.text
        assert "booked" in r.json()["message"] and "could run past" in r.json()["message"]
        r = submit(hub, "carol", {**T4, "notebook": "brief.ipynb", "time_limit": 60})  # ends before it
        assert r.status_code == 201, r.text
        assert wait_state(hub, "carol", r.json()["id"], ("completed", "failed"))["state"] == "completed"
    finally:
        requests.delete(f"{hub.url}/hub/api/gpus/bookings/{booking}", headers=as_bob, timeout=60)
