"""Notebook GPU jobs on gpu-slurm: Slurm batch jobs of the user, on the session's private cluster.

A real hub (gpu-slurm) submits each job with sbatch; Slurm picks its GPU
(gpu:a100:2,gpu:t4:2, each job confined to its GPUs' device files) and runs the
real executor in the user's home. The notebook reports which of the node's
device files it may open (the others are refused by the job's device cgroup),
so the test compares what the job really held with what Slurm says it gave
(``scontrol show job -d``).
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from hub import Hub
from jobnotebooks import job, outputs_text, wait_state, write
from slurmhub import add_user, job_gpus, running_hub

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

JOBS_CONFIG = """
from gpuspawner.hub.setup import configure
c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]
c.GPUSpawnerMixin.gpu_quota_per_user = 2
configure(c)
"""
T4 = {"profile": "gpu", "gpus": 1, "gpu_model": "t4"}

# the job's GPUs as CUDA sees them, and which of the node's GPU device files (`devices`, in
# gres.conf order) it may open: EPERM is the job's device cgroup refusing one, ENXIO (no driver) passes
DEVICE_REPORT = (
    "import errno, os, time\n"
    "print('GPUS=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''))\n"
    "opens = []\n"
    "for i, path in enumerate(devices.split(',')):\n"
    "    try:\n"
    "        os.close(os.open(path, os.O_RDWR))\n"
    "        opens.append(i)\n"
    "    except OSError as e:\n"
    "        if e.errno != errno.EPERM:\n"
    "            opens.append(i)\n"
    "print('OPENS=' + ','.join(map(str, opens)))\n"
    "time.sleep(seconds)\n"
    "print('slept', seconds)"
)


@pytest.fixture(scope="module")
def jobs_hub(slurm_cluster, slurm_gpus, tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("slurm-jobs") / "hub", slurm_cluster, slurm_gpus, JOBS_CONFIG) as hub:
        for name in ("alice", "bob", "carol", "dave"):
            add_user(hub, name)
        yield hub


def home(hub: Hub, user: str):
    return hub.dir / "users" / user


def report(hub: Hub, cluster, user: str, name: str = "report.ipynb") -> dict:
    """Write the device report notebook into ``user``'s home; the parameters it needs."""
    write(home(hub, user) / name, DEVICE_REPORT, parameters="seconds = 0\ndevices = ''")
    return {"devices": ",".join(str(p) for p in cluster.device_nodes())}


def submit(hub: Hub, user: str, body: dict) -> dict:
    r = hub.api("POST", f"/users/{user}/gpu-jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()




def slurm_jobs(cluster) -> dict[str, dict]:
    """Every job squeue lists (ended ones too, for MinJobAge): id -> state, name, comment, time limit."""
    out = {}
    for line in cluster.run("squeue", "-h", "-t", "all", "-o", "%i|%T|%l|%j|%k").stdout.splitlines():
        slurm_id, state, limit, name, comment = line.split("|", 4)
        out[slurm_id] = {"state": state, "time": limit, "name": name, "comment": comment}
    return out


def slurm_job_of(hub: Hub, cluster, user: str, job_id: str) -> tuple[str, dict]:
    """The Slurm job that runs the hub's job ``job_id``: found by the marks on it."""
    found = [(i, j) for i, j in slurm_jobs(cluster).items() if f"server:job/{job_id}" in j["comment"]]
    assert len(found) == 1, (job_id, slurm_jobs(cluster))
    return found[0]


def test_job_runs_on_the_gpu_slurm_gave_it(jobs_hub, slurm_cluster):
    hub = jobs_hub
    params = report(hub, slurm_cluster, "alice")
    created = submit(hub, "alice", {**T4, "notebook": "report.ipynb", "parameters": {**params, "seconds": 4},
                                    "time_limit": 600, "outputs": {"ipynb": "out/report-run.ipynb"}})
    running = wait_state(hub, "alice", created["id"], ("running",))
    slurm_id, slurm_job = slurm_job_of(hub, slurm_cluster, "alice", created["id"])
    hub_id = hub.settings["hub_id"]
    # marked as this hub's job alice/job/<id>, the way gpu-slurm marks servers; --time is the job's 10 min
    assert slurm_job["comment"] == f"jupyterhub:{hub_id} user:alice server:job/{created['id']}"
    assert slurm_job["name"] == f"jupyterhub-{hub_id}-alice-job/{created['id']}"
    assert slurm_job["state"] == "RUNNING" and slurm_job["time"] == "10:00"
    given = job_gpus(slurm_cluster, slurm_id)
    assert len(given) == 1 and slurm_cluster.models()[given[0]] == "t4"
    done = wait_state(hub, "alice", created["id"], ("completed", "failed", "cancelled", "timed_out"))
    assert done["state"] == "completed" and done["exit_code"] == 0, done
    assert done["started"] == running["started"] and done["ended"]
    text = outputs_text(home(hub, "alice") / "out" / "report-run.ipynb")
    # the notebook held exactly the GPU Slurm gave it; CUDA numbers it 0 (the only one it may open)
    assert "GPUS=0\n" in text and f"OPENS={given[0]}\n" in text and "slept 4" in text
    assert "cell" in (home(hub, "alice") / "out" / "report-run.log").read_text()
    assert slurm_jobs(slurm_cluster)[slurm_id]["state"] == "COMPLETED"


def test_failing_notebook_is_marked_failed(jobs_hub, slurm_cluster):
    hub = jobs_hub
    write(home(hub, "bob") / "fail.ipynb", "print('before')", "raise RuntimeError('no convergence')")
    created = submit(hub, "bob", {"profile": "gpu", "gpus": 2, "gpu_model": "a100", "notebook": "fail.ipynb"})
    done = wait_state(hub, "bob", created["id"], ("completed", "failed", "cancelled", "timed_out"))
    assert done["state"] == "failed" and "RuntimeError: no convergence" in done["reason"], done
    assert done["exit_code"] == 1
    assert "before" in outputs_text(home(hub, "bob") / "fail-output.ipynb")
    slurm_id, slurm_job = slurm_job_of(hub, slurm_cluster, "bob", created["id"])
    assert slurm_job["state"] == "FAILED"


def test_pending_job_is_queued_with_slurms_reason_and_cancel_scancels(jobs_hub, slurm_cluster):
    hub = jobs_hub
    long = {**T4, "notebook": "report.ipynb"}
    holders = []
    for user in ("carol", "dave"):  # both T4s
        params = report(hub, slurm_cluster, user)
        holders.append((user, submit(hub, user, {**long, "parameters": {**params, "seconds": 600}})))
    for user, held in holders:
        wait_state(hub, user, held["id"], ("running",))
    params = report(hub, slurm_cluster, "alice")
    waiting = submit(hub, "alice", {**long, "parameters": {**params, "seconds": 0}})
    queued = wait_state(hub, "alice", waiting["id"], ("queued",), timeout=30)
    assert queued["reason"].startswith("Waiting in Slurm's queue (job "), queued
    # once Slurm's scheduler has looked at it, its reason in words: the T4s are taken
    deadline = time.monotonic() + 30
    while not any(words in queued["reason"] for words in ("the GPUs it needs are in use",
                                                           "higher priority are ahead of it")):
        assert time.monotonic() < deadline and queued["state"] == "queued", queued
        time.sleep(0.5)
        queued = job(hub, "alice", waiting["id"])
    # and our estimate beside Slurm's: the T4s' holders must give them back by their time limits
    assert re.search(r"\. Our estimate: About \d\d:\d\d UTC\. .*every holder must give its GPUs back by a known "
                     r"time", queued["reason"]), queued
    slurm_waiting, _ = slurm_job_of(hub, slurm_cluster, "alice", waiting["id"])
    assert slurm_jobs(slurm_cluster)[slurm_waiting]["state"] == "PENDING"

    # cancel: the pending one and a running one; each is scancel'd and marked cancelled
    user, held = holders[0]
    slurm_running, _ = slurm_job_of(hub, slurm_cluster, user, held["id"])
    for owner, target, slurm_id in (("alice", waiting, slurm_waiting), (user, held, slurm_running)):
        r = hub.api("DELETE", f"/users/{owner}/gpu-jobs/{target['id']}")
        assert r.status_code == 200, r.text
        cancelled = wait_state(hub, owner, target["id"], ("cancelled", "completed", "failed"), timeout=30)
        assert cancelled["state"] == "cancelled" and cancelled["reason"] == "cancelled", cancelled
        assert slurm_jobs(slurm_cluster)[slurm_id]["state"] == "CANCELLED"
    hub.api("DELETE", f"/users/{holders[1][0]}/gpu-jobs/{holders[1][1]['id']}")


def test_hub_restart_does_not_cancel_a_running_job_and_watches_it_again(jobs_hub, slurm_cluster):
    hub = jobs_hub
    params = report(hub, slurm_cluster, "alice", "long.ipynb")
    # long enough to outlast the hub's restart on a loaded machine (15 s did not, under CI's load)
    created = submit(hub, "alice", {**T4, "notebook": "long.ipynb", "parameters": {**params, "seconds": 40}})
    running = wait_state(hub, "alice", created["id"], ("running",))
    slurm_id, _ = slurm_job_of(hub, slurm_cluster, "alice", created["id"])
    hub.stop(signal.SIGKILL)
    hub.start()
    # the restarted hub reconciled this hub's Slurm jobs: the job's is neither cancelled nor resubmitted
    again = job(hub, "alice", created["id"])
    assert again["state"] == "running" and again["started"] == running["started"], again
    assert slurm_jobs(slurm_cluster)[slurm_id]["state"] == "RUNNING"
    assert [i for i, j in slurm_jobs(slurm_cluster).items() if f"server:job/{created['id']}" in j["comment"]] == [
        slurm_id]
    # ... and counts its GPU toward alice's quota (2): two more are refused as for a server
    r = hub.api("POST", "/users/alice/gpu-jobs", json={"profile": "gpu", "gpus": 2, "gpu_model": "a100",
                                                        "notebook": "long.ipynb"})
    assert r.status_code == 409 and "quota" in r.json()["message"].lower(), r.text
    # watched again: the restarted hub records its end
    done = wait_state(hub, "alice", created["id"], ("completed", "failed", "cancelled", "timed_out"), timeout=120)
    assert done["state"] == "completed" and done["started"] == running["started"], done
    assert outputs_text(home(hub, "alice") / "long-output.ipynb").count("slept 40") == 1
    assert "cancelling Slurm job" not in hub.log_path.read_text(errors="replace")


def test_time_limit_stops_the_slurm_job_and_marks_it(jobs_hub, slurm_cluster):
    hub = jobs_hub
    params = report(hub, slurm_cluster, "dave", "slow.ipynb")
    created = submit(hub, "dave", {**T4, "notebook": "slow.ipynb", "parameters": {**params, "seconds": 600},
                                   "time_limit": 5})
    done = wait_state(hub, "dave", created["id"], ("completed", "failed", "cancelled", "timed_out"), timeout=60)
    assert done["state"] == "timed_out" and "time limit (5 s)" in done["reason"], done
    _slurm_id, slurm_job = slurm_job_of(hub, slurm_cluster, "dave", created["id"])
    # Slurm had the job's limit too (rounded up to its whole minute); the hub's scancel came first
    assert slurm_job["time"] == "1:00" and slurm_job["state"] == "CANCELLED"


def test_compute_types_are_slurms_gpus_with_live_free_counts(jobs_hub, slurm_cluster):
    hub = jobs_hub
    params = report(hub, slurm_cluster, "dave", "hold.ipynb")
    held = submit(hub, "dave", {**T4, "notebook": "hold.ipynb", "parameters": {**params, "seconds": 600}})
    try:
        wait_state(hub, "dave", held["id"], ("running",))

        def options() -> dict:
            r = hub.api("GET", "/users/dave/gpu-job-options")
            assert r.status_code == 200, r.text
            return {t["label"]: t for t in r.json()["compute_types"]}

        # the hub reads sinfo at most every 5 s: within that, the free count follows Slurm's
        deadline = time.monotonic() + 30
        while (types := options())["1 x T4 (gpu:t4)"]["free"] != 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert types["CPU only"]["gpus"] == 0
        t4 = types["1 x T4 (gpu:t4)"]
        assert (t4["gpu_model"], t4["free"], t4["total"], t4["fits_now"]) == ("t4", 1, 2, True), t4
        assert types["2 x T4 (gpu:t4)"]["fits_now"] is False  # one of the node's two T4s is dave's
        assert "4 x A100 (gpu:a100)" not in types, "no node has 4 A100s: never offered"
    finally:
        hub.api("DELETE", f"/users/dave/gpu-jobs/{held['id']}")
