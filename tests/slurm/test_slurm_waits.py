"""gpu-slurm's waits on a real JupyterHub and the session's real Slurm cluster (issue 30): Slurm's start
estimate and ours in a pending server's progress and in ``/hub/api/gpus``; a booked user's server job
runs in the booking's Slurm reservation. The pure parts on made-up Slurm states."""

from __future__ import annotations

import re
import time

import pytest

from gpuspawner.backends.slurm.capacity import SlurmNode
from gpuspawner.backends.slurm.estimates import our_estimate, slurm_start, wait_fields
from gpuspawner.backends.slurm.queue import SlurmJob, read_jobs
from gpuspawner.backends.slurm.reservations import Reservation, create_args
from gpuspawner.estimate import History
from slurmhub import ONE_A100, OVERVIEW_CONFIG, add_user, job_id, running_hub
from test_slurm_hub import progress_until
from test_slurm_parsing import recorded

NOW = 1_900_000_000.0
NODE = SlurmNode("gpu-1", ("gpu",), "mixed", gpus={"a100": 2, "t4": 2}, used={"a100": 2})


def running(job_id: str, gpus: str, started: float, limit: int | None) -> SlurmJob:
    return SlurmJob(job_id, "RUNNING", "None", "gpu", gpus=gpus, start_time=int(started), nodes="gpu-1",
                    time_limit=limit)


def pending(job_id: str, gpus: str, submitted: int) -> SlurmJob:
    return SlurmJob(job_id, "PENDING", "Resources", "gpu", gpus=gpus, submit_time=submitted)


def test_ours_rests_on_the_running_jobs_time_limits_and_the_jobs_ahead():
    jobs = [running("1", "gres:gpu:a100:1", NOW - 600, 1800), running("2", "gres:gpu:a100:1", NOW - 60, 3600),
            pending("3", "gres:gpu:a100:1", 10), pending("4", "gres:gpu:a100:2", 20)]
    first = our_estimate(jobs[2], jobs, [NODE], NOW)
    assert first.likely == NOW + 1200  # job 1 reaches its time limit
    assert "every holder must give its GPUs back by a known time" in first.basis
    # job 4 needs both A100s, after job 3 (ahead of it) has started and ended: with no history nothing
    # says how long job 3 will hold its GPU (the estimator does not take a pending job's own time limit)
    behind = our_estimate(jobs[3], jobs, [NODE], NOW)
    assert behind.likely is None and "1 request ahead of yours" in behind.basis
    # the T4s are free: a T4 job would start now; nothing about the A100s' holders holds it back
    assert our_estimate(pending("5", "gres:gpu:t4:1", 30), jobs, [NODE], NOW).likely == NOW
    # with the hub's usage history, holders likely end before their time limits
    history = History([("", "", 900.0)] * 20)
    assert our_estimate(jobs[2], jobs, [NODE], NOW, history).likely == NOW + 300


def test_without_time_limits_slurms_year_ahead_placeholder_is_no_start_and_ours_says_so():
    jobs = [running("1", "gres:gpu:a100:2", NOW - 600, None), pending("3", "gres:gpu:a100:1", 10)]
    placeholder = SlurmJob("3", "PENDING", "Resources", "gpu", gpus="gres:gpu:a100:1",
                           start_time=int(NOW + 365 * 24 * 3600))
    fields = wait_fields(placeholder, jobs, [NODE], NOW)
    assert fields["slurm_start"] is None and fields["estimate"]["likely"] is None
    assert fields["estimate"]["sentence"].startswith("No start time can be given yet. ")
    assert "no holder of these GPUs has a time limit" in fields["estimate"]["sentence"]
    assert slurm_start(SlurmJob("3", "PENDING", "Resources", "gpu", start_time=int(NOW + 600)), NOW) == NOW + 600


def test_squeue_time_limits_are_read_and_unlimited_is_none():
    """Recorded from slurmctld 22.05: a job without ``--time`` in a MaxTime=INFINITE partition lists 525600."""
    limits = {job.time_limit for job in read_jobs(recorded("squeue-one-pending.json"))}
    assert limits == {None}
    newer = {"jobs": [{"job_id": 1, "job_state": "RUNNING", "time_limit": {"set": True, "infinite": False,
                                                                            "number": 30}},
                      {"job_id": 2, "job_state": "RUNNING", "time_limit": {"set": True, "infinite": True,
                                                                            "number": 0}}]}
    assert [job.time_limit for job in read_jobs(newer)] == [1800, None]


@pytest.fixture(scope="module")
def hub(slurm_cluster, slurm_gpus, tmp_path_factory):
    # reconciled once, at its start, and not again while the tests run: the booked-user test makes a reservation
    # named as one of this hub's bookings would be, by hand, which the hub's reconciliation would rightly remove
    # (no live booking holds it), sometimes before the job it is for was submitted into it
    config = OVERVIEW_CONFIG + "c.GPUSpawnerMixin.gpu_reconcile_interval = 3600\n"
    with running_hub(tmp_path_factory.mktemp("slurm-waits"), slurm_cluster, slurm_gpus, config) as hub:
        yield hub


def _wait_running(cluster, job: str) -> SlurmJob:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = next((j for j in read_jobs(cluster.run("squeue", "--json").stdout) if j.id == job), None)
        if found is not None and found.state == "RUNNING":
            return found
        time.sleep(0.3)
    raise AssertionError(f"job {job} did not start: {cluster.jobs()}")


@pytest.mark.integration
@pytest.mark.slurm
def test_a_pending_server_shows_slurms_start_and_ours_in_progress_and_in_rest(hub, slurm_cluster):
    cluster = slurm_cluster
    add_user(hub, "erin")
    # both A100s held by a job with a 10-minute time limit: Slurm's backfill plan and ours rest on it
    blocker = cluster.run("sbatch", "--parsable", "--time=10", "--gres=gpu:a100:2", "--output=/dev/null",
                          "--wrap=sleep 600").stdout.strip()
    try:
        started = _wait_running(cluster, blocker).start_time
        assert hub.spawn("erin", ONE_A100).status_code == 202
        message = progress_until(hub, "erin", r"Our estimate")
        assert re.search(r"Slurm expects it to start in about (9|10) minutes \(\d\d:\d\d\)\. Our estimate: About "
                         r"\d\d:\d\d UTC\. .*every holder must give its GPUs back by a known time", message), message
        entry = next(e for e in hub.api("GET", "/gpus").json()["cluster"] if e["owner"] == "erin/")
        assert entry["slurm_job"] == job_id(hub, "erin") and entry["slurm_reason"] == "Resources"
        assert entry["slurm_start"] == pytest.approx(started + 600, abs=60)
        assert entry["estimate"]["likely"] == pytest.approx(started + 600, abs=1)
        assert entry["estimate"]["sentence"] in message
    finally:
        cluster.run("scancel", blocker, check=False)
        hub.stop_server("erin")


@pytest.mark.integration
@pytest.mark.slurm
def test_a_booked_users_server_job_runs_in_the_bookings_reservation(hub, slurm_cluster):
    cluster = slurm_cluster
    add_user(hub, "nobody")  # a system account, as a reservation's Users= must be
    # the hub's jobs run as root here (exec_prefix ""): the reservation names root beside the booked account
    name = "jupyterhub-jupyterhub-b-hub1-0"
    now = time.time()
    made = cluster.run(*create_args(Reservation(name, now, now + 600, ("nobody", "root"), nodes=(cluster.host,)),
                                    now), check=False)
    assert made.returncode == 0, made.stderr
    try:
        assert hub.spawn("nobody", ONE_A100).status_code in (201, 202)
        hub.wait_ready("nobody", timeout=120)
        shown = cluster.run("scontrol", "show", "job", job_id(hub, "nobody")).stdout
        assert f"Reservation={name}" in shown, shown
    finally:
        hub.stop_server("nobody")
        cluster.run("scontrol", "delete", f"ReservationName={name}", check=False)
