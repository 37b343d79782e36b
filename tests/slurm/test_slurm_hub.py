"""gpu-slurm on a real JupyterHub and a real one-node Slurm cluster (gpu:a100:2, gpu:t4:2).

The single-user servers really run inside the Slurm jobs (``srun batchspawner-singleuser
jupyterhub-singleuser``), each confined by Slurm to its GPUs' device files (``ConstrainDevices``);
the GPUs a server got are what Slurm says it allocated (``scontrol show job -d``), Slurm's
``CUDA_VISIBLE_DEVICES`` in its process's environment (``/proc/PID/environ``), and what its GPU
monitor lists (the stand-in NVML lists the node's GPUs in gres.conf's order, on its device files).
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
import requests

from hub import Hub, login, pid_alive, process_env
from kernels import execute, start_kernel
from slurmhub import (
    ONE_A100,
    OVERVIEW_CONFIG,
    PROFILES,
    SLURM_HUB_CONFIG,
    add_user,
    charged,
    job_gpus,
    job_id,
    monitor_uuids,
    running_hub,
)

pytestmark = [pytest.mark.integration, pytest.mark.slurm]



@pytest.fixture(scope="module")
def hub(slurm_cluster, slurm_gpus, tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("slurm-hub"), slurm_cluster, slurm_gpus, OVERVIEW_CONFIG) as hub:
        yield hub


@pytest.fixture
def cluster(slurm_cluster, hub):
    """The cluster, with no job left by the test."""
    yield slurm_cluster
    for name in hub.user_names():
        hub.api("DELETE", f"/users/{name}/server")
    deadline = time.monotonic() + 30
    while slurm_cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    slurm_cluster.cancel_all()


def server_process(job: str, timeout: float = 30) -> int:
    """The pid of the single-user server running in Slurm job ``job``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
                if b"singleuser" not in cmdline or b"srun" in cmdline:
                    continue
                if process_env(int(proc.name)).get("SLURM_JOB_ID") == job:
                    return int(proc.name)
            except (OSError, ValueError):
                continue
        time.sleep(0.3)
    raise AssertionError(f"no single-user server process in Slurm job {job}")


def start(hub: Hub, name: str, options=ONE_A100) -> str:
    """Start ``name``'s server; the GPUs Slurm gave its process (``CUDA_VISIBLE_DEVICES``)."""
    r = hub.spawn(name, options)
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()}"
    hub.wait_ready(name, timeout=120)
    pid = server_process(job_id(hub, name))
    return process_env(pid)["CUDA_VISIBLE_DEVICES"]


def progress_until(hub: Hub, name: str, pattern: str, timeout: float = 60) -> str:
    """The progress messages of ``name``'s pending spawn, read until one matches ``pattern``."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stream = hub.api("GET", f"/users/{name}/server/progress", stream=True)
        try:
            for line in stream.iter_lines(decode_unicode=True):
                if line.startswith("data:"):
                    message = json.loads(line[5:]).get("message", "")
                    seen.append(message)
                    if re.search(pattern, message):
                        return message
        except requests.exceptions.RequestException:
            pass
        finally:
            stream.close()
        time.sleep(0.5)
    raise AssertionError(f"no progress message matching {pattern!r}; seen: {seen}\n{hub.log()}")


def test_two_users_get_disjoint_gpus_third_waits_in_slurm_and_starts_when_one_stops(hub, cluster, slurm_gpus):
    uuids = slurm_gpus["uuids"]
    for name in ("alice", "bob", "carol", "dave"):
        add_user(hub, name)
    # Slurm confines each job to its GPUs, so it numbers them from 0 in the job
    assert start(hub, "alice") == start(hub, "bob") == "0"
    alice, bob = job_gpus(cluster, job_id(hub, "alice")), job_gpus(cluster, job_id(hub, "bob"))
    assert sorted(alice + bob) == [0, 1], (alice, bob)  # the a100s, nvidia0 and nvidia1
    # each server's GPU monitor lists exactly the GPU Slurm gave its job
    assert monitor_uuids(hub, "alice") == [uuids[alice[0]]]
    assert monitor_uuids(hub, "bob") == [uuids[bob[0]]]

    # the job carries the hub, user and server, and which start of the server it is
    line = next(j for j in cluster.jobs() if j.startswith(job_id(hub, "alice") + " "))
    assert "jupyterhub-jupyterhub-alice" in line
    comment = cluster.run("squeue", "-h", "-j", job_id(hub, "alice"), "-o", "%k").stdout.strip()
    assert re.fullmatch(r"jupyterhub:jupyterhub user:alice server: start:[0-9a-f]{12}", comment), comment
    assert charged(hub) == {"alice/": 1, "bob/": 1}
    # the profile's Slurm settings reach sbatch: its time limit, one node, the A100 GRES
    limits = cluster.run("squeue", "-h", "-j", job_id(hub, "alice"), "-o", "%l %D %b").stdout.split()
    assert limits == ["30:00", "1", "gres:gpu:a100:1"], limits

    # carol's job waits in Slurm, and her progress page says why, and where she stands
    r = hub.spawn("carol", ONE_A100)
    assert r.status_code == 202, r.text
    # (first "Slurm has not looked at it yet", then Slurm's reason once its scheduler ran)
    message = progress_until(hub, "carol", r"Waiting in Slurm's queue .* in use by other jobs")
    assert message.startswith(f"Waiting in Slurm's queue (job {job_id(hub, 'carol')}, partition gpu): the GPUs it "
                              "needs are in use by other jobs; it starts when enough of them are released."), message
    assert "It is 1st of 1 GPU job waiting in partition gpu" in message, message
    carol_job = job_id(hub, "carol")
    assert f"{carol_job} PENDING Resources" in "\n".join(cluster.jobs())

    # dave queues behind carol; stopping his pending server cancels his job
    assert hub.spawn("dave", ONE_A100).status_code == 202
    message = progress_until(hub, "dave", r"Waiting in Slurm's queue .*2nd of 2 GPU jobs")
    assert "It is 2nd of 2 GPU jobs waiting in partition gpu." in message, message
    dave_job = job_id(hub, "dave")
    hub.stop_server("dave")
    deadline = time.monotonic() + 20
    while any(j.startswith(dave_job + " ") for j in cluster.jobs()) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not any(j.startswith(dave_job + " ") for j in cluster.jobs()), f"{cluster.jobs()}\n{hub.log()}"

    # alice stops: Slurm starts carol's job on the A100 alice had
    hub.stop_server("alice")
    hub.wait_ready("carol", timeout=120)
    assert job_gpus(cluster, carol_job) == alice
    assert monitor_uuids(hub, "carol") == [uuids[alice[0]]]
    # batchspawner's start commits through Spawner.db: gpu-slurm gives it the server's session, so the
    # log holds no JupyterHub 6.1 deprecation warning for it (a line that was only a prefix)
    assert "Spawner.db is deprecated" not in hub.log_path.read_text(errors="replace")


# From a notebook in the server: each GPU's device file opened read-write (the error's text, or
# "opened"), and NVML's handle for each GPU by UUID (the UUID back, or the error's class).
PROBE = """
import json, os
import pynvml
opened = {{}}
for node in {nodes!r}:
    try:
        os.close(os.open(node, os.O_RDWR))
        opened[node] = "opened"
    except OSError as e:
        opened[node] = e.strerror

def handle(uuid):
    try:
        return pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(uuid))
    except pynvml.NVMLError as e:
        return type(e).__name__

pynvml.nvmlInit()
print(json.dumps({{"opened": opened, "count": pynvml.nvmlDeviceGetCount(),
                  "handles": {{u: handle(u) for u in {uuids!r}}}}}))
"""


def test_a_server_can_open_only_the_gpu_slurm_gave_its_job(hub, cluster, slurm_gpus):
    uuids, nodes = slurm_gpus["uuids"], [str(n) for n in cluster.device_nodes()]
    add_user(hub, "june")
    assert start(hub, "june") == "0"
    [mine] = job_gpus(cluster, job_id(hub, "june"))
    server_url = f"{hub.url}/user/june/"
    seen = json.loads(execute(server_url, hub.token, start_kernel(server_url, hub.token),
                              PROBE.format(nodes=nodes, uuids=uuids)))
    # its own A100's file opens as far as the kernel's device cgroup is concerned (ENXIO: no driver
    # behind this mknod'ed file); the other three are refused by Slurm's cgroup
    assert seen["opened"] == {node: ("No such device or address" if n == mine else "Operation not permitted")
                              for n, node in enumerate(nodes)}, seen
    # NVML counts every GPU of the node, as on a real host, and gives a handle for its own only
    assert seen["count"] == 4
    assert seen["handles"] == {u: (u if n == mine else "NVMLError_NoPermission") for n, u in enumerate(uuids)}, seen
    assert monitor_uuids(hub, "june") == [uuids[mine]]


def test_a_request_no_node_can_ever_run_is_refused_at_once(hub, cluster):
    add_user(hub, "erin")
    r = hub.spawn("erin", {"profile": "gpu", "gpus": 4, "gpu_model": "a100"})
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert message == ("No node in the Slurm cluster has 4 a100 GPUs; the most on one node: "
                       "a100 (up to 2 per node), t4 (up to 2 per node). Ask for fewer GPUs."), message

    r = hub.spawn("erin", {"profile": "h100", "gpus": 1})
    assert r.status_code == 409, r.text
    assert "has h100 GPUs; the GPUs there: a100 (up to 2 per node), t4 (up to 2 per node)" in r.json()["message"]
    assert hub.user("erin")["servers"] == {}
    assert cluster.jobs() == []  # nothing was submitted


@pytest.mark.parametrize("body", [
    {"profile": "gpu", "gpus": "two"},
    {"profile": "gpu", "gpus": 3},
    {"profile": "gpu", "gpus": 1, "gpu_model": "h100"},
    {"profile": "gpu", "gpus": 1, "partition": "debug"},
    "[1, 2]",
])
def test_malformed_requests_get_400_and_submit_nothing(hub, cluster, body):
    add_user(hub, "frank")
    r = hub.spawn("frank", body)
    assert r.status_code == 400, r.text
    assert hub.user("frank")["servers"] == {}
    assert cluster.jobs() == []


def test_the_form_shows_free_and_total_per_gpu_type_from_slurm(hub, cluster):
    add_user(hub, "gina")
    start(hub, "gina", {"profile": "gpu", "gpus": 1, "gpu_model": "t4"})
    add_user(hub, "hank")
    page = login(hub, "hank").get(hub.url + "/hub/spawn", timeout=30).text
    assert "A100 (gpu:a100) - 2 of 2 free" in page, page
    assert "T4 (gpu:t4) - 1 of 2 free" in page, page


def test_hub_start_cancels_jobs_of_this_hub_that_no_server_names(hub, cluster):
    # a job as the hub submits it, whose id never reached the database (the hub died in between)
    out = cluster.run("sbatch", "--parsable", "--job-name=jupyterhub-jupyterhub-ghost", "--gres=gpu:t4:1",
                      "--comment=jupyterhub:jupyterhub user:ghost server:", "-o", "/dev/null", "--wrap", "sleep 300")
    orphan = out.stdout.strip()
    other = cluster.run("sbatch", "--parsable", "--comment=jupyterhub:otherhub user:ghost server:",
                        "-o", "/dev/null", "--wrap", "sleep 300").stdout.strip()
    hub.restart()
    add_user(hub, "ivy")
    r = hub.spawn("ivy", {"profile": "cpu"})  # the first spawn reconciles before submitting
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ivy", timeout=120)
    ids = [j.split()[0] for j in cluster.jobs()]
    assert orphan not in ids and other in ids, cluster.jobs()
    assert f"cancelling Slurm job {orphan} of ghost/" in hub.log_path.read_text()
    cluster.run("scancel", other)
    assert pid_alive(hub.proc.pid)


def test_jobs_of_this_hub_no_server_or_notebook_job_names_are_cancelled_without_a_restart(hub, cluster):
    # a hub that has users, none of them with a server: it reconciles with Slurm as soon as it is up
    add_user(hub, "ghost")
    hub.restart()
    # jobs as the hub submits them, for a server and for a notebook GPU job, whose ids never reached
    # the database (another process of the hub died in between); nobody spawns, nothing restarts
    orphans = [cluster.run("sbatch", "--parsable", f"--job-name=jupyterhub-jupyterhub-ghost-{server}",
                           "--gres=gpu:t4:1", f"--comment=jupyterhub:jupyterhub user:ghost server:{server}",
                           "-o", "/dev/null", "--wrap", "sleep 300").stdout.strip()
               for server in ("", "job/5e1f0c")]
    # and one whose comment no hub writes (anyone's sbatch can say anything): it does not stop the pass
    forged = cluster.run("sbatch", "--parsable", "--comment=jupyterhub:jupyterhub user:ghost server:a/b/c",
                         "-o", "/dev/null", "--wrap", "sleep 300").stdout.strip()
    deadline = time.monotonic() + 30
    while {j.split()[0] for j in cluster.jobs()} & set(orphans):
        assert time.monotonic() < deadline, f"not cancelled: {cluster.jobs()}\n{hub.log()}"
        time.sleep(0.5)
    log = hub.log_path.read_text()
    assert f"cancelling Slurm job {orphans[0]} of ghost/: no server or notebook job" in log, log
    assert f"cancelling Slurm job {orphans[1]} of ghost/job/5e1f0c: no server or notebook job" in log, log
    assert "ghost/" not in charged(hub) and "ghost/job/5e1f0c" not in charged(hub)
    assert f"Slurm job {forged}: its comment names no server or job of this hub" in log, log
    assert forged in {j.split()[0] for j in cluster.jobs()}  # not this hub's: left alone
    cluster.run("scancel", forged)


def test_a_job_cancelled_behind_the_hubs_back_stops_counting_without_a_restart(hub, cluster):
    add_user(hub, "mona")
    start(hub, "mona", {"profile": "gpu", "gpus": 2, "gpu_model": "t4"})
    assert charged(hub)["mona/"] == 2
    cluster.run("scancel", job_id(hub, "mona"))  # an admin, or Slurm (time limit, node failure)
    deadline = time.monotonic() + 45
    while "mona/" in charged(hub):
        assert time.monotonic() < deadline, f"still charged: {charged(hub)}\n{hub.log()}"
        time.sleep(0.5)
    assert "gpu-slurm: mona/'s GPU charge (2) freed: no live Slurm job of it" in hub.log_path.read_text()
    # and her quota (4) counts only what she holds: two more servers of 2 GPUs each are taken
    for server, model in (("big", "a100"), ("more", "t4")):
        r = hub.api("POST", f"/users/mona/servers/{server}", json={"profile": "gpu", "gpus": 2, "gpu_model": model})
        assert r.status_code in (201, 202), r.text
    assert charged(hub)["mona/big"] == charged(hub)["mona/more"] == 2
    for server in ("big", "more"):
        hub.api("DELETE", f"/users/mona/servers/{server}")


def start_named(hub: Hub, name: str, server: str, options: dict) -> requests.Response:
    """POST ``name``'s named server; wait until it is ready when the hub took the request."""
    r = hub.api("POST", f"/users/{name}/servers/{server}", json=options)
    if r.status_code in (201, 202):
        deadline = time.monotonic() + 120
        while not hub.user(name)["servers"].get(server, {}).get("ready"):
            assert server in hub.user(name)["servers"] and time.monotonic() < deadline, hub.log()
            time.sleep(0.3)
    return r


def test_a_job_that_ended_while_the_hub_was_down_is_noticed(hub, cluster):
    add_user(hub, "lena")
    two_t4 = {"profile": "gpu", "gpus": 2, "gpu_model": "t4"}
    try:
        assert start_named(hub, "lena", "keep", {"profile": "gpu", "gpus": 2, "gpu_model": "a100"}).ok
        start(hub, "lena", two_t4)
        gone = job_id(hub, "lena")
        hub.stop(signal.SIGKILL)
        # while the hub is down, an admin (or Slurm: time limit, node failure) ends the job
        cluster.run("scancel", gone)
        deadline = time.monotonic() + 30
        while any(j.startswith(gone + " ") and " RUNNING " in f"{j} " for j in cluster.jobs()):
            assert time.monotonic() < deadline, cluster.jobs()
            time.sleep(0.3)
        hub.start()
        # the hub shows that server stopped, and the other one still running
        deadline = time.monotonic() + 30
        while "" in hub.user("lena")["servers"] and time.monotonic() < deadline:
            time.sleep(0.3)
        assert list(hub.user("lena")["servers"]) == ["keep"], hub.user("lena")["servers"]
        # its 2 GPUs no longer count against lena's quota of 4: keep's 2 and 2 more fit
        r = start_named(hub, "lena", "more", two_t4)
        assert r.status_code in (201, 202), r.text
        assert sorted(hub.user("lena")["servers"]) == ["keep", "more"]
        # and a third would not (the quota counts the adopted job's GPUs)
        r = hub.api("POST", "/users/lena/servers/third", json={"profile": "gpu", "gpus": 1, "gpu_model": "any"})
        assert r.status_code == 409 and "Your quota is 4 GPUs" in r.json()["message"], r.text
        # and lena's default server starts again
        assert hub.spawn("lena", {"profile": "cpu"}).status_code in (201, 202)
        hub.wait_ready("lena", timeout=120)
    finally:
        for server in ("keep", "more"):
            hub.api("DELETE", f"/users/lena/servers/{server}")


def test_when_slurm_does_not_answer_the_form_says_availability_unknown_and_spawns_go_to_slurm(
        cluster, slurm_gpus, tmp_path):
    # a second hub whose Slurm commands reach a controller that is down (the shared cluster runs on)
    down = cluster.unreachable_conf(tmp_path)
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(SLURM_HUB_CONFIG + 'c.GPUSpawnerMixin.gpu_hub_id = "downhub"\n')
    other = Hub(tmp_path / "hub", {**slurm_gpus["env"], "SLURM_CONF": str(down)}, PROFILES, config_file=config)
    other.start()
    try:
        add_user(other, "kim")
        page = login(other, "kim").get(other.url + "/hub/spawn", timeout=60).text
        assert ("GPU availability unknown right now (Slurm does not answer: sinfo --json answered with an "
                "error instead of a listing (Unspecified error): is slurmctld up?). You can still start a server"
                ) in " ".join(page.split()), page
        # neither counts nor "this cluster has no GPUs" are made up
        assert "of 2 free" not in page and "gs-no-gpus" not in page, page

        # the request is not refused by the hub (which cannot know that no node has 4 GPUs of one type):
        # it goes to Slurm, and sbatch's failure is what kim reads: 503, try again. (Models only Slurm names,
        # like a100 here, are not offered while it does not answer: 400 naming the profiles' models.)
        r = other.spawn("kim", {"profile": "gpu", "gpus": 4, "gpu_model": "any"})
        assert r.status_code in (202, 503), r.text
        message = progress_until(other, "kim", r"Unable to contact slurm controller")
        assert "Unable to contact slurm controller" in message, message
        log = other.log_path.read_text()
        assert "GPU availability unknown (Slurm does not answer: sinfo --json answered with an error" in log, log
        deadline = time.monotonic() + 30
        while other.user("kim")["servers"] and time.monotonic() < deadline:
            time.sleep(0.3)
        assert other.user("kim")["servers"] == {}
        assert cluster.jobs() == []
    finally:
        other.close()
