"""gpu-swarm on a real two-node Docker swarm: services reserve GPUs Swarm assigns.

The swarm is two more private dockerds on loopback (see conftest's
``swarm_engine``), each node advertising 2 A100s as generic resources
``NVIDIA-GPU=GPU-<uuid>`` and naming their model in its label, with the
stand-in NVIDIA runtime as default runtime (``swarm-resource``). A server's
GPUs are read where a user meets them: ``DOCKER_RESOURCE_NVIDIA-GPU`` in its
task's first process, and the GPUs its notebook's GPU monitor shows (NVML in
the task, through the hub's proxy).
"""

from __future__ import annotations

import json
import shutil
import signal
import time

import docker
import pytest
import requests

import fakenvml
from dockerhub import free_in_form
from engine import IMAGE_TAG, process_environ
from gpuspawner.backends.docker.objects import HUB, OWNER

pytestmark = pytest.mark.docker

GPU = {"profile": "gpu", "gpus": 2, "gpu_model": "a100-sxm4-80gb"}
PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["a100"],
     "gpu_counts": [1, 2, 4], "default_gpus": 1, "default": True},
    {"slug": "queued", "display_name": "GPU notebook, waits its turn", "gpu_models": ["a100"],
     "gpu_counts": [2], "default_gpus": 2, "queue": True},
]
QUEUED = {"profile": "queued", "gpus": 2, "gpu_model": "a100-sxm4-80gb"}

# the admin's GPU overview (/hub/gpus, /hub/api/gpus), which the tests' token may read
OVERVIEW = """
from gpuspawner.hub.handlers import SCOPE, handlers
from gpuspawner.hub.setup import TEMPLATES
c.JupyterHub.extra_handlers = handlers()
c.JupyterHub.template_paths = [TEMPLATES]
c.JupyterHub.custom_scopes = {SCOPE: {"description": "Read the GPU overview"}}
c.JupyterHub.load_roles[0]["scopes"] += [SCOPE]
"""


@pytest.fixture
def swarm_hub(swarm_engine, tmp_path, fakenvml_libdir):
    from dockerhub import DockerHub

    libdir = swarm_engine.dir / "fakenvml"
    libdir.mkdir(mode=0o755, exist_ok=True)
    shutil.copy(fakenvml_libdir / fakenvml.LIBRARY_NAME, libdir / fakenvml.LIBRARY_NAME)
    hub = DockerHub(
        tmp_path / "hub", swarm_engine, fakenvml.env(fakenvml_libdir, swarm_engine.gpus_path), libdir,
        PROFILES, spawner_class="gpuspawner.backends.swarm.spawner.GPUSwarmSpawner", check_cuda=False,
    )
    hub.settings["network"] = "host"  # tasks share the node's network; each server gets its own port
    hub.settings["volumes"] = {}  # each node's runtime mounts its own driver and devices into GPU tasks
    hub.settings["container_env"] = {}
    hub.env["GPUSPAWNER_TEST_HUB"] = json.dumps(hub.settings)
    with open(hub.dir / "jupyterhub_config.py", "a") as config:
        config.write(OVERVIEW)
    hub.start()
    try:
        yield hub
    finally:
        hub.close()
        for service in swarm_engine.client.services.list():
            if service.name.startswith(hub.prefix + "-"):
                service.remove()


def services(hub) -> list[str]:
    return sorted(s.name for s in hub.engine.client.services.list() if s.name.startswith(hub.prefix + "-"))


def running_task(hub, user: str) -> dict:
    service = hub.engine.client.services.get(f"{hub.prefix}-{user}")
    tasks = [t for t in service.tasks(filters={"desired-state": "running"}) if t["Status"]["State"] == "running"]
    assert len(tasks) == 1, tasks
    return tasks[0]


def task_gpus(hub, user: str) -> set[str]:
    """The user's GPUs: DOCKER_RESOURCE_NVIDIA-GPU in the first process of their running task,
    checked against what Swarm assigned and what the notebook's GPU monitor shows."""
    task = running_task(hub, user)
    node = hub.engine.nodes[task["NodeID"]]
    container = node.client.containers.get(task["Status"]["ContainerStatus"]["ContainerID"])
    values = {v for k, v in process_environ(container) if k == "DOCKER_RESOURCE_NVIDIA-GPU"}
    assert len(values) == 1, f"{user}: DOCKER_RESOURCE_NVIDIA-GPU missing or ambiguous: {values}"
    assigned = {r["NamedResourceSpec"]["Value"] for r in task.get("GenericResources") or []}
    gpus = set(values.pop().split(","))
    assert gpus == assigned, f"{user}: the process has {gpus}, Swarm assigned {assigned}"
    r = requests.get(f"{hub.url}/user/{user}/api/gpus", headers={"Authorization": f"token {hub.token}"}, timeout=60)
    assert r.status_code == 200, r.text
    shown = {g["uuid"] for g in r.json()["gpus"]}
    assert shown == gpus, f"{user}: the GPU monitor shows {shown}, the task was given {gpus}"
    return gpus


def holders(hub) -> dict[str, str]:
    """GPU -> the user holding it, as the admin's GPU overview shows it (the hub's ledger)."""
    r = hub.api("GET", "/gpus")
    assert r.status_code == 200, r.text
    return {g["uuid"]: g["holder"]["user"] for g in r.json()["gpus"] if g["holder"]}


def node_of(hub, user: str) -> str:
    return hub.engine.client.nodes.get(running_task(hub, user)["NodeID"]).attrs["Description"]["Hostname"]


def start(hub, user: str, options=GPU) -> set[str]:
    r = hub.spawn(user, options)
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()}"
    hub.wait_ready(user, timeout=300)
    return task_gpus(hub, user)


def test_three_users_two_gpus_each_on_four_then_hub_killed(swarm_hub):
    hub = swarm_hub
    uuids = {d["uuid"] for d in hub.engine.gpu_config["devices"]}
    hub.add_users("alice", "bob", "carol")
    assert free_in_form(hub) == (4, 4)

    alice = start(hub, "alice")
    bob = start(hub, "bob")
    assert len(alice) == len(bob) == 2
    assert alice.isdisjoint(bob) and alice | bob == uuids
    assert {node_of(hub, "alice"), node_of(hub, "bob")} == {"gpunode-1", "gpunode-2"}  # 2 GPUs per node
    assert free_in_form(hub) == (0, 4)

    r = hub.spawn("carol", GPU)
    assert r.status_code == 409, r.text
    assert r.json()["message"] == ("No NVIDIA A100-SXM4-80GB is free right now: 0 of 4 free. Try again later. "
                                   'Pick "GPU notebook, waits its turn" to wait in the queue instead.')
    assert hub.user("carol")["servers"] == {}
    assert services(hub) == [f"{hub.prefix}-alice", f"{hub.prefix}-bob"]

    # a hub killed and started again reads the GPUs back from the services' tasks
    hub.stop(sig=signal.SIGKILL)
    hub.start()
    assert free_in_form(hub) == (0, 4)
    r = hub.spawn("carol", GPU)
    assert r.status_code == 409, r.text
    assert task_gpus(hub, "alice") == alice and task_gpus(hub, "bob") == bob

    for user in ("alice", "bob"):  # the restarted hub checks the servers it finds before they can be stopped
        assert hub.wait_ready(user, timeout=300)["pending"] is None
    hub.stop_server("alice")
    assert services(hub) == [f"{hub.prefix}-bob"]
    carol = start(hub, "carol")
    assert carol == alice and carol.isdisjoint(task_gpus(hub, "bob"))
    assert free_in_form(hub) == (0, 4)



def test_a_notebook_gpu_job_is_refused_with_a_sentence_and_nothing_runs(swarm_hub):
    """gpu-swarm runs no notebook GPU jobs (gpu-docker's runner would make a plain container, which
    Swarm gives no GPUs): on a hub with the job API, a user is told so and nothing runs or is held."""
    hub = swarm_hub
    hub.stop()
    with open(hub.dir / "jupyterhub_config.py", "a") as config:
        config.write("\nfrom gpuspawner.hub.setup import configure\nconfigure(c)\n")
    hub.start()
    hub.add_users("dana")
    r = hub.api("POST", "/users/dana/gpu-jobs", json={**GPU, "notebook": "report.ipynb"})
    assert r.status_code == 501, r.text
    assert r.json()["message"] == (
        "This hub's backend (gpu-swarm) does not run notebook GPU jobs: run the notebook in your server "
        "instead, or ask an admin for a backend that runs them (gpu-local, gpu-docker, gpu-kube, gpu-slurm).")
    options = hub.api("GET", "/users/dana/gpu-job-options")  # JupyterLab's job dialog then offers no GPU types
    assert options.status_code == 501 and options.json()["message"] == r.json()["message"]
    assert hub.api("GET", "/users/dana/gpu-jobs").json() == {"jobs": []}
    assert services(hub) == [] and hub.containers() == []
    assert free_in_form(hub) == (4, 4)


def test_services_removed_or_made_behind_the_hubs_back_are_counted_without_a_restart(swarm_hub):
    hub = swarm_hub
    hub.add_users("alice")
    start(hub, "alice")
    assert free_in_form(hub) == (2, 4)
    # an admin removes alice's service (docker service rm): once Swarm has shut its task down, its
    # GPUs go back, no restart needed
    hub.engine.client.services.get(f"{hub.prefix}-alice").remove()
    deadline = time.monotonic() + 90
    while free_in_form(hub) != (4, 4):
        assert time.monotonic() < deadline, f"alice's GPUs still held\n{hub.log()}"
        time.sleep(1)
    assert "gpu-swarm: alice/'s GPU charge (2) freed: no live service of it" in hub.log_path.read_text()

    # a service of this hub no spawn of this hub process made (labelled as the hub labels its servers')
    # reserving a GPU: once Swarm assigns it one, that GPU is counted
    hub.engine.client.services.create(
        IMAGE_TAG, ["sleep", "300"], name=f"{hub.prefix}-ghost", labels={HUB: hub.hub_id, OWNER: "ghost/"},
        resources=docker.types.Resources(generic_resources={"NVIDIA-GPU": 1}))
    deadline = time.monotonic() + 90
    while free_in_form(hub) != (3, 4):
        assert time.monotonic() < deadline, f"the ghost's GPU is not counted\n{hub.log()}"
        time.sleep(1)
    assert (f"gpu-swarm: service {hub.prefix}-ghost of ghost/ counted: it holds 1 GPU(s) the hub did not count"
            in hub.log_path.read_text())


def test_two_gpus_split_over_nodes_are_refused_then_a_queued_request_waits_for_a_whole_node(swarm_hub):
    hub = swarm_hub
    hub.add_users("alice", "bob", "carol")
    one = {**GPU, "gpus": 1}
    alice, bob = start(hub, "alice", one), start(hub, "bob", one)
    assert len(alice) == len(bob) == 1 and alice.isdisjoint(bob)
    alice_node = running_task(hub, "alice")["NodeID"]
    # Swarm spreads tasks over nodes: one free A100 is left on each
    assert alice_node != running_task(hub, "bob")["NodeID"], "Swarm placed both 1-GPU servers on one node"
    assert free_in_form(hub) == (2, 4)
    # the hub claimed the A100 beside alice's for bob (best fit), Swarm gave him one on the other node: the
    # claim is corrected (the spawn's second step), and the admin's overview names the GPUs Swarm gave
    (bobs,) = bob
    assert f"Swarm assigned GPU(s) {bobs}" in hub.log_path.read_text(), hub.log()
    assert holders(hub) == {**dict.fromkeys(alice, "alice"), bobs: "bob"}

    r = hub.spawn("carol", GPU)  # 2 free in all, but not on one node: Swarm could never place it
    assert r.status_code == 409, r.text
    assert r.json()["message"].startswith(
        "2 x NVIDIA A100-SXM4-80GB were requested but at most 1 is free on one machine (2 of 4 free in all)."
    ), r.text
    assert hub.user("carol")["servers"] == {} and services(hub) == [f"{hub.prefix}-alice", f"{hub.prefix}-bob"]

    r = hub.spawn("carol", QUEUED)
    assert r.status_code in (201, 202) and hub.user("carol")["servers"][""]["pending"] == "spawn", r.text
    messages, ready, stopped = [], False, False
    with hub.api("GET", "/users/carol/server/progress", stream=True) as stream:
        for line in stream.iter_lines(decode_unicode=True):
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            messages.append(event.get("message", ""))
            if not stopped and "in the queue" in messages[-1]:
                assert services(hub) == [f"{hub.prefix}-alice", f"{hub.prefix}-bob"]  # nothing made while waiting
                hub.stop_server("alice", timeout=120)
                stopped = True
            if event.get("ready") or event.get("failed"):
                ready = bool(event.get("ready"))
                break
    text = "\n".join(messages)
    assert ready and stopped, text
    assert "Waiting for a free GPU: number 1 in the queue" in text, text
    node = hub.engine.nodes[alice_node]
    assert f"Reserved 2 GPU(s) on {node.hostname}" in text and f"Creating Swarm service {hub.prefix}-carol" in text
    # alice's GPUs went back to the hub only once Swarm had shut her task down: carol's never waits on Swarm
    assert "insufficient resources" not in text, text

    node_gpus = {d["uuid"] for d in json.loads(node.gpus_path.read_text())["devices"]}
    carol = task_gpus(hub, "carol")
    assert alice < carol == node_gpus and carol.isdisjoint(task_gpus(hub, "bob"))
    assert running_task(hub, "carol")["NodeID"] == alice_node
    assert free_in_form(hub) == (1, 4)


def test_a_task_the_nvidia_hook_refuses_fails_the_spawn_at_once_with_swarms_reason(swarm_hub):
    hub = swarm_hub
    hub.add_users("dave")
    nodes = list(hub.engine.nodes.values())
    configs = {node: json.loads(node.gpus_path.read_text()) for node in nodes}
    try:
        for node in nodes:  # the nodes still advertise their GPUs, but their drivers no longer see them
            fakenvml.write_config(node.gpus_path, {**configs[node], "devices": []})
        r = hub.spawn("dave", GPU)
        if r.status_code in (201, 202):  # failed after JupyterHub's slow_spawn_timeout: the progress says it
            with hub.api("GET", "/users/dave/server/progress", stream=True) as stream:
                events = [json.loads(line[5:]) for line in stream.iter_lines(decode_unicode=True)
                          if line.startswith("data:")]
            message = next(e["message"] for e in events if e.get("failed"))
        else:
            assert r.status_code == 500, r.text
            message = r.json()["message"]
        assert message.startswith(f"Swarm could not start your server (service {hub.prefix}-dave, node "), message
        assert "nvidia-container-cli: device error: GPU-" in message and "unknown device" in message, message
        assert hub.user("dave")["servers"] == {} and services(hub) == []  # nothing left, no GPU held
        assert free_in_form(hub) == (4, 4)
    finally:
        for node, config in configs.items():
            fakenvml.write_config(node.gpus_path, config)
    assert len(start(hub, "dave")) == 2


# SwarmSpawner's documentation (spawner-types.md), as a site copies it, with DockerSpawner's options it
# says SwarmSpawner shares (the image, allowed_images) and its own extra_placement_spec; the hub's
# address and this test's names come from the harness.
SWARM_DOCS_CONFIG = """
import os
c.JupyterHub.spawner_class = 'gpu-swarm'  # was: 'dockerspawner.SwarmSpawner'
network_name = os.environ['DOCKER_NETWORK_NAME']
c.SwarmSpawner.network_name = network_name
c.SwarmSpawner.extra_host_config = {'network_mode': network_name}
c.DockerSpawner.use_internal_ip = True  # (jupyterhub-deploy-docker's; no ingress routing mesh on this kernel)
c.DockerSpawner.image = os.environ['NOTEBOOK_IMAGE']
c.Spawner.cmd = ['jupyterhub-singleuser']  # docker-image.md: the image's CMD, "or the c.Spawner.cmd configuration"
c.DockerSpawner.allowed_images = '*'
c.SwarmSpawner.extra_placement_spec = { 'constraints' : ['node.role == worker'] }
c.GPUSwarmSpawner.gpu_hub_id = settings["hub_id"]
c.DockerSpawner.prefix = settings["prefix"]
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
"""


def failure(hub, user: str, r) -> str:
    """The refusal of a spawn: the REST answer, or (past JupyterHub's slow_spawn_timeout) its progress."""
    if r.status_code != 202:
        return f"{r.status_code} {r.json()['message']}"
    with hub.api("GET", f"/users/{user}/server/progress", stream=True) as stream:
        events = [json.loads(line[5:]) for line in stream.iter_lines(decode_unicode=True) if line.startswith("data:")]
    return "progress " + next(e["message"] for e in events if e.get("failed"))


def test_swarmspawner_docs_config_works_unchanged_with_an_image_only_on_its_nodes(swarm_engine, tmp_path,
                                                                                   fakenvml_libdir):
    """pull_policy "skip" (SwarmSpawner's default): the image need not be on the hub's own engine. (SwarmSpawner
    reads the image's CMD there when ``c.Spawner.cmd`` is not set; the docs' config sets it.)"""
    from dockerhub import DockerHub
    from engine import IMAGE_TAG
    from hub import BASE_HUB_CONFIG

    (worker,) = [e for e in swarm_engine.nodes.values() if e is not swarm_engine]
    image = "gpuspawner-on-the-worker-only:1"
    worker.client.images.get(IMAGE_TAG).tag(*image.split(":"))
    hub = DockerHub(tmp_path / "hub", swarm_engine, fakenvml.env(fakenvml_libdir, swarm_engine.gpus_path),
                    swarm_engine.dir, [], spawner_class="gpu-swarm")
    (hub.dir / "jupyterhub_config.py").write_text(BASE_HUB_CONFIG + SWARM_DOCS_CONFIG)
    hub.env.update({"DOCKER_NETWORK_NAME": "host", "NOTEBOOK_IMAGE": image})
    hub.start()
    try:
        hub.add_users("ola", "pia")
        gpus = start(hub, "ola", {})  # the default profile: one GPU, any model
        assert len(gpus) == 1 and node_of(hub, "ola") == worker.hostname
        service = hub.engine.client.services.get(f"{hub.prefix}-ola")
        assert service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"] == image
        with pytest.raises(docker.errors.ImageNotFound):
            swarm_engine.client.images.get(image)  # never on the hub's engine
        assert free_in_form(hub) == (3, 4)

        # an image no node has or can pull: a 400 naming it (as gpu-docker), nothing left
        r = hub.spawn("pia", {"image": "gpuspawner-nowhere:1"})
        said = failure(hub, "pia", r)
        assert said.split(" ", 1)[0] in ("400", "progress"), said
        assert "Image gpuspawner-nowhere:1 could not be found on Swarm node " in said, said
        assert hub.user("pia")["servers"] == {} and services(hub) == [f"{hub.prefix}-ola"]
        assert free_in_form(hub) == (3, 4)
    finally:
        hub.close()
        for service in swarm_engine.client.services.list():
            if service.name.startswith(hub.prefix + "-"):
                service.remove()
