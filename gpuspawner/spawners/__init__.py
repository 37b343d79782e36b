"""Moved to :mod:`gpuspawner.backends` (each backend in its own folder); kept so existing
configurations keep working: ``gpuspawner.spawners.<name>.<Class>`` and the classes below.

The names below are imported on first use, so that importing one backend does not import the others.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "GPUSpawnerMixin": "gpuspawner.backends.base",
    "GPULocalProcessSpawner": "gpuspawner.backends.local.spawner",
    "GPUSimpleLocalProcessSpawner": "gpuspawner.backends.local.spawner",
    "GPUDockerSpawner": "gpuspawner.backends.docker.spawner",
    "GPUSwarmSpawner": "gpuspawner.backends.swarm.spawner",
    "GPUKubeSpawner": "gpuspawner.backends.kube.spawner",
    "GPUSlurmSpawner": "gpuspawner.backends.slurm.spawner",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
