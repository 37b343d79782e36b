"""gpu-slurm survives hub SIGKILLs while jobs are being submitted to a site cluster.

The session's cluster is started outside the hub, as a site's is: jobs outlive the hub. A real
hub on it (gpu:a100:2,gpu:t4:2) gets a burst of concurrent GPU requests, more GPUs than the
node has, and is killed (SIGKILL, no cleanup) 1-3 s later, several times over, each time
started again on the same database. Afterwards, without another restart:

- what the hub charges agrees with Slurm (``/hub/api/gpus``): every GPU charge belongs to a
  server whose Slurm job is alive (``squeue``) and that JupyterHub shows running or starting,
  and every live job of the hub's is charged to its owner; a job of the hub's that was
  cancelled is named in the hub's log (an orphan the hub cancelled, or a server it stopped);
- what Slurm itself reports holds: no GPU is in two running jobs (``scontrol show job -d``),
  and once no spawn is pending every job left belongs to a server the hub lists, with that
  job's id in its state;
- the hub goes on placing.
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
from slurmhub import OVERVIEW_CONFIG, add_user, running_hub

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

REQUESTS = [
    {"profile": "gpu", "gpus": 1, "gpu_model": "a100"},
    {"profile": "gpu", "gpus": 1, "gpu_model": "t4"},
    {"profile": "gpu", "gpus": 2, "gpu_model": "any"},
    {"profile": "gpu", "gpus": 1, "gpu_model": "any"},
    {"profile": "gpu", "gpus": 2, "gpu_model": "a100"},
    {"profile": "gpu", "gpus": 1, "gpu_model": "t4"},
]
KILLS = 3
#: with the GPU overview; its own hub id: the jobs it owns, adopts or cancels are its own
CONFIG = OVERVIEW_CONFIG + """
c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]
c.Spawner.http_timeout = 30
"""


@pytest.fixture
def crash_hub(slurm_cluster, slurm_gpus, tmp_path):
    with running_hub(tmp_path / "hub", slurm_cluster, slurm_gpus, CONFIG) as hub:
        yield hub


def jobs(cluster) -> dict[str, dict]:
    """Every job Slurm lists: id -> state, comment and the node's GPUs it holds (gres.conf order)."""
    out = {}
    for line in cluster.run("squeue", "-h", "-t", "all", "-o", "%i|%T|%k").stdout.splitlines():
        job, state, comment = line.split("|", 2)
        detail = cluster.run("scontrol", "show", "job", "-d", job, check=False).stdout
        gpus = []
        for found in re.findall(r"GRES=\S*\(IDX:([0-9,-]+)\)", detail):
            for part in found.split(","):
                first, _, last = part.partition("-")
                gpus += range(int(first), int(last or first) + 1)
        out[job] = {"state": state, "comment": comment, "gpus": gpus}
    return out


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


def owner_of(comment: str) -> str:
    """``user/server`` from a job's comment (``jupyterhub:HUB user:NAME server:NAME ...``)."""
    found = re.search(r"user:(\S+) server:(\S*)", comment)
    return f"{found[1]}/{found[2]}" if found else ""


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


def charges(hub: Hub) -> dict[str, dict]:
    """owner -> its entry among the cluster's GPU charges of ``/hub/api/gpus``."""
    r = hub.api("GET", "/gpus")
    assert r.ok, r.text
    return {entry["owner"]: entry for entry in r.json()["cluster"]}


def disagreements(hub: Hub, cluster) -> list[str]:
    """Where the hub's charges and Slurm's live jobs of the hub disagree, in words (none: they agree)."""
    hub_id = hub.settings["hub_id"]
    live: dict[str, list[str]] = {}
    for job, j in jobs(cluster).items():
        if f"jupyterhub:{hub_id} " in j["comment"] and j["state"] not in ENDED:
            live.setdefault(owner_of(j["comment"]), []).append(job)
    charged = charges(hub)
    problems = [f"{owner} is charged {entry['gpus']} GPU(s) but has no live Slurm job"
                for owner, entry in charged.items() if owner not in live]
    problems += [f"{owner} is charged {entry['gpus']} GPU(s) but JupyterHub shows its server {entry['state']}"
                 for owner, entry in charged.items() if entry["state"] not in ("running", "starting", "check")]
    problems += [f"{owner}'s live Slurm job(s) {', '.join(ids)} are charged to nobody"
                 for owner, ids in live.items() if owner not in charged]
    return problems


def events(hub: Hub) -> str:
    """The hub's log without its request lines."""
    lines = (hub.dir / "hub.log").read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if " log:" not in line)[-8000:]


def burst(hub: Hub, spawns: dict[str, dict]) -> dict[str, object]:
    """Ask for a server for each user at once (user -> options); the threads, and the answers once each has one."""
    results: dict[str, object] = {}

    def spawn(name: str, options: dict) -> None:
        try:
            results[name] = hub.spawn(name, options).status_code
        except requests.RequestException as e:  # the hub was killed under it
            results[name] = type(e).__name__

    threads = [threading.Thread(target=spawn, args=item, daemon=True) for item in spawns.items()]
    for thread in threads:
        thread.start()
    return {"threads": threads, "results": results}


def test_hub_killed_while_submitting_again_and_again_then_charges_agree_with_slurm(crash_hub, slurm_cluster):
    hub = crash_hub
    for kill in range(KILLS):
        if kill:
            hub.start()
        names = [f"k{kill}u{i}" for i in range(len(REQUESTS))]
        for name in names:
            add_user(hub, name)
        spawning = burst(hub, dict(zip(names, REQUESTS, strict=True)))
        delay = random.uniform(1.0, 3.0)
        time.sleep(delay)
        hub.stop(signal.SIGKILL)
        for thread in spawning["threads"]:
            thread.join(30)
        print(f"kill {kill + 1}: {delay:.2f}s after the requests; answers {spawning['results']}; "
              f"jobs then {jobs(slurm_cluster)}")
    hub.start()

    # settled: no spawn pending, and every job Slurm lists is a server's the hub lists
    restarted = time.monotonic()
    deadline = restarted + 120
    while True:
        now = {job: j for job, j in jobs(slurm_cluster).items() if j["state"] not in ENDED}
        owned = owners(hub)
        if not pending(hub) and set(now) <= set(owned):
            break
        assert time.monotonic() < deadline, (
            f"not settled: pending {pending(hub)}, jobs {now}, servers' jobs {owned}\n{hub.log()}")
        time.sleep(1)
    settled = time.monotonic()
    # the hub's charges agree with Slurm's live jobs, with no further restart
    deadline = settled + 60
    while problems := disagreements(hub, slurm_cluster):
        assert time.monotonic() < deadline, "\n".join(problems) + f"\n{events(hub)}"
        time.sleep(1)
    print(f"settled {settled - restarted:.1f} s after the last restart; charges agree with Slurm "
          f"{time.monotonic() - settled:.1f} s later")
    # a job of the hub's that was cancelled: the log says the hub cancelled it, or stopped its server
    log = (hub.dir / "hub.log").read_text(errors="replace")
    for job, j in jobs(slurm_cluster).items():
        if f"jupyterhub:{hub.settings['hub_id']} " in j["comment"] and j["state"] == "CANCELLED":
            assert re.search(rf"(cancelling Slurm job {job}\b|Stopping server job {job}\b)", log), (job, j)

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


#: sbatch is slow to take the job, and its id reaches the hub 3 s after the job is in Slurm's
#: queue; the hub reconciles with Slurm every second, so several passes fall in both windows
SLOW_SBATCH = """#!/bin/sh
sleep 3
sbatch "$@"
done=$?
sleep 3
exit $done
"""
SLOW_SUBMIT = CONFIG + """
c.GPUSlurmSpawner.batch_submit_cmd = SLOW + " --parsable"  # a site's own sbatch: gpu-slurm adds its options
c.GPUSpawnerMixin.gpu_reconcile_interval = 1
"""


def test_a_spawn_in_flight_keeps_its_charge_and_its_job_through_reconciliations(slurm_cluster, slurm_gpus, tmp_path):
    slow = tmp_path / "slow" / "sbatch"
    slow.parent.mkdir()
    slow.write_text(SLOW_SBATCH)
    slow.chmod(0o755)
    config = SLOW_SUBMIT.replace("SLOW +", f"{str(slow)!r} +")
    with running_hub(tmp_path / "hub", slurm_cluster, slurm_gpus, config) as hub:
        add_user(hub, "ada")
        # (the hub answers once the server is up, or after 10 s)
        spawning = burst(hub, {"ada": {"profile": "gpu", "gpus": 1, "gpu_model": "t4"}})
        hub_id, seen = hub.settings["hub_id"], []
        deadline = time.monotonic() + 120
        while not (hub.user("ada")["servers"].get("") or {}).get("ready"):
            assert time.monotonic() < deadline, events(hub)
            assert spawning["results"].get("ada") in (None, 201, 202), f"{spawning['results']}\n{events(hub)}"
            listed = [job for job, j in jobs(slurm_cluster).items()
                      if f"jupyterhub:{hub_id} user:ada " in j["comment"] and j["state"] not in ENDED]
            seen.append((charges(hub).get("ada/", {}).get("gpus"), listed))
            time.sleep(0.3)
        spawning["threads"][0].join(30)
        assert spawning["results"]["ada"] in (201, 202), spawning
        # once counted, ada's GPU stayed counted while her job was being submitted, listed and saved
        counted = [gpus for gpus, _listed in seen]
        assert 1 in counted and None not in counted[counted.index(1):], seen
        # the job in Slurm's queue before its id was saved was never taken for an orphan
        assert any(listed for _gpus, listed in seen), seen
        job = str(hub.user("ada")["servers"][""]["state"]["job_id"])
        assert {job} == {j for _gpus, listed in seen for j in listed}, seen
        log = (hub.dir / "hub.log").read_text(errors="replace")
        assert "cancelling Slurm job" not in log and "freed" not in log, events(hub)
        assert charges(hub)["ada/"]["gpus"] == 1
