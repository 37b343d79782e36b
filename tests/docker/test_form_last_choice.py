"""gpu-docker and gpu-swarm preselect a user's last choice in the spawn form (profile, GPU model, count, image).

A real spawner object of each class renders its form for a user whose last user_options
(JupyterHub keeps them in its database) are set. gpu-docker's form reads the hub's inventory
(a static one here) and needs no engine; gpu-swarm's reads the swarm's nodes, so a real
one-node swarm (a private dockerd) advertises its GPUs. gpu-local: tests/integration/
test_form_first_hour.py; gpu-kube: tests/kube/test_kubespawner_profiles.py; gpu-slurm:
tests/slurm/test_slurm_form_last_choice.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets.config import Config

from engine import Engine, unavailable_reason
from forms import Checked
from gpuspawner.backends.docker.spawner import GPUDockerSpawner
from gpuspawner.backends.swarm.spawner import GPUSwarmSpawner
from gpuspawner.simulation import simulated_devices
from needs import missing

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU", "gpu_counts": [1, 2], "default_gpus": 1, "default": True},
    {"slug": "big", "display_name": "Big", "gpu_models": ["a100", "t4"], "gpu_counts": [1, 2], "default_gpus": 1},
]
IMAGES = {"base": "gpuspawner/singleuser:test", "torch": "example/torch:2.3"}
LAST = {"profile": "big", "gpus": 2, "gpu_model": "t4", "image": "torch"}  # none of them a default
T4_NAME = "Tesla T4"


def config(**docker) -> Config:
    c = Config()
    c.GPUSpawnerMixin.gpu_profiles = PROFILES
    c.DockerSpawner.allowed_images = IMAGES
    c.DockerSpawner.image = IMAGES["base"]
    for key, value in docker.items():
        setattr(c.DockerSpawner, key, value)
    return c


async def shown(cls, c: Config, last: dict | None) -> Checked:
    spawner = cls(config=c, user=SimpleNamespace(name="ann", groups=[]))
    if last is not None:
        spawner.user_options = dict(last)
    return Checked(await spawner._render_options_form())


def assert_last_choice(checked: Checked) -> None:
    assert checked.radios["profile"] == "big"
    assert (checked.selected["gpu_model-big"], checked.selected["gpus-big"], checked.selected["image-big"]) == (
        "t4", "2", "torch")


async def test_gpu_docker_preselects_the_last_choice(monkeypatch):
    monkeypatch.setattr(GPUDockerSpawner, "_client", None)  # DockerSpawner keeps one client per class
    c = config(client_kwargs={"base_url": "unix:///nonexistent/docker.sock"})  # the form reads no engine
    c.GPUSpawnerMixin.gpu_inventory = "static"
    c.GPUSpawnerMixin.static_gpus = [{"uuid": d["uuid"], "name": d["name"], "host": "gpu-host"}
                                     for d in simulated_devices(a100=2, t4=2)]
    assert_last_choice(await shown(GPUDockerSpawner, c, LAST))
    fresh = await shown(GPUDockerSpawner, c, None)  # a new user: the defaults
    assert fresh.radios["profile"] == "gpu" and fresh.selected["image-big"] == "base"


@pytest.fixture(scope="module")
def swarm_node(tmp_path_factory):
    """A one-node swarm whose node advertises 2 T4s (``NVIDIA-GPU`` generic resources, model in its label)."""
    reason = unavailable_reason()
    if reason:
        missing(f"no Docker engine can run here: {reason}")
    devices = simulated_devices(a100=0, t4=2)
    engine = Engine([a for d in devices for a in ("--node-generic-resource", f"NVIDIA-GPU={d['uuid']}")],
                    hostname="gpunode-form")
    try:
        engine.start()
        engine.init_swarm(T4_NAME)
        yield engine
    finally:
        engine.stop()


@pytest.mark.docker
async def test_gpu_swarm_preselects_the_last_choice(swarm_node, monkeypatch):
    monkeypatch.setattr(GPUSwarmSpawner, "_client", None)
    c = config(client_kwargs={"base_url": swarm_node.url})
    assert_last_choice(await shown(GPUSwarmSpawner, c, LAST))
    assert (await shown(GPUSwarmSpawner, c, None)).radios["profile"] == "gpu"
