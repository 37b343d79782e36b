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
    """A two-node swarm of two more private dockerds on loopback, each node (its own hostname)
    advertising 2 A100s as generic resources ``NVIDIA-GPU=GPU-<uuid>``, and the stand-in
    ``nvidia-container-runtime`` as each node's default runtime, which gives a task the GPUs Swarm
    assigned it (its own engines: a node's generic resources are fixed when its dockerd starts).

    Yields the manager's engine; ``.nodes`` maps each node's ID to its engine, ``.gpu_config``
    lists all 4 GPUs (each node's device file holds its own two).
    """
    import shutil

    from gpuspawner.simulation import simulated_devices

    reason = unavailable_reason()
    if reason:
        missing(f"no Docker engine can run here: {reason}")
    devices = simulated_devices(a100=4, t4=0)
    model = devices[0]["name"]
    engines = []
    try:
        for n, (address, mine) in enumerate((("127.0.0.1", devices[:2]), ("127.0.0.2", devices[2:]))):
            args = [a for d in mine for a in ("--node-generic-resource", f"NVIDIA-GPU={d['uuid']}")]
            eng = Engine(args, hostname=f"gpunode-{n + 1}", nvidia_runtime=True)
            engines.append(eng)
            fakenvml.write_config(eng.gpus_path, {**gpu_config(2), "devices": mine})
            libdir = eng.dir / "fakenvml"
            libdir.mkdir(mode=0o755)
            libdir.chmod(0o755)
            shutil.copy(fakenvml_libdir / fakenvml.LIBRARY_NAME, libdir / fakenvml.LIBRARY_NAME)
            eng.start()
            if n == 0:
                eng.init_swarm(model)
            else:
                eng.join_swarm(engines[0], address, model)
            eng.build_image()
        manager = engines[0]
        manager.nodes = {eng.node_id(): eng for eng in engines}
        manager.gpu_config = {**gpu_config(4), "devices": devices}
        yield manager
    finally:
        for eng in reversed(engines):
            eng.stop()
