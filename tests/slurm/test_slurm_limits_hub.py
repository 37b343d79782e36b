"""gpu-slurm on a real hub and the real cluster (gpu:a100:2, gpu:t4:2): the CUDA check before
submission, and Slurm's own refusals at submission in plain words, with nothing held after them."""

from __future__ import annotations

import json
import time

import pytest

from hub import Hub
from slurmhub import add_user, running_hub

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

PROFILES = [
    {"slug": "cu126", "display_name": "CUDA 12.6 stack", "gpu_models": ["any"], "gpu_counts": [1]},
    {"slug": "cu124", "display_name": "CUDA 12.4 stack", "gpu_models": ["any"], "gpu_counts": [1],
     "slurm": {"time": "30"}},
    {"slug": "nowhere", "display_name": "CPU, no such partition", "gpu_counts": [0],
     "slurm": {"partition": "nosuch"}},
    {"slug": "big", "display_name": "100G memory", "gpu_models": ["any"], "gpu_counts": [2], "mem_limit": "100G"},
]
# the node's drivers, as a site without node features declares them: its T4s' driver is newer
LIMITS_CONFIG = """
c.GPUSlurmSpawner.slurm_driver_cuda = {"a100": "12.2", "t4": "12.4"}
c.GPUSlurmSpawner.environment_cuda = {"cu126": "12.6", "cu124": "cuda>=12.4"}
c.GPUSpawnerMixin.gpu_quota_per_user = 2
"""


@pytest.fixture(scope="module")
def hub(slurm_cluster, slurm_gpus, tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("slurm-limits-hub"), slurm_cluster, slurm_gpus, LIMITS_CONFIG,
                     PROFILES) as hub:
        yield hub


@pytest.fixture
def cluster(slurm_cluster, hub):
    yield slurm_cluster
    for name in hub.user_names():
        for server in hub.user(name)["servers"]:
            hub.api("DELETE", f"/users/{name}/servers/{server}" if server else f"/users/{name}/server")
    deadline = time.monotonic() + 30
    while slurm_cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    slurm_cluster.cancel_all()


def spawn_named(hub: Hub, name: str, server: str, options: dict):
    return hub.api("POST", f"/users/{name}/servers/{server}", data=json.dumps(options))


def test_an_environment_needing_a_newer_cuda_than_the_drivers_is_refused_before_submission(hub, cluster):
    add_user(hub, "kim")
    r = hub.spawn("kim", {"profile": "cu126", "gpus": 1})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == (
        "Profile 'cu126' needs CUDA 12.6 but the drivers of the nodes in the Slurm cluster with 1 GPUs support "
        "CUDA 12.4 at most. Pick a profile built for CUDA 12.4 or older, or ask an admin to update the driver.")
    r = hub.spawn("kim", {"profile": "cu124", "gpus": 1, "gpu_model": "a100"})
    assert r.status_code == 409, r.text
    assert "needs CUDA 12.4 but the drivers of the nodes in the Slurm cluster with 1 a100 GPUs support CUDA 12.2 " \
           "at most" in r.json()["message"], r.text
    assert cluster.jobs() == []  # nothing was submitted
    assert hub.user("kim")["servers"] == {}

    # any model: the T4s' driver is new enough, so Slurm is asked for a T4
    r = hub.spawn("kim", {"profile": "cu124", "gpus": 1})
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 30
    while not hub.user("kim")["servers"].get("", {}).get("state", {}).get("job_id"):
        assert time.monotonic() < deadline, hub.log()
        time.sleep(0.3)
    job = str(hub.user("kim")["servers"][""]["state"]["job_id"])
    assert cluster.run("squeue", "-h", "-j", job, "-o", "%b").stdout.strip() == "gres:gpu:t4:1"


def test_slurms_refusal_at_submission_is_a_409_in_plain_words_and_holds_nothing(hub, cluster):
    add_user(hub, "lee")
    r = hub.spawn("lee", {"profile": "nowhere", "gpus": 0})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == ("Slurm refused the job: Invalid partition name specified. Slurm has no "
                                   "partition nosuch. Ask an admin to fix the profile.")

    # two GPUs, the user's whole quota, with memory no node has (RealMemory=8000): Slurm refuses the
    # first server...
    said = ("Slurm refused the job: Requested node configuration is not available. No node of partition "
            "(Slurm's default) has what the job asks for (100G memory, GPUs gpu:a100:2). Pick another "
            "profile, or ask an admin to fix this one.")
    r = spawn_named(hub, "lee", "one", {"profile": "big", "gpus": 2})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == said
    # ... and the second gets Slurm's answer too, not "over your quota": the first holds nothing
    r = spawn_named(hub, "lee", "two", {"profile": "big", "gpus": 2})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == said
    assert cluster.jobs() == []
    assert not any(s.get("ready") or s.get("pending") for s in hub.user("lee")["servers"].values())
