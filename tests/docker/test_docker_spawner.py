"""gpu-docker on a real Docker engine: exclusive GPUs, restarts, CUDA check, progress, failures.

Each test starts a real JupyterHub on this machine whose servers are
containers of the single-user image on a private dockerd (see engine.py). A
container's GPUs are read the way a user's code meets them: the
``NVIDIA_VISIBLE_DEVICES`` its first process got from the engine, the
engine's own record of the DeviceRequest, and NVML inside the container.
"""

from __future__ import annotations

import io
import json
import signal
import threading
import time
from collections import Counter

import docker
import pytest
import requests

from dockerhub import free_in_form
from engine import IMAGE_TAG, device_requests, visible_devices
from gpuspawner.backends.docker.objects import allocation_labels
from gpuspawner.gpu import GPU as Gpu

pytestmark = pytest.mark.docker

GPU = {"profile": "gpu", "gpus": 2, "gpu_model": "any"}


def gpu_set(container) -> set[str]:
    value = visible_devices(container)
    return set() if value in ("void", "none", "") else set(value.split(","))


def assert_exact_device_requests(hub) -> dict[str, set[str]]:
    """Every running container of the hub: one nvidia DeviceRequest naming its UUIDs, Count 0,
    agreeing with its labels and its process environment. Returns name -> GPUs."""
    held = {}
    for c in hub.containers():
        c.reload()
        if c.status != "running":
            continue
        requests_ = [r for r in device_requests(c) if r.get("Driver") == "nvidia"]
        labelled = [u for u in c.labels.get("org.gpuspawner.gpus", "").split(",") if u]
        if not labelled:
            assert requests_ == [], f"{c.name}: a CPU-only container got a GPU request {requests_}"
            assert gpu_set(c) == set()
        else:
            assert len(requests_) == 1, f"{c.name}: {requests_}"
            assert requests_[0]["Count"] == 0, f"{c.name}: count-based request {requests_[0]}"
            assert requests_[0]["DeviceIDs"] == labelled
            assert all(u.startswith("GPU-") for u in labelled)
            assert gpu_set(c) == set(labelled)
        held[c.name] = set(labelled)
    return held


def start(hub, name: str, options=GPU) -> set[str]:
    r = hub.spawn(name, options)
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()}"
    hub.wait_ready(name, timeout=300)
    return gpu_set(hub.container(name))


def no_container(hub, name: str, timeout: float = 30) -> bool:
    """Whether the user's container is gone (allowing the engine a moment to finish removing it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            hub.container(name)
        except docker.errors.NotFound:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)


def test_three_users_two_gpus_each_on_four(docker_hub):
    hub = docker_hub(gpus=4)
    uuids = {d["uuid"] for d in hub.gpus}
    hub.add_users("alice", "bob", "carol")

    alice = start(hub, "alice")
    bob = start(hub, "bob")
    assert len(alice) == len(bob) == 2
    assert alice.isdisjoint(bob) and alice | bob == uuids
    assert assert_exact_device_requests(hub) == {f"{hub.prefix}-alice": alice, f"{hub.prefix}-bob": bob}

    r = hub.spawn("carol", GPU)
    assert r.status_code == 409, r.text
    assert "No GPU is free right now: 0 of 4 free" in r.json()["message"]
    assert hub.user("carol")["servers"] == {}
    assert no_container(hub, "carol")

    hub.stop_server("alice")
    assert no_container(hub, "alice")
    assert start(hub, "carol") == alice
    assert_exact_device_requests(hub)


def test_containers_removed_or_made_behind_the_hubs_back_are_counted_without_a_restart(docker_hub, engine):
    hub = docker_hub(gpus=4)
    hub.add_users("kim")
    kim = start(hub, "kim")
    assert free_in_form(hub) == (2, 4)
    # an admin removes kim's container (docker rm -f): its GPUs go back, no restart needed
    hub.container("kim").remove(force=True)
    deadline = time.monotonic() + 60
    while free_in_form(hub) != (4, 4):
        assert time.monotonic() < deadline, f"kim's GPUs still held\n{hub.log()}"
        time.sleep(1)
    assert "gpu-docker: kim/'s GPU charge (2) freed: no live container of it" in hub.log_path.read_text()

    # a container of this hub that no spawn of this hub process made (labelled as the hub labels its
    # servers': another process of the hub on the same engine, say) holds a GPU: it is counted
    ghost = next(Gpu(host="localhost", index=i, uuid=d["uuid"], name=d["name"])
                 for i, d in enumerate(hub.gpus) if d["uuid"] not in kim)
    engine.client.containers.run(IMAGE_TAG, ["sleep", "300"], name=f"{hub.prefix}-ghost", detach=True,
                                 labels=allocation_labels(hub.hub_id, "ghost/", [ghost]))
    deadline = time.monotonic() + 60
    while free_in_form(hub) != (3, 4):
        assert time.monotonic() < deadline, f"the ghost's GPU is not counted\n{hub.log()}"
        time.sleep(1)
    assert (f"gpu-docker: container {hub.prefix}-ghost of ghost/ counted: it holds 1 GPU(s) the hub did not count"
            in hub.log_path.read_text())
    # and it is not given to anyone else: a 4-GPU request does not fit, a 2-GPU one gets two others
    hub.add_users("lee")
    assert hub.spawn("lee", {"profile": "gpu", "gpus": 4, "gpu_model": "any"}).status_code == 409
    assert ghost.uuid not in start(hub, "lee")


def test_nvml_inside_a_container_shows_only_its_gpus(docker_hub):
    hub = docker_hub(gpus=4)
    names = {d["uuid"]: d["name"] for d in hub.gpus}
    hub.add_users("dana", "erin")
    dana = start(hub, "dana", {"profile": "gpu", "gpus": 2, "gpu_model": "t4"})
    erin = start(hub, "erin", {"profile": "cpu"})
    assert erin == set() and {names[u] for u in dana} == {"Tesla T4"}

    code = (
        "import json, pynvml\n"
        "pynvml.nvmlInit()\n"
        "n = pynvml.nvmlDeviceGetCount()\n"
        "print(json.dumps([pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]))\n"
    )
    for user, expected in (("dana", dana), ("erin", set())):
        container = hub.container(user)
        # a login shell in the container sees what its server sees: the engine's environment
        login = "export $(tr '\\0' '\\n' < /proc/1/environ | grep ^NVIDIA_VISIBLE_DEVICES=); python3 -c \"$0\""
        result = container.exec_run(["sh", "-c", login, code])
        assert result.exit_code == 0, result.output.decode()
        assert set(json.loads(result.output.decode().strip().splitlines()[-1])) == expected
    assert_exact_device_requests(hub)


def test_spawn_progress_in_plain_words(docker_hub):
    hub = docker_hub(gpus=4, slow_spawn_timeout=0)
    hub.add_users("fay")
    r = hub.spawn("fay", {"profile": "gpu", "gpus": 1})
    assert r.status_code == 202, r.text
    messages, ready = [], False
    with hub.api("GET", "/users/fay/server/progress", stream=True) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        for line in stream.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            messages.append(event.get("message", ""))
            if event.get("ready") or event.get("failed"):
                ready = bool(event.get("ready"))
                break
    text = "\n".join(messages)
    assert ready, text
    gpu = gpu_set(hub.container("fay")).pop()
    for expected in ("Placing 1 GPU(s), any model", "Reserved 1 GPU(s) on", gpu, "Checking image",
                     f"Creating container {hub.prefix}-fay", "waiting for the Jupyter server"):
        assert expected in text, f"{expected!r} not in progress:\n{text}"
    order = [text.index(s) for s in ("Placing", "Reserved", "Creating container", "waiting for the Jupyter")]
    assert order == sorted(order), text


def test_image_needing_newer_cuda_is_refused_and_leaves_no_container(docker_hub, engine):
    image = "gpuspawner-test-cuda126:latest"
    dockerfile = (
        f"FROM {IMAGE_TAG}\n"
        'ENV NVIDIA_REQUIRE_CUDA="cuda>=12.6 brand=tesla,driver>=470,driver<471" CUDA_VERSION=12.6.3\n'
    )
    engine.client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=image, rm=True)
    profiles = [{"slug": "gpu", "display_name": "GPU", "gpu_models": ["any"], "gpu_counts": [1, 2],
                 "default_gpus": 1, "images": [IMAGE_TAG, image], "default": True}]
    hub = docker_hub(gpus=4, profiles=profiles)
    hub.add_users("gabe")
    r = hub.spawn("gabe", {"profile": "gpu", "gpus": 2, "image": image})
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert message.startswith(f"Image {image} needs CUDA 12.6 but the driver on host "), message
    assert "supports CUDA 12.4 at most" in message and "550.54.15" in message
    assert no_container(hub, "gabe")
    assert hub.user("gabe")["servers"] == {}
    assert free_in_form(hub) == (4, 4)  # the refusal gave the GPUs back
    assert len(start(hub, "gabe", {"profile": "gpu", "gpus": 2, "image": IMAGE_TAG})) == 2


def test_missing_image_is_reported_and_frees_the_gpus(docker_hub):
    """pull_policy "never" (the test hubs') and an image the host lacks: a 400 saying so, as for a
    registry's "not found" (tests/docker/test_docker_drop_in.py); DockerSpawner answers a bare 500."""
    profiles = [{"slug": "gpu", "display_name": "GPU", "gpu_models": ["any"], "gpu_counts": [2],
                 "default_gpus": 2, "images": ["gpuspawner-no-such-image:1"], "default": True}]
    hub = docker_hub(gpus=4, profiles=profiles)
    hub.add_users("hank")
    r = hub.spawn("hank", {"profile": "gpu", "gpus": 2, "image": "gpuspawner-no-such-image:1"})
    assert r.status_code == 400, r.text
    assert r.json()["message"] == ("Image gpuspawner-no-such-image:1 is not on the Docker host, and pull_policy "
                                   "'never' keeps the hub from pulling it. Choose another image, or ask an "
                                   "administrator to pull it.")
    assert no_container(hub, "hank")
    assert free_in_form(hub) == (4, 4)


def test_container_exiting_at_start_frees_its_gpus(docker_hub, engine):
    image = "gpuspawner-test-crash:latest"
    dockerfile = f'FROM {IMAGE_TAG}\nENTRYPOINT ["/bin/sh", "-c", "echo server broke >&2; exit 3"]\n'
    engine.client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=image, rm=True)
    profiles = [{"slug": "gpu", "display_name": "GPU", "gpu_models": ["any"], "gpu_counts": [2],
                 "default_gpus": 2, "images": [image], "default": True}]
    hub = docker_hub(gpus=4, profiles=profiles)
    hub.add_users("ivy")
    r = hub.spawn("ivy", {"profile": "gpu", "gpus": 2, "image": image})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and hub.user("ivy")["servers"]:
        time.sleep(0.5)
    assert hub.user("ivy")["servers"] == {}, f"{r.status_code} {r.text}"
    assert no_container(hub, "ivy")
    assert free_in_form(hub) == (4, 4)


def test_unknown_gpu_is_refused_by_the_runtime_hook_and_released(docker_hub, engine, tmp_path):
    """The hub believes in a GPU the engine's host lacks: the hook refuses it, as NVIDIA's does."""
    import fakenvml
    from engine import gpu_config

    hub = docker_hub(gpus=4, start=False)
    ghost = gpu_config(6)  # the hub's NVML lists 6 GPUs; the engine's host has 4
    for d in ghost["devices"]:
        d["uuid"] = d["uuid"][:-4] + "beef"
    fakenvml.write_config(tmp_path / "hub-gpus.json", ghost)
    hub.env["FAKENVML_CONFIG"] = str(tmp_path / "hub-gpus.json")
    hub.start()
    hub.add_users("jack")
    r = hub.spawn("jack", GPU)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and hub.user("jack")["servers"]:
        time.sleep(0.5)
    assert hub.user("jack")["servers"] == {}, f"{r.status_code} {r.text}"
    if r.status_code >= 400:
        assert "unknown device" in r.json()["message"], r.text
    assert no_container(hub, "jack")
    assert "unknown device" in hub.log_path.read_text()
    assert free_in_form(hub) == (6, 6)


def test_docker_engine_unreachable_is_said_plainly(docker_hub, tmp_path):
    hub = docker_hub(gpus=4, start=False)
    hub.env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"
    hub.start()
    hub.add_users("kim")
    r = hub.spawn("kim", GPU)
    assert r.status_code == 503, r.text
    assert f"The Docker engine at unix://{tmp_path}/no-engine.sock cannot be reached" in r.json()["message"]
    assert hub.user("kim")["servers"] == {}


def test_hub_killed_during_concurrent_spawns_then_ledger_matches_containers(docker_hub):
    profiles = [{"slug": "gpu", "display_name": "GPU", "gpu_models": ["any"], "gpu_counts": [1],
                 "default_gpus": 1, "default": True}]
    hub = docker_hub(gpus=16, profiles=profiles)
    users = [f"u{n:02d}" for n in range(20)]
    hub.add_users(*users)

    def spawn(name):
        try:
            hub.spawn(name, {"profile": "gpu", "gpus": 1})
        except requests.RequestException:
            pass  # the hub died under us: that is the point

    threads = [threading.Thread(target=spawn, args=(u,), daemon=True) for u in users]
    for t in threads:
        t.start()
    # kill it mid-storm: once a few containers run, while others are still being made
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(c.status == "running" for c in hub.containers()) < 4:
        time.sleep(0.05)
    in_flight = sum(t.is_alive() for t in threads)
    hub.stop(sig=signal.SIGKILL)
    states = sorted(c.status for c in hub.containers())
    assert in_flight, "every spawn had answered before the kill: the test did not kill mid-spawn"
    print(f"killed with {in_flight} spawn requests in flight; containers: {Counter(states)}")
    for t in threads:
        t.join(timeout=120)

    t0 = time.monotonic()
    hub.start(timeout=300)
    # the hub checks the servers it remembers in the background (init_spawners_timeout): let it finish
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pending = [u for u in users if (hub.user(u)["servers"].get("") or {}).get("pending")]
        if not pending:
            break
        time.sleep(0.5)
    assert not pending, f"servers still pending after the restart: {pending}\n{hub.log()}"
    print(f"hub restarted and checked its servers in {time.monotonic() - t0:.1f} s")
    held = assert_exact_device_requests(hub)
    # every container still running is a server the restarted hub knows and serves
    for name in held:
        server = hub.user(name[len(hub.prefix) + 1:])["servers"].get("")
        assert server and server["ready"], f"{name} runs but the hub does not list it as ready\n{hub.log()}"
    everyone = [u for uuids in held.values() for u in uuids]
    assert len(everyone) == len(set(everyone)), f"a GPU is in two containers: {held}"
    free, total = free_in_form(hub)
    assert total == 16
    assert free == 16 - len(everyone), (
        f"ledger says {16 - free} GPUs held, running containers hold {len(everyone)}; "
        f"states at kill: {states}\n{hub.log()}"
    )
    assert held == assert_exact_device_requests(hub)  # nothing moved while we looked
    # the hub still works: new spawns take only free GPUs
    hub.add_users("late")
    if free:
        got = start(hub, "late", {"profile": "gpu", "gpus": 1})
        assert got.isdisjoint(everyone)
    else:
        assert hub.spawn("late", {"profile": "gpu", "gpus": 1}).status_code == 409
