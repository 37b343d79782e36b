"""Bookings as Slurm advance reservations (gpuspawner/backends/slurm/reservations.py): what a booking
holds, the commands, and the reservations on the session's real slurmctld 22.05."""

from __future__ import annotations

import time

import pytest

from gpuspawner.backends.slurm.capacity import SlurmNode
from gpuspawner.backends.slurm.queue import read_jobs
from gpuspawner.backends.slurm.reservations import (
    Reservation,
    ReservationError,
    SlurmReservations,
    active_for,
    create_args,
    holds,
    plan,
    read_reservations,
)
from gpuspawner.bookings import Booking

WEEK = 7 * 24 * 3600


def booking(id: str, model: str, count: int, start: float, end: float, **more) -> Booking:
    return Booking(id=id, model=model, count=count, start=start, end=end, booked_by="admin", **more)


TWO_NODES = [SlurmNode("gpu-1", ("gpu",), "idle", gpus={"a100": 4}),
             SlurmNode("gpu-2", ("gpu",), "idle", gpus={"a100": 4}),
             SlurmNode("t4-1", ("gpu",), "idle", gpus={"t4": 2})]
DEBIAN, NEWER = (22, 5), (23, 11)


def test_a_booking_of_whole_nodes_on_slurm_22_05_reserves_those_nodes_for_the_user():
    b = booking("b-1a2b3c", "a100", 4, 1_900_000_000, 1_900_007_200, user="ada")
    [r] = plan(b, "hub1", TWO_NODES, DEBIAN, account="ada-site")
    assert (r.name, r.nodes, r.users, r.tres) == ("hub1-b-1a2b3c-0", ("gpu-1",), ("ada-site",), "")
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r.start))
    assert create_args(r)[3:] == ["ReservationName=hub1-b-1a2b3c-0", f"StartTime={start}", "Duration=120",
                                  "Users=ada-site", "Nodes=gpu-1"]
    assert holds(b, TWO_NODES, DEBIAN) == ("On this Slurm cluster a booking of 4 a100 GPUs holds whole node gpu-1 "
                                           "(4 GPUs).")
    eight = booking("b-2", "a100", 8, 1_900_000_000, 1_900_003_600, group="class-ml")
    assert plan(eight, "hub1", TWO_NODES, DEBIAN)[0].nodes == ("gpu-1", "gpu-2")
    assert "Groups=class-ml" in create_args(plan(eight, "hub1", TWO_NODES, DEBIAN)[0])


def test_less_than_a_node_on_slurm_22_05_is_refused_with_the_counts_that_can_be_booked():
    b = booking("b-3", "a100", 2, 1_900_000_000, 1_900_003_600, user="ada")
    with pytest.raises(ReservationError) as refused:
        plan(b, "hub1", TWO_NODES, DEBIAN)
    assert str(refused.value) == ("This Slurm cluster (Slurm 22.05) reserves whole nodes only, and no set of whole "
                                  "a100 nodes has exactly 2 GPUs: book 4 or 8 GPUs instead.")
    with pytest.raises(ReservationError, match="no node with h100 GPUs"):
        holds(booking("b-4", "h100", 1, 0, 1, user="ada"), TWO_NODES, DEBIAN)


def test_slurm_23_11_reserves_gpus_and_a_weekly_booking_one_reservation_per_window():
    b = booking("b-5", "a100", 2, 1_900_000_000, 1_900_003_600, user="ada", repeat_weeks=3)
    made = plan(b, "hub1", TWO_NODES, NEWER)
    assert [(r.name, r.start - b.start, r.tres, r.nodes) for r in made] == [
        (f"hub1-b-5-{n}", n * WEEK, "gres/gpu:a100=2", ()) for n in range(3)]
    assert "TRES=gres/gpu:a100=2" in create_args(made[0])
    assert holds(b, TWO_NODES, NEWER) == "On this Slurm cluster a booking of 2 a100 GPUs holds 2 GPUs."
    assert plan(booking("b-6", "any", 1, 0, 60, user="ada"), "hub1", TWO_NODES, NEWER)[0].tres == "gres/gpu=1"


def test_a_window_already_begun_starts_now_and_keeps_its_end():
    r = Reservation("hub1-b-7-0", 1000.0, 1000.0 + 3600, ("ada",))
    assert create_args(r, now=1600.0)[4:6] == ["StartTime=now", "Duration=50"]


def test_the_reservation_a_job_runs_in_is_the_users_or_groups_during_its_window():
    mine = Reservation("hub1-b-1-0", 100, 200, users=("ada",))
    group = Reservation("hub1-b-2-0", 150, 300, groups=("class-ml",))
    assert active_for([mine, group], "ada", [], 120) == "hub1-b-1-0"
    assert active_for([mine, group], "bob", ["class-ml"], 160) == "hub1-b-2-0"
    assert active_for([mine, group], "bob", [], 160) is None
    assert active_for([mine], "ada", [], 200) is None  # its window is over


def test_scontrol_show_reservation_lines_are_read_and_none_reads_as_none():
    line = ("ReservationName=hub1-b-1-0 StartTime=2030-03-12T10:00:00 EndTime=2030-03-12T12:00:00 Duration=02:00:00 "
            "Nodes=gpu-1 NodeCnt=1 CoreCnt=8 Features=(null) PartitionName=(null) Flags=SPEC_NODES "
            "TRES=cpu=8 Users=ada Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) "
            "Watts=n/a MaxStartDelay=(null)")
    [r] = read_reservations(line + "\n")
    assert (r.name, r.end - r.start, r.nodes, r.users, r.groups, r.state) == (
        "hub1-b-1-0", 7200, ("gpu-1",), ("ada",), (), "INACTIVE")
    assert r.booking_id("hub1") == "b-1" and r.booking_id("hub2") is None
    assert read_reservations("No reservations in the system\n") == ()
    with pytest.raises(ValueError):
        read_reservations("slurm_load_reservations error: Unable to contact slurm controller")


def _job(cluster, job_id: str):
    return next(j for j in read_jobs(cluster.run("squeue", "--json").stdout) if j.id == job_id)


def _wait_for(cluster, job_id: str, state: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = _job(cluster, job_id)
        if job.state == state:
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} is {job.state} ({job.reason}), not {state}")


def test_a_booking_is_a_reservation_that_holds_the_node_for_its_user_until_deleted(slurm_cluster):
    """On Debian's Slurm 22.05: the booking of the node's 2 A100s holds the whole node; the booked user's
    job runs in it, another user's waits with Slurm's reason, and deleting the booking frees the node."""
    cluster = slurm_cluster
    slurm = SlurmReservations("hubtest", env=cluster.env, accounts={"ada": "root"}.get)
    assert slurm.reservations() == ()
    now = time.time()
    with pytest.raises(ReservationError, match="book 2 GPUs instead"):
        slurm.reserve(booking("b-one", "a100", 1, now, now + 600, user="ada"))
    held = booking("b-9f8e7d", "a100", 2, now, now + 600, user="ada")
    assert slurm.holds(held) == (f"On this Slurm cluster a booking of 2 a100 GPUs holds whole node {cluster.host} "
                                    "(2 GPUs).")
    jobs = []
    try:
        slurm.reserve(held)
        [listed] = slurm.reservations()
        assert (listed.name, listed.users, listed.nodes, listed.state) == (
            "hubtest-b-9f8e7d-0", ("root",), (cluster.host,), "ACTIVE")
        assert active_for(slurm.reservations(), "root", [], time.time()) == listed.name
        # a second booking of the same GPUs then finds the node reserved, and says so
        with pytest.raises(ReservationError) as taken:
            slurm.reserve(booking("b-later", "a100", 2, now + 300, now + 900, user="ada"))
        assert str(taken.value) == ("Every a100 node of this Slurm cluster is already reserved then "
                                    "(hubtest-b-9f8e7d-0): pick another time.")
        other = cluster.run("sbatch", "--parsable", "--uid=nobody", "--gres=gpu:t4:1", "--output=/dev/null",
                            "--chdir=/tmp", "--wrap=sleep 60").stdout.strip()
        jobs.append(other)
        booked = cluster.run("sbatch", "--parsable", f"--reservation={listed.name}", "--gres=gpu:a100:2",
                             "--output=/dev/null", "--wrap=sleep 60").stdout.strip()
        jobs.append(booked)
        _wait_for(cluster, booked, "RUNNING")
        time.sleep(2)  # two more scheduler passes: the other user's job still waits
        waiting = _job(cluster, other)
        assert waiting.state == "PENDING" and waiting.reason in ("ReqNodeNotAvail, Reserved for maintenance",
                                                                 "Resources", "ReqNodeNotAvail")
        assert slurm.unreserve(held.id) == 1
        assert slurm.reservations() == ()
        _wait_for(cluster, other, "RUNNING")
    finally:
        slurm.unreserve(held.id)
        for job in jobs:
            cluster.run("scancel", job, check=False)
