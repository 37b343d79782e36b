"""dockerspawner 14.0.0's own tests, unmodified, with gpu-docker and gpu-swarm in their parents' place.

``GPUDockerSpawner`` stands where their tests import ``DockerSpawner`` (``dockerspawner`` and
``dockerspawner.dockerspawner``), ``GPUSwarmSpawner`` where they import ``SwarmSpawner``;
``SystemUserSpawner`` stays the parent's. Modes (see :mod:`parentswap`): ``parent`` (the
baseline), ``cpu`` (the GPU classes with only a CPU profile) and ``default`` (gpuspawner's
default profiles, on 4 stand-in GPUs: their servers get a GPU each; the swarm node
advertises none, so gpu-swarm offers its CPU profile, as a hub that finds no GPUs does).

What their tests need, made here once for the three runs: a private dockerd whose default
``bridge`` network is its own interface (their tests use it by name; the hub is reached at
its address, ``HUB_CONNECT_IP``), a one-node swarm on it, their default image
(``quay.io/jupyterhub/singleuser:6.1``, and ``:4.0``, ``:4``: the project's single-user
image tagged so) and Docker Hub's ``busybox:1.29.1`` and ``busybox:latest`` served by a
registry on loopback (``tests/docker/registry.py``), which also answers "not found" for
images it lacks. JupyterHub 6 and this kernel need a little more: ``dockersuite.py``.

Target: 39 of their 40 tests in every mode; the 40th, SystemUserSpawner's, needs a
docker-stacks image (its container exits at start with the project's image). Allowed
failures are listed in ``docs/compatibility.md`` with their reason.
"""

from __future__ import annotations

import pytest

import fakenvml
from engine import Engine, free_port, gpu_config, unavailable_reason
from needs import missing
from parentsuite import MODES, parent_tests, run_suite, unexpected
from registry import BUSYBOX, Registry, busybox_layer, make_image

pytestmark = pytest.mark.docker

TITLE = "dockerspawner 14.0.0"
SECTION = "DockerSpawner and SwarmSpawner (gpu-docker, gpu-swarm)"
TARGET = 39
TARGETS = [
    ("dockerspawner", "DockerSpawner"),
    ("dockerspawner.dockerspawner", "DockerSpawner"),  # volumes_test.py imports it from there
    ("dockerspawner", "SwarmSpawner", "gpuspawner.backends.swarm.spawner:GPUSwarmSpawner"),
]
#: their default image for JupyterHub 6.1, and the two test_allowed_image picks
THEIR_IMAGES = ("quay.io/jupyterhub/singleuser:6.1", "quay.io/jupyterhub/singleuser:4.0",
                "quay.io/jupyterhub/singleuser:4")


@pytest.fixture(scope="module")
def their_tests():
    return parent_tests("dockerspawner-14.0.0")


@pytest.fixture(scope="module")
def suite_engine(their_tests, tmp_path_factory):
    """The private dockerd (own default bridge, one-node swarm, their images) and the loopback registry."""
    reason = unavailable_reason()
    if reason:
        missing(f"no Docker engine can run here: {reason}")
    if not BUSYBOX.exists():
        missing(f"{BUSYBOX} is missing: busybox-static is not installed (scripts/setup installs it)")
    registry = Registry(tmp_path_factory.mktemp("registry"))
    layer = busybox_layer()
    for tag in ("1.29.1", "latest"):  # two different images, as on Docker Hub
        registry.add("library/busybox", tag, make_image(layer, {"org.gpuspawner.test.tag": tag}))
    registry.start()
    engine = Engine(default_bridge=True, env=registry.engine_env())
    try:
        engine.start()
        built = engine.client.images.get(engine.build_image())
        for name in THEIR_IMAGES:
            repository, _, tag = name.rpartition(":")
            built.tag(repository, tag)
        engine.client.swarm.init(advertise_addr="127.0.0.1", listen_addr=f"127.0.0.1:{free_port('127.0.0.1')}")
        fakenvml.write_config(engine.gpus_path, gpu_config(4))  # what the engine's stand-in hook checks
        yield engine
    finally:
        engine.stop()
        registry.stop()


@pytest.mark.parametrize("mode", MODES)
def test_dockerspawner_suite(mode, their_tests, suite_engine, fakenvml_libdir, tmp_path):
    env = {
        **suite_engine.env(),
        "HUB_CONNECT_IP": suite_engine.bridge_address,
        **fakenvml.env(fakenvml_libdir, suite_engine.gpus_path),  # the hub's NVML: 4 stand-in GPUs
    }
    result = run_suite(
        TITLE, their_tests, mode, targets=TARGETS, gpu_class="gpuspawner.backends.docker.spawner:GPUDockerSpawner",
        defaults={"simulated_gpus": True}, extra_plugins=("dockersuite",), env=env, workdir=tmp_path,
    )
    failures = unexpected(result, SECTION)
    assert failures == [], "\n".join(failures) + "\n\n" + result.output
    assert len(result.passed) >= TARGET, f"{result.summary()} passed\n" + "\n".join(result.failed) + result.output
