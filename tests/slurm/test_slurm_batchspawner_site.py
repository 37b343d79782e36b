"""A batchspawner site switching to gpu-slurm: its configuration, unchanged but for the spawner class.

The site's configuration is batchspawner's README example, written for SlurmSpawner
(``req_partition``, ``req_runtime``, ``req_memory``, ``req_nprocs``, a ``batch_script``
of its own with a line for its environment and no ``{gres}``), and the site runs
Slurm's commands on a login node: ``exec_prefix`` is a stand-in for ``ssh
{username}@login``, a script that logs each call and runs the command as that user
(``runuser``) where Slurm's configuration is (``SLURM_CONF``). The hub host has no
Slurm commands: ``sinfo``, ``squeue``, ``scancel``, ``sbatch`` and ``scontrol`` on its
PATH log the call and fail, as a missing program would. Users are system accounts,
as at any batchspawner site; each job runs as its user.

With that, the form shows Slurm's GPUs (not "availability unknown"), a GPU server
runs the site's own script on the GPU the user picked, a stopped pending server's
job is cancelled, a CPU server runs as it did on SlurmSpawner, a job of this hub
that nothing names is cancelled as its owner, a booking is a Slurm reservation made
through the prefix in which the booked user's server runs, and every Slurm command the
hub ran went through the prefix.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import time
from pathlib import Path

import pytest
import requests

from gpuspawner.accounts import ensure_account
from hub import BASE_HUB_CONFIG, VENV_BIN, Hub, login, passable, process_env
from slurmhub import job_gpus
from test_slurm_hub import progress_until, server_process

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

#: what a site that used batchspawner's SlurmSpawner has (batchspawner's README example, for Slurm),
#: with the one line it changes to adopt gpu-slurm; LOGIN is its ssh to the login node, and the
#: script's line for its environment (the README's "module load python3") puts SITE_PYTHON on the PATH
SITE_CONFIG = """
import batchspawner    # Even though not used, needed to register batchspawner interface
c.JupyterHub.spawner_class = 'gpu-slurm'   # was: 'batchspawner.SlurmSpawner'
c.Spawner.http_timeout = 120

c.BatchSpawnerBase.req_nprocs = '1'
c.BatchSpawnerBase.req_partition = 'gpu'
c.BatchSpawnerBase.req_runtime = '12:00:00'
c.BatchSpawnerBase.req_memory = '1G'
c.SlurmSpawner.exec_prefix = 'LOGIN {username}'
c.SlurmSpawner.batch_script = '''#!/bin/bash
#SBATCH --partition={partition}
#SBATCH --time={runtime}
#SBATCH --cpus-per-task={nprocs}
#SBATCH --mem={memory}
#SBATCH --job-name=jupyterhub-singleuser
#SBATCH --output={homedir}/jupyterhub_slurmspawner_%j.log
#SBATCH --chdir={homedir}
#SBATCH --export={keepvars}
export PATH=SITE_PYTHON:$PATH
{cmd}
'''
"""

#: what this machine needs besides: the servers' program, and this hub's own jobs and timings
TEST_CONFIG = """
c.Spawner.cmd = [VENV + "/jupyterhub-singleuser"]
c.Spawner.start_timeout = 180
c.SlurmSpawner.startup_poll_interval = 0.5
c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]
c.GPUSpawnerMixin.gpu_inventory_ttl = 0.5
c.GPUSpawnerMixin.gpu_reconcile_interval = 2
from gpuspawner.hub.setup import configure  # the GPU pages and APIs (bookings among them)
configure(c)
"""

#: the stand-in for ssh to the login node: log the call, run it as the user where Slurm is configured
LOGIN = """#!/bin/sh
user="$1"; shift
printf '%s %s\\n' "$user" "$*" >> {log}
PATH=$(printf %s "$PATH" | sed 's|^{hostbin}:||')
exec runuser -u "$user" -- env SLURM_CONF={conf} PATH="$PATH" "$@"
"""

#: a Slurm command on the hub host, which has none: the call is logged, and fails as a missing program
ABSENT = """#!/bin/sh
printf '%s %s\\n' "$(basename "$0")" "$*" >> {log}
echo "$(basename "$0"): not installed on this host (Slurm's commands run on the login node)" >&2
exit 127
"""


@pytest.fixture(scope="module")
def site(slurm_cluster, tmp_path_factory):
    """The hub, its users (system accounts), the login node's log and the hub host's log of direct calls."""
    folder = passable(tmp_path_factory.mktemp("batchspawner-site"))
    hostbin = folder / "hostbin"
    hostbin.mkdir()
    direct, via_login = folder / "direct-calls.log", folder / "login-calls.log"
    for name in ("sinfo", "squeue", "scancel", "sbatch", "scontrol"):
        (hostbin / name).write_text(ABSENT.format(log=direct))
        (hostbin / name).chmod(0o755)
    login_script = folder / "login"
    login_script.write_text(LOGIN.format(log=via_login, hostbin=hostbin, conf=slurm_cluster.conf))
    login_script.chmod(0o755)
    config = folder / "hub" / "jupyterhub_config.py"
    config.parent.mkdir()
    config.write_text(BASE_HUB_CONFIG + f"VENV = {str(VENV_BIN)!r}\n"
                      + SITE_CONFIG.replace("LOGIN", str(login_script)).replace("SITE_PYTHON", str(VENV_BIN))
                      + TEST_CONFIG)
    hub = Hub(config.parent, {}, config_file=config)
    hub.env.pop("SLURM_CONF", None)  # the hub host knows no Slurm cluster
    hub.env["PATH"] = f"{hostbin}:{hub.env['PATH']}"
    prefix = hub.settings["account_prefix"]
    homes = Path(hub.settings["homes"])
    users = {}
    for name in ("ann", "bob", "cid"):  # the site's users are system accounts; hub.close() deletes them
        users[name] = ensure_account(name, prefix, homes).pw_name
    hub.start()
    try:
        hub.add_users(*users.values())
        yield {"hub": hub, "users": users, "direct": direct, "via_login": via_login, "login": login_script}
    finally:
        hub.close()
        slurm_cluster.cancel_all()


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def no_direct_calls(site) -> None:
    assert calls(site["direct"]) == [], (calls(site["direct"]), site["hub"].log())


def test_the_form_shows_slurms_gpus_read_through_the_sites_exec_prefix(site, slurm_cluster):
    hub, ann = site["hub"], site["users"]["ann"]
    page = " ".join(login(hub, ann).get(hub.url + "/hub/spawn", timeout=60).text.split())
    assert "A100 (gpu:a100) - 2 of 2 free" in page and "T4 (gpu:t4) - 2 of 2 free" in page, page
    assert "GPU availability unknown" not in page, page
    assert f"{ann} sinfo --json" in calls(site["via_login"])  # as ann, on the login node
    no_direct_calls(site)


def one_t4_server(hub: Hub, name: str) -> str:
    """``name``'s server on one T4 (started now unless it runs); its Slurm job id."""
    if not hub.user(name)["servers"]:
        r = hub.spawn(name, {"profile": "gpu", "gpus": 1, "gpu_model": "t4"})
        assert r.status_code in (201, 202), r.text
    hub.wait_ready(name, timeout=150)
    return str(hub.user(name)["servers"][""]["state"]["job_id"])


def test_a_gpu_server_runs_the_sites_own_script_on_the_gpu_picked(site, slurm_cluster):
    hub, ann = site["hub"], site["users"]["ann"]
    job = one_t4_server(hub, ann)
    # the GPU the user picked, which the site's script never asks for, reached the job (--gres on sbatch's line)
    assert [slurm_cluster.models()[i] for i in job_gpus(slurm_cluster, job)] == ["t4"]
    # the site's own script ran (its line for the environment), as ann, with the site's partition, time
    # limit, CPUs and memory
    pid = server_process(job)
    env = process_env(pid)
    assert env["PATH"].startswith(f"{VENV_BIN}:") and env["CUDA_VISIBLE_DEVICES"] == "0", env
    assert os.stat(f"/proc/{pid}").st_uid == pwd.getpwnam(ann).pw_uid
    listed = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%P %l %C %m %b %u").stdout.split()
    assert listed == ["gpu", "12:00:00", "1", "1G", "gres:gpu:t4:1", ann], listed
    # and it serves ann's URL (the job exported the server's environment, read after the form)
    r = requests.get(f"{hub.url}/user/{ann}/api/status", headers={"Authorization": f"token {hub.token}"},
                     timeout=60)
    assert r.ok and "started" in r.json(), r.text
    submitted = [c for c in calls(site["via_login"]) if c.startswith(f"{ann} sbatch ")]
    assert submitted and "--gres=gpu:t4:1" in submitted[-1], submitted
    no_direct_calls(site)


def test_a_pending_server_stopped_has_its_job_cancelled_and_a_cpu_server_starts(site, slurm_cluster):
    hub, bob = site["hub"], site["users"]["bob"]
    one_t4_server(hub, site["users"]["ann"])
    # both T4s cannot be free while ann's server holds one: bob's job waits in Slurm's queue
    r = hub.spawn(bob, {"profile": "gpu", "gpus": 2, "gpu_model": "t4"})
    assert r.status_code == 202, r.text
    progress_until(hub, bob, r"Waiting in Slurm's queue")  # Slurm's reason, read through the prefix
    job = str(hub.user(bob)["servers"][""]["state"]["job_id"])
    assert f"{job} PENDING" in "\n".join(slurm_cluster.jobs())
    hub.stop_server(bob)
    deadline = time.monotonic() + 20
    while any(j.startswith(job + " ") for j in slurm_cluster.jobs()) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not any(j.startswith(job + " ") for j in slurm_cluster.jobs()), (slurm_cluster.jobs(), hub.log())
    assert f"{bob} scancel {job}" in calls(site["via_login"])
    # a CPU server: the site's job as it was on SlurmSpawner, no GPU asked for
    r = hub.spawn(bob, {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(bob, timeout=150)
    job = str(hub.user(bob)["servers"][""]["state"]["job_id"])
    listed = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%P %l %C %m %b %u").stdout.split()
    assert listed == ["gpu", "12:00:00", "1", "1G", "N/A", bob], listed
    no_direct_calls(site)


def test_a_job_of_this_hub_nothing_names_is_cancelled_as_its_owner(site, slurm_cluster):
    hub, cid = site["hub"], site["users"]["cid"]
    # a job as the hub submits it for cid, whose id never reached the database (the hub died in between)
    comment = f"jupyterhub:{hub.settings['hub_id']} user:{cid} server:"
    out = slurm_cluster.run("sh", "-c", " ".join([
        shlex.quote(str(site["login"])), cid, "sbatch", "--parsable", shlex.quote(f"--comment={comment}"),
        "-o", "/dev/null", "--wrap", shlex.quote("sleep 300")]))
    orphan = out.stdout.strip()
    assert re.fullmatch(r"[0-9]+", orphan), out
    deadline = time.monotonic() + 30
    while any(j.startswith(orphan + " ") for j in slurm_cluster.jobs()):
        assert time.monotonic() < deadline, (slurm_cluster.jobs(), hub.log())
        time.sleep(0.5)
    assert f"{cid} scancel {orphan}" in calls(site["via_login"])  # batch_cancel_cmd, as cid
    assert f"cancelling Slurm job {orphan} of {cid}/" in hub.log_path.read_text()
    no_direct_calls(site)


def test_a_booking_is_reserved_through_the_prefix_and_the_booked_users_server_runs_in_it(site, slurm_cluster):
    """Booked over REST by the site's user: the reservation is made on the login node (as the hub's own
    account, a Slurm administrator here), and the user's server job, submitted as them, runs in it."""
    hub, cid = site["hub"], site["users"]["cid"]
    for user in site["users"].values():  # the servers of the tests before: their jobs' time limits reach into
        if hub.user(user)["servers"]:    # any window, and Slurm reserves no node such a job runs on
            hub.stop_server(user)
    deadline = time.monotonic() + 30
    while slurm_cluster.jobs():
        assert time.monotonic() < deadline, slurm_cluster.jobs()
        time.sleep(0.3)
    session = login(hub, cid)
    headers = {"X-XSRFToken": session.cookies.get("_xsrf", path="/hub/"), "Referer": hub.url + "/hub/gpus/bookings"}
    now = time.time()
    r = session.post(f"{hub.url}/hub/api/gpus/bookings", headers=headers, timeout=90,
                     json={"model": "a100", "count": 2, "start": now, "end": now + 900})
    assert r.status_code == 201, r.text
    booking = r.json()["id"]
    name = f"jupyterhub-{hub.settings['hub_id']}-{booking}-0"
    try:
        assert any(c.startswith(f"root scontrol create reservation ReservationName={name} ") and f"Users={cid}" in c
                   for c in calls(site["via_login"])), calls(site["via_login"])
        r = hub.spawn(cid, {"profile": "gpu", "gpus": 1, "gpu_model": "a100"})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(cid, timeout=150)
        job = str(hub.user(cid)["servers"][""]["state"]["job_id"])
        shown = slurm_cluster.run("scontrol", "show", "job", job).stdout
        assert f"Reservation={name}" in shown, shown
    finally:
        hub.stop_server(cid)
        r = session.delete(f"{hub.url}/hub/api/gpus/bookings/{booking}", headers=headers, timeout=90)
        assert r.status_code == 204, r.text
    assert name not in slurm_cluster.run("scontrol", "show", "reservation", "-o").stdout
    no_direct_calls(site)
