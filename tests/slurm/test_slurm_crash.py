"""gpu-slurm survives a hub SIGKILL while jobs are being submitted.

A real hub on the private cluster (gpu:a100:2,gpu:t4:2) gets a burst of
concurrent GPU requests, more GPUs than the node has, and is killed (SIGKILL,
no cleanup) a moment later, then started again on the same database. What
Slurm itself reports must hold afterwards: no GPU is in two running jobs
(``scontrol show job -d``), and every job left belongs to a server the hub
lists, with that job's id in its state (the others were cancelled).
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time

import pytest
import requests

from hub import Hub
from slurmhub import add_user, running_hub

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

REQUESTS = [
    {"profile": "gpu", "gpus": 1, "gpu_model": "a100"},
    {"profile": "gpu", "gpus": 1, "gpu_model": "t4"},
    {"profile": "gpu", "gpus": 2, "gpu_model": "any"},
    {"profile": "gpu", "gpus": 1, "gpu_model": "any"},
    {"profile": "gpu", "gpus": 2, "gpu_model": "a100"},
    {"profile": "gpu", "gpus": 1, "gpu_model": "t4"},
]
USERS = [f"storm{i}" for i in range(len(REQUESTS))]


@pytest.fixture
def crash_hub(slurm_cluster, slurm_gpus, tmp_path):
    # its own hub id: the jobs it owns, adopts or cancels are its own
    with running_hub(tmp_path / "hub", slurm_cluster, slurm_gpus,
                     'c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]\n') as hub:
        yield hub


def jobs(cluster) -> dict[str, dict]:
    """Every job Slurm lists: id -> state, comment and the node's GPUs it holds (gres.conf order)."""
    out = {}
    for line in cluster.run("squeue", "-h", "-o", "%i|%T|%k").stdout.splitlines():
        job, state, comment = line.split("|", 2)
        detail = cluster.run("scontrol", "show", "job", "-d", job, check=False).stdout
        gpus = []
        for found in re.findall(r"GRES=\S*\(IDX:([0-9,-]+)\)", detail):
            for part in found.split(","):
                first, _, last = part.partition("-")
                gpus += range(int(first), int(last or first) + 1)
        out[job] = {"state": state, "comment": comment, "gpus": gpus}
    return out


def owners(hub: Hub) -> dict[str, str]:
    """job id -> user of each server the hub's REST API lists (its job id from the server's state)."""
    found = {}
    for user in hub.api("GET", "/users").json():
        for server in user["servers"].values():
            job = server.get("state", {}).get("job_id")
            if job:
                found[str(job)] = user["name"]
    return found


def pending(hub: Hub) -> list[str]:
    return [u["name"] for u in hub.api("GET", "/users").json()
            if any(s.get("pending") for s in u["servers"].values())]


def test_hub_killed_while_submitting_leaves_no_shared_gpu_and_no_unowned_job(crash_hub, slurm_cluster):
    hub = crash_hub
    for name in USERS:
        add_user(hub, name)
    results: dict[str, object] = {}

    def spawn(name: str, options: dict) -> None:
        try:
            results[name] = hub.spawn(name, options).status_code
        except requests.RequestException as e:  # the hub was killed under it
            results[name] = type(e).__name__

    threads = [threading.Thread(target=spawn, args=(n, o), daemon=True) for n, o in zip(USERS, REQUESTS, strict=True)]
    for thread in threads:
        thread.start()
    delay = random.uniform(0.3, 1.0)
    time.sleep(delay)
    hub.stop(signal.SIGKILL)
    for thread in threads:
        thread.join(30)
    submitted = jobs(slurm_cluster)
    print(f"killed {delay:.2f}s after the requests; answers {results}; jobs then {submitted}")

    hub.start()
    # settled: no spawn pending, and every job Slurm lists is a server's the hub lists
    deadline = time.monotonic() + 120
    while True:
        now, owned = jobs(slurm_cluster), owners(hub)
        if not pending(hub) and set(now) <= set(owned):
            break
        assert time.monotonic() < deadline, (
            f"not settled: pending {pending(hub)}, jobs {now}, servers' jobs {owned}\n{hub.log()}")
        time.sleep(1)

    # no GPU in two running jobs
    running = {job: j["gpus"] for job, j in now.items() if j["state"] == "RUNNING"}
    held = [gpu for gpus in running.values() for gpu in gpus]
    assert len(held) == len(set(held)), running
    # every job left is its server's: the comment names the user whose server's state holds its id
    for job, j in now.items():
        assert f"user:{owned[job]} " in j["comment"] + " ", (job, j, owned)

    # the hub goes on placing: a new request gets a job, on GPUs no running job holds
    add_user(hub, "after")
    r = hub.spawn("after", {"profile": "gpu", "gpus": 1, "gpu_model": "any"})
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 60
    while not hub.user("after")["servers"].get("", {}).get("state", {}).get("job_id"):
        assert time.monotonic() < deadline, hub.log()
        time.sleep(0.5)
    later = jobs(slurm_cluster)
    held = [gpu for j in later.values() if j["state"] == "RUNNING" for gpu in j["gpus"]]
    assert len(held) == len(set(held)), later
