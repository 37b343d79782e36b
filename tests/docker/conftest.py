"""Fixtures for tests against a real Docker engine (started here, stopped by pid)."""

from __future__ import annotations

from pathlib import Path

import pytest

import fakenvml
from engine import Engine, gpu_config, unavailable_reason
from needs import missing


@pytest.fixture(scope="session")
def dockerd():
    """A private dockerd with the stand-in hook (no image built yet).

    Where no dockerd can run here, the Docker tests skip, saying why; in CI they fail (tests/needs.py).
    """
    reason = unavailable_reason()
    if reason:
        missing(f"no Docker engine can run here: {reason}")
    eng = Engine()
    try:
        try:
            eng.start()
        except RuntimeError as e:  # dockerd exited at once: this machine cannot run it
            last = [line for line in str(e).splitlines() if line.strip()][-1:]
            missing(f"dockerd cannot run here: {' '.join(last)}")
        yield eng
    finally:
        eng.stop()


@pytest.fixture(scope="session")
def engine(dockerd):
    """The private dockerd with the single-user image built on it."""
    dockerd.build_image()
    return dockerd


@pytest.fixture(scope="session")
def tensorflow_image(engine) -> str:
    """The TensorFlow notebook image (CPU TensorFlow here), built on the private engine."""
    from engine import TENSORFLOW_TAG

    return engine.build_image(TENSORFLOW_TAG, "tensorflow")


@pytest.fixture(scope="session")
def container_libdir(engine, fakenvml_libdir) -> Path:
    """The stand-in library in a folder containers' users may read (pytest's temp dirs are 0700)."""
    import shutil

    libdir = engine.dir / "fakenvml"
    libdir.mkdir(mode=0o755, exist_ok=True)
    libdir.chmod(0o755)
    target = libdir / fakenvml.LIBRARY_NAME
    shutil.copy(fakenvml_libdir / fakenvml.LIBRARY_NAME, target)
    target.chmod(0o755)
    return libdir


@pytest.fixture
def docker_hub(engine, tmp_path, fakenvml_libdir, container_libdir):
    """Factory: ``docker_hub(gpus=4, profiles=[...], **DockerHub options)`` -> a started hub.

    ``config``: a whole device file instead of ``gpus`` (e.g. ``fakenvml.layout(...)``).
    """
    from dockerhub import DockerHub

    hubs = []

    def make(gpus: int = 4, profiles=None, start: bool = True, config=None, **options):
        config = config or gpu_config(gpus)
        fakenvml.write_config(engine.gpus_path, config)
        hub = DockerHub(
            tmp_path / f"hub{len(hubs)}", engine,
            fakenvml.env(fakenvml_libdir, engine.gpus_path), container_libdir,
            profiles or PROFILES, **options,
        )
        hub.gpus = config["devices"]
        hubs.append(hub)
        if start:
            hub.start()
        return hub

    try:
        yield make
    finally:
        for hub in hubs:
            hub.close()


PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"],
     "gpu_counts": [1, 2, 4], "default_gpus": 1, "default": True},
]


@pytest.fixture(scope="session")
def swarm_engine(fakenvml_libdir):
    """A second private dockerd, a one-node swarm on loopback whose node advertises 4 A100s
    as generic resources ``NVIDIA-GPU=GPU-<uuid>`` (its own engine: the other Docker tests'
    engine changes its GPUs per test, a node's generic resources are fixed when dockerd starts)."""
    from gpuspawner.simulation import simulated_devices

    reason = unavailable_reason()
    if reason:
        missing(f"no Docker engine can run here: {reason}")
    config = {**gpu_config(4), "devices": simulated_devices(a100=4, t4=0)}
    args = [a for d in config["devices"] for a in ("--node-generic-resource", f"NVIDIA-GPU={d['uuid']}")]
    eng = Engine(args)
    try:
        eng.start()
        fakenvml.write_config(eng.gpus_path, config)
        eng.init_swarm(config["devices"][0]["name"])
        eng.build_image()
        eng.gpu_config = config
        yield eng
    finally:
        eng.stop()
