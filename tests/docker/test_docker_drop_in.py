"""gpu-docker as DockerSpawner: a DockerSpawner site's configuration works unchanged with the GPU class.

Each hub is a real JupyterHub spawning containers on the private engine. What a user
meets is read where they meet it: the REST answers, the spawn form, the container the
engine made (its image, GPUs, memory, volume), and the server's own answers through the
hub's proxy. DockerSpawner's behaviour that the GPU class keeps or improves:

- its documented configuration (image, network, volume, memory, ``allowed_images``)
  with only ``spawner_class`` changed: GPUs from the default profiles, the image picker
  beside the GPU choices, an image outside ``allowed_images`` refused;
- an image its registry does not have: 400 and a sentence (DockerSpawner: a bare 500);
- ``remove = False``: a user's stopped container is started again, with what it holds,
  on the GPUs it was made with;
- configuration that would give containers other GPUs is refused at hub start (or, from
  a callable, at create), never silently dropped.
"""

from __future__ import annotations

import time

import docker
import pytest
import requests

from dockerhub import free_in_form
from engine import IMAGE_TAG, device_requests, process_environ
from gpuspawner.gpu import model_slug
from hub import BASE_HUB_CONFIG, login
from registry import Registry
from test_docker_spawner import no_container

pytestmark = pytest.mark.docker

#: the images the docs' configuration names (tags of the project's image on the private engine)
SCIPY = "jupyter/scipy-notebook:8f56e3c47fec"
DATASCIENCE = "jupyter/datascience-notebook:8f56e3c47fec"

# DockerSpawner's documentation, as a site copies it: spawner-types.md, docker-image.md,
# data-persistence.md, the allowed_images reference and the jupyterhub-deploy-docker
# configuration it points to (the hub's own address comes from the test harness).
DOCS_CONFIG = """
import os
c.JupyterHub.spawner_class = 'gpu-docker'  # was: 'dockerspawner.DockerSpawner'
c.DockerSpawner.image = 'jupyter/scipy-notebook:8f56e3c47fec'
network_name = os.environ['DOCKER_NETWORK_NAME']
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.network_name = network_name
notebook_dir = os.environ.get('DOCKER_NOTEBOOK_DIR') or '/home/jovyan/work'
c.DockerSpawner.notebook_dir = notebook_dir
c.DockerSpawner.volumes = { 'jupyterhub-user-{username}': notebook_dir }
c.DockerSpawner.remove = True
c.Spawner.mem_limit = '2G'
c.DockerSpawner.allowed_images = {
    'SciPy': 'jupyter/scipy-notebook:8f56e3c47fec',
    'Data science': 'jupyter/datascience-notebook:8f56e3c47fec',
    'Team image': os.environ['TEAM_IMAGE'],
}
"""
#: what this machine needs besides (the hub's own id on the shared engine, a spawn's patience)
HARNESS = """
c.GPUDockerSpawner.gpu_hub_id = settings["hub_id"]
c.DockerSpawner.prefix = settings["prefix"]
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """An empty registry on loopback: every image it is asked for is "not found", as a registry says it."""
    reg = Registry(tmp_path_factory.mktemp("registry")).start()
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture
def docs_hub(docker_hub, engine, registry):
    built = engine.client.images.get(IMAGE_TAG)
    for name in (SCIPY, DATASCIENCE):
        repository, _, tag = name.rpartition(":")
        built.tag(repository, tag)
    hub = docker_hub(gpus=4, start=False)
    (hub.dir / "jupyterhub_config.py").write_text(BASE_HUB_CONFIG + DOCS_CONFIG + HARNESS)
    hub.env.update({"DOCKER_NETWORK_NAME": engine.network, "TEAM_IMAGE": f"{registry.address}/team/notebook:1"})
    hub.start()
    try:
        yield hub
    finally:
        hub.close()
        for volume in engine.client.volumes.list():
            if volume.name.startswith("jupyterhub-user-"):
                volume.remove(force=True)


def ready(hub, name: str, options: dict) -> docker.models.containers.Container:
    r = hub.spawn(name, options)
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()}"
    hub.wait_ready(name, timeout=300)
    return hub.container(name)


def gpus_of(container) -> list[str]:
    return [u for r in device_requests(container) if r.get("Driver") == "nvidia" for u in r["DeviceIDs"]]


def contents(hub, name: str) -> list[str]:
    """The files the user's server shows in its notebook directory (through the hub's proxy)."""
    r = requests.get(f"{hub.url}/user/{name}/api/contents", headers={"Authorization": f"token {hub.token}"},
                     timeout=60)
    assert r.status_code == 200, r.text
    return sorted(item["name"] for item in r.json()["content"])


def test_dockerspawner_docs_config_works_unchanged(docs_hub, engine):
    hub = docs_hub
    hub.add_users("ada", "bo")

    # the default profile: a GPU server, with everything the docs configure
    ada = ready(hub, "ada", {})
    assert len(gpus_of(ada)) == 1
    assert ada.attrs["Config"]["Image"] == SCIPY
    assert ada.attrs["HostConfig"]["Memory"] == 2 * 1024**3
    (mount,) = [m for m in ada.attrs["Mounts"] if m["Destination"] == "/home/jovyan/work"]
    assert mount["Name"] == "jupyterhub-user-ada"
    ada.exec_run(["sh", "-c", "echo results > /home/jovyan/work/results.txt"], user="root")
    assert contents(hub, "ada") == ["results.txt"]  # the notebook directory is the volume
    hub.stop_server("ada")
    assert no_container(hub, "ada")  # remove = True
    ada = ready(hub, "ada", {"profile": "cpu"})
    assert contents(hub, "ada") == ["results.txt"] and gpus_of(ada) == []  # the data persisted

    # DockerSpawner's image picker, beside the GPU choices of each profile
    html = login(hub, "bo").get(hub.url + "/hub/spawn").text
    assert 'name="gpus-gpu"' in html
    for profile in ("cpu", "gpu"):
        assert f'name="image-{profile}"' in html
    for name in ("SciPy", "Data science", "Team image"):
        assert f'<option value="{name}"' in html
    bo = ready(hub, "bo", {"profile": "gpu", "gpus": 2, "image": "Data science"})
    assert bo.attrs["Config"]["Image"] == DATASCIENCE and len(gpus_of(bo)) == 2
    assert free_in_form(hub) == (2, 4)
    hub.stop_server("bo")

    # an image that is not offered: 400, as DockerSpawner refuses it, before anything is held or made
    for image in ("jupyter/all-spark-notebook:latest", DATASCIENCE):  # (offered by its name, not its value)
        r = hub.spawn("bo", {"profile": "gpu", "image": image})
        assert r.status_code == 400, r.text
        assert r.json()["message"] == (f"image: {image!r} is not offered in profile 'gpu'; allowed: SciPy, "
                                       "Data science, Team image")
    assert hub.user("bo")["servers"] == {} and no_container(hub, "bo")
    assert free_in_form(hub) == (4, 4)


def test_an_image_its_registry_does_not_have_is_a_400_that_holds_nothing(docs_hub, registry):
    """DockerSpawner pulls it (pull_policy "ifnotpresent") and answers the registry's 404 with a bare 500."""
    hub = docs_hub
    hub.add_users("cy")
    image = f"{registry.address}/team/notebook:1"
    r = hub.spawn("cy", {"profile": "gpu", "gpus": 2, "image": "Team image"})
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert message.startswith(f"Image {image} does not exist: its registry says manifest for {image} not found"), (
        message)
    assert message.endswith("Choose another image, or ask an administrator to publish it.")
    assert any(line.startswith("GET /v2/team/notebook/manifests/1:") for line in registry.log), registry.log
    assert hub.user("cy")["servers"] == {} and no_container(hub, "cy")
    assert free_in_form(hub) == (4, 4)


def test_a_kept_container_starts_again_on_the_gpus_it_was_made_with(docker_hub):
    """remove = False: DockerSpawner restarts a user's stopped container; so does gpu-docker, with its GPUs."""
    hub = docker_hub(gpus=4, start=False)
    config = hub.dir / "jupyterhub_config.py"
    config.write_text(config.read_text() + "c.DockerSpawner.remove = False\n")
    hub.start()
    hub.add_users("kim", "lee")
    one_gpu = {"profile": "gpu", "gpus": 1}
    kim = ready(hub, "kim", one_gpu)
    made_with = gpus_of(kim)
    kim.exec_run(["sh", "-c", "echo kept > /home/jovyan/marker"])
    hub.stop_server("kim")
    kim.reload()
    assert kim.status == "exited" and free_in_form(hub) == (4, 4)  # kept, holding no GPU while stopped

    model = model_slug({d["uuid"]: d["name"] for d in hub.gpus}[made_with[0]])
    lee = ready(hub, "lee", {"profile": "gpu", "gpus": 2, "gpu_model": model})  # both of kim's model
    assert made_with[0] in gpus_of(lee)
    r = hub.spawn("kim", one_gpu)
    assert r.status_code == 409, r.text
    assert r.json()["message"].startswith(f"Your kept container {kim.name} cannot start again: ")
    assert "It runs only on the GPUs it was made with; try again when they are free" in r.json()["message"]
    kim.reload()
    assert kim.status == "exited" and free_in_form(hub) == (2, 4)

    hub.stop_server("lee")
    assert ready(hub, "kim", one_gpu).id == kim.id  # the same container, with what it held
    assert kim.exec_run(["cat", "/home/jovyan/marker"]).output == b"kept\n"
    assert {v for k, v in process_environ(hub.container("kim")) if k == "NVIDIA_VISIBLE_DEVICES"} == set(made_with)
    assert free_in_form(hub) == (3, 4)


NVIDIA_ALL = {"device_requests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]}


def test_a_setting_that_would_give_other_gpus_is_refused_never_dropped(docker_hub):
    # in the configuration: the hub does not start, and says why
    hub = docker_hub(gpus=4, start=False, extra_host_config=NVIDIA_ALL)
    with pytest.raises(RuntimeError) as info:
        hub.start()
    assert "hub exited with 1" in str(info.value)
    assert ("Refusing to start: GPUDockerSpawner: DockerSpawner.extra_host_config gives containers GPUs besides "
            "their own (the GPU device request {'Driver': 'nvidia', 'Count': -1, 'Capabilities': [['gpu']]}): "
            "GPUDockerSpawner gives each server exactly the GPUs placed for it") in hub.log_path.read_text()

    # from a callable (known only when a container is made): that spawn fails, saying why; nothing is left
    hub = docker_hub(gpus=4, start=False)
    config = hub.dir / "jupyterhub_config.py"
    config.write_text(config.read_text() + f"c.DockerSpawner.extra_host_config = lambda spawner: {NVIDIA_ALL!r}\n")
    hub.start()
    hub.add_users("max")
    r = hub.spawn("max", {"profile": "gpu", "gpus": 1})
    deadline = time.monotonic() + 60
    while r.status_code == 202 and hub.user("max")["servers"] and time.monotonic() < deadline:
        time.sleep(0.5)
    if r.status_code != 202:
        assert r.status_code == 500, r.text
        assert r.json()["message"].startswith(
            "This hub's configuration would give your server GPUs besides its own (the GPU device request "), r.text
    assert "gpu-docker gives each server exactly the GPUs placed for it" in hub.log_path.read_text()
    assert hub.user("max")["servers"] == {} and no_container(hub, "max")
    assert free_in_form(hub) == (4, 4)
