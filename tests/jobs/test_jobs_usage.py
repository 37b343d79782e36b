"""Usage accounting of notebook GPU jobs on a real hub where no server ever spawns and no page is read.

The jobs run the real executor on gpu-local with the stand-in NVML; their usage
rows are read once, at the end, through ``/hub/api/gpus/usage`` as an admin
tool would: each job's row must hold its GPUs for its own wall time (from the
job API's ``created`` to ``ended``), end with the job's own outcome, and name
the job by its id.
"""

from __future__ import annotations

import re
from datetime import datetime

import pytest

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import Hub, login
from jobnotebooks import GPU_REPORT, JOBS_CONFIG, PROFILES, submit, wait_state, write

pytestmark = pytest.mark.integration

T4 = {"profile": "gpu", "gpus": 1, "gpu_model": "t4"}
A100S = {"profile": "gpu", "gpus": 2, "gpu_model": "a100-sxm4-80gb"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory, fakenvml_libdir):
    tmp = tmp_path_factory.mktemp("jobs-usage")
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


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def started_job(hub: Hub, user: str, body: dict, cells: tuple[str, ...], seconds: float) -> dict:
    name = f"{user}-{len(cells)}-{int(seconds)}.ipynb"
    write(hub.home(user) / name, *cells, parameters=f"seconds = {seconds}")
    r = submit(hub, user, {**body, "notebook": name})
    assert r.status_code == 201, r.text
    return r.json()


def test_each_job_is_recorded_for_its_wall_time_with_its_outcome_and_id(hub):
    # completed (2 GPUs) and failed at once, then cancelled and timed out: every GPU of the hub used
    completed = started_job(hub, "alice", A100S, (GPU_REPORT,), 3)
    failed = started_job(hub, "bob", T4, ("import time; time.sleep(seconds)", "raise RuntimeError('diverged')"), 1)
    cancelled = started_job(hub, "carol", T4, (GPU_REPORT,), 600)
    wait_state(hub, "carol", cancelled["id"], ("running",))
    r = hub.api("DELETE", f"/users/carol/gpu-jobs/{cancelled['id']}")
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    ends = {
        "completed": wait_state(hub, "alice", completed["id"], ("completed", "failed")),
        "failed": wait_state(hub, "bob", failed["id"], ("completed", "failed")),
        "cancelled": r.json(),
    }
    timed = started_job(hub, "bob", {**T4, "time_limit": 3}, (GPU_REPORT,), 600)
    ends["timed_out"] = wait_state(hub, "bob", timed["id"], ("timed_out", "completed", "failed"), timeout=60)
    assert {state: job["state"] for state, job in ends.items()} == {s: s for s in ends}

    # read once, now: the first time anything asks for usage
    r = hub.api("GET", "/gpus/usage", params={"by": "allocation"})
    assert r.status_code == 200, r.text
    rows = {row["job_id"]: row for row in r.json()["rows"] if row["kind"] == "job"}
    assert len(rows) == 4, r.json()["rows"]
    for state, job in ends.items():
        row = rows[job["id"]]
        assert row["owner"] == f"{job['user']}/job/{job['id']}" and row["user"] == job["user"]
        assert row["end_reason"] == state, (state, row)
        assert row["gpu_count"] == job["gpu_count"] and sorted(row["uuids"]) == sorted(g["uuid"] for g in job["gpus"])
        wall = epoch(job["ended"]) - epoch(job["created"])
        recorded = row["gpu_hours"] * 3600
        assert abs(recorded - wall * job["gpu_count"]) <= max(0.02 * wall * job["gpu_count"], 1.0), (state, wall, row)
    assert rows[completed["id"]]["gpu_hours"] * 3600 >= 2 * 3, "the notebook slept 3 s on 2 GPUs"
    # the same rows, per user
    by_user = {row["key"]: row for row in hub.api("GET", "/gpus/usage").json()["rows"]}
    assert by_user["alice"]["allocations"] == 1 and by_user["bob"]["allocations"] == 2

    # bob's own usage page: his two jobs, named by their ids, and how each ended, in words; nobody else's
    page = login(hub, "bob").get(hub.url + "/hub/gpus/usage", timeout=30).text
    shown = dict(re.findall(r'<tr data-owner="bob/job/([0-9a-f]+)" data-end-reason="[^"]*">\s*<td>job \1</td>'
                            r'.*?<td data-field="how"[^>]*>([^<]*)</td>', page, re.S))
    assert shown == {failed["id"]: "Failed", timed["id"]: "Timed out"}, page
    assert "alice" not in page and "carol" not in page


def test_a_job_may_carry_its_id_once(hub):
    write(hub.home("alice") / "quick.ipynb", "print('hi')")
    job_id = "0123456789abcdef0123456789abcdef"
    r = submit(hub, "alice", {"profile": "cpu", "gpus": 0, "notebook": "quick.ipynb", "id": job_id})
    assert r.status_code == 201 and r.json()["id"] == job_id, r.text
    again = submit(hub, "alice", {**T4, "notebook": "quick.ipynb", "id": job_id})
    assert again.status_code == 409 and again.json()["message"].startswith("id:"), again.text
    other = submit(hub, "bob", {**T4, "notebook": "quick.ipynb", "id": job_id})
    assert other.status_code in (400, 409), other.text  # bob has no such notebook, and the id is taken
    for bad in ("0123", "0123456789ABCDEF0123456789ABCDEF", 42, "../" + job_id[3:]):
        r = submit(hub, "alice", {**T4, "notebook": "quick.ipynb", "id": bad})
        assert r.status_code == 400 and r.json()["message"].startswith("id"), r.text
    assert wait_state(hub, "alice", job_id, ("completed", "failed"))["state"] == "completed"
    assert not [g for g in hub.api("GET", "/gpus").json()["gpus"] if g.get("holder")]
