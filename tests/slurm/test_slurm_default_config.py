"""The runnable default (the repository's jupyterhub_config.py) with GPUSPAWNER_BACKEND=slurm.

With no Slurm cluster answering, the hub starts a private one-node cluster
(gpu:a100:2,gpu:t4:2 on the device files of the simulated GPUs), runs a
JupyterLab server as a Slurm job on the GPU picked in the form, as the user's
own account (made by the hub; never root), and its cluster's daemons do not
outlive it, whether it exits or is killed. With a cluster answering
(SLURM_CONF), it uses that one and starts none.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpuspawner.backends.slurm.dev import SlurmCluster, cannot_start
from hub import Hub, login, pid_alive, process_env, uid_pids, xsrf_token
from needs import missing
from slurmhub import job_gpus

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]


def default_hub(directory: Path, fakenvml_libdir: Path, **env: str) -> Hub:
    """The runnable default on free ports, its state (database, private cluster, users) in ``directory``."""
    hub = Hub(directory, {}, config_file=REPO / "jupyterhub_config.py")
    hub.env.update({
        "GPUSPAWNER_STATE_DIR": str(directory),
        "GPUSPAWNER_FAKENVML_DIR": str(fakenvml_libdir),
        "GPUSPAWNER_BIND_URL": hub.url,
        "GPUSPAWNER_HUB_BIND_URL": hub.settings["hub_bind_url"],
        "GPUSPAWNER_PROXY_API_URL": hub.settings["proxy_api_url"],
        "GPUSPAWNER_PASSWORD": "test-password",
        "GPUSPAWNER_BACKEND": "slurm",
        "GPUSPAWNER_ACCOUNT_PREFIX": "s" + secrets.token_hex(3) + "-",  # this test's accounts alone
        **env,
    })
    for name in ("LD_LIBRARY_PATH", "FAKENVML_CONFIG", "SLURM_CONF"):  # as on a fresh machine
        if name not in env:
            hub.env.pop(name, None)
    return hub


def processes_using(conf: Path) -> list[int]:
    """Live processes whose environment names this cluster's slurm.conf (the servers in its jobs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if process_env(int(entry.name)).get("SLURM_CONF") == str(conf):
                    found.append(int(entry.name))
            except (OSError, UnicodeDecodeError):
                continue
    return found


def wait_until_gone(cluster: SlurmCluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (cluster.daemon_pids() or processes_using(cluster.conf)) and time.monotonic() < deadline:
        time.sleep(0.5)


@pytest.fixture
def private_hub(tmp_path, fakenvml_libdir):
    why = cannot_start()
    if why:
        missing(why)
    hub = default_hub(tmp_path / "hub", fakenvml_libdir)
    cluster = SlurmCluster(hub.dir / "slurm")
    try:
        yield hub, cluster
    finally:
        hub.close()
        cluster.stop()
        for entry in pwd.getpwall():
            if entry.pw_name.startswith(hub.env["GPUSPAWNER_ACCOUNT_PREFIX"]):
                for pid in uid_pids(entry.pw_uid):
                    os.kill(pid, signal.SIGKILL)
                subprocess.run(["userdel", "--remove", entry.pw_name], capture_output=True, timeout=60)


def test_runnable_default_starts_a_private_cluster_runs_jupyterlab_as_a_job_and_stops_it(private_hub):
    hub, cluster = private_hub
    hub.start(timeout=120)
    assert "Slurm: started a private cluster" in hub.log_path.read_text()
    assert sorted(cluster.daemon_pids()) == ["munged", "slurmctld", "slurmd"]

    web = login(hub, "ada")
    html = web.get(hub.url + "/hub/spawn", timeout=60).text
    assert "A100 (gpu:a100) - 2 of 2 free" in html and "T4 (gpu:t4) - 2 of 2 free" in html, html
    assert "wait for a GPU" not in html  # no hub queue on Slurm
    r = web.post(hub.url + "/hub/spawn", timeout=60, data={
        "_xsrf": xsrf_token(html), "profile": "gpu", "gpus-gpu": "1", "gpu_model-gpu": "t4",
    })
    assert r.ok, r.text
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        lab = web.get(hub.url + "/user/ada/lab", timeout=60)
        if lab.status_code == 200 and "JupyterLab" in lab.text:
            break
        time.sleep(1)
    else:
        pytest.fail(f"JupyterLab did not open:\n{hub.log()}\n{cluster.logs()}")

    # the server is a Slurm job of this hub, on one of the T4s (nvidia2, nvidia3)
    [job] = cluster.jobs()
    job_id, state, _, name = job.split()
    assert (state, name) == ("RUNNING", "jupyterhub-jupyterhub-ada"), job
    [gpu] = job_gpus(cluster, job_id)
    assert gpu in (2, 3)
    # and its GPU monitor shows that T4, and only it
    gpus = web.get(hub.url + "/user/ada/api/gpus", timeout=60).json()["gpus"]
    simulated = json.loads((hub.dir / "simulated-gpus.json").read_text())["devices"]
    assert [g["uuid"] for g in gpus] == [simulated[gpu]["uuid"]], gpus
    servers = [pid for pid in processes_using(cluster.conf) if process_env(pid).get("JUPYTERHUB_USER") == "ada"]
    assert servers, "no server process in the job"
    account = pwd.getpwnam(hub.env["GPUSPAWNER_ACCOUNT_PREFIX"] + "ada")  # made by the hub
    assert account.pw_uid != 0
    assert {Path(f"/proc/{pid}").stat().st_uid for pid in servers} == {account.pw_uid}  # not root

    # the hub is killed: its watcher stops the cluster, and the job's server ends with it
    hub.stop(signal.SIGKILL)
    wait_until_gone(cluster)
    assert cluster.daemon_pids() == {} and processes_using(cluster.conf) == []

    # started again, it starts a fresh cluster; ada's job is gone, so is her server
    hub.start(timeout=120)
    assert sorted(cluster.daemon_pids()) == ["munged", "slurmctld", "slurmd"]
    assert "ada appears to have stopped while the Hub was down" in hub.log_path.read_text()
    page = login(hub, "ada").get(hub.url + "/hub/spawn", timeout=60)
    assert page.url == hub.url + "/hub/spawn", page.url  # the form, not a running server
    assert "A100 (gpu:a100) - 2 of 2 free" in page.text and "T4 (gpu:t4) - 2 of 2 free" in page.text, page.text

    # the hub exits (SIGTERM): the cluster's daemons are gone as it exits
    pids = cluster.daemon_pids()
    hub.stop(signal.SIGTERM)
    assert all(not pid_alive(pid) for pid in pids.values()), pids
    assert cluster.daemon_pids() == {}


def test_runnable_default_uses_the_cluster_that_answers(slurm_cluster, tmp_path, fakenvml_libdir):
    hub = default_hub(tmp_path / "hub", fakenvml_libdir, SLURM_CONF=str(slurm_cluster.conf))
    try:
        hub.start(timeout=120)
        assert f"Slurm: the cluster of {slurm_cluster.conf}" in hub.log_path.read_text()
        assert not (hub.dir / "slurm").exists()  # no private cluster
        html = login(hub, "bea").get(hub.url + "/hub/spawn", timeout=60).text
        assert "A100 (gpu:a100) - 2 of 2 free" in html and "T4 (gpu:t4) - 2 of 2 free" in html, html
    finally:
        hub.close()
