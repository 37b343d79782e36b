"""A site's configuration keeps working after the backends moved to gpuspawner/backends/<name>/:
the old class paths (``c.JupyterHub.spawner_class = "gpuspawner.spawners.swarm.GPUSwarmSpawner"``)
give the same classes, and the entry points (``"gpu-swarm"``) name the new modules."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from traitlets.utils.importstring import import_item

import gpuspawner.spawners

OLD_PATHS = {
    "gpuspawner.spawners.local.GPULocalProcessSpawner": "gpuspawner.backends.local.spawner",
    "gpuspawner.spawners.local.GPUSimpleLocalProcessSpawner": "gpuspawner.backends.local.spawner",
    "gpuspawner.spawners.docker.GPUDockerSpawner": "gpuspawner.backends.docker.spawner",
    "gpuspawner.spawners.swarm.GPUSwarmSpawner": "gpuspawner.backends.swarm.spawner",
    "gpuspawner.spawners.kube.GPUKubeSpawner": "gpuspawner.backends.kube.spawner",
    "gpuspawner.spawners.slurm.GPUSlurmSpawner": "gpuspawner.backends.slurm.spawner",
}


@pytest.mark.parametrize("path", sorted(OLD_PATHS))
def test_an_old_class_path_gives_the_moved_class(path):
    found = import_item(path)  # what JupyterHub does with a dotted spawner_class
    assert found.__module__ == OLD_PATHS[path]
    assert getattr(gpuspawner.spawners, found.__name__) is found


def test_the_entry_points_name_the_moved_modules():
    spawners = {ep.name: ep for ep in entry_points(group="jupyterhub.spawners") if ep.name.startswith("gpu-")}
    assert set(spawners) == {"gpu-local", "gpu-local-simple", "gpu-docker", "gpu-swarm", "gpu-kube", "gpu-slurm"}
    for name, ep in spawners.items():
        assert ep.module.startswith("gpuspawner.backends."), name
        assert ep.load() is import_item(f"gpuspawner.spawners.{name.split('-')[1]}.{ep.attr}")


def test_the_engine_probe_an_older_jupyterhub_config_imports_is_still_there():
    # jupyterhub_config.py of earlier releases: from gpuspawner.spawners.docker import reachable_engine
    from gpuspawner.backends.docker.engine import reachable_engine
    from gpuspawner.spawners.docker import reachable_engine as old

    assert old is reachable_engine
