"""JupyterHub spawner backends; each is a thin adapter over GPUSpawnerMixin."""

from .base import GPUSpawnerMixin
from .local import GPULocalProcessSpawner, GPUSimpleLocalProcessSpawner

__all__ = ["GPUSpawnerMixin", "GPULocalProcessSpawner", "GPUSimpleLocalProcessSpawner"]
