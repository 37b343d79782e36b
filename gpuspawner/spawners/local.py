"""``gpu-local``: single-user servers as local processes on exactly their GPUs."""

from __future__ import annotations

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from ..gpu import nvidia_visible_devices
from .base import GPUSpawnerMixin


def visible_devices(uuids: tuple[str, ...]) -> dict[str, str]:
    """The environment that confines CUDA (and GPU tools) to the given GPUs.

    CUDA accepts GPU UUIDs in CUDA_VISIBLE_DEVICES; an empty value hides every
    GPU. NVIDIA_VISIBLE_DEVICES carries the same set for tools that read it
    (the container runtime's convention, and gpuspawner's monitor); ``void``
    when there is none.
    """
    return {"CUDA_VISIBLE_DEVICES": ",".join(uuids), "NVIDIA_VISIBLE_DEVICES": nvidia_visible_devices(uuids)}


class GPULocalProcessSpawner(GPUSpawnerMixin, LocalProcessSpawner):
    """LocalProcessSpawner whose servers see only the GPUs placed for them."""

    def get_env(self):
        env = super().get_env()
        env.update(visible_devices(self.gpu_uuids))
        return env


class GPUSimpleLocalProcessSpawner(GPUSpawnerMixin, SimpleLocalProcessSpawner):
    """The same, running every server as the hub's own user in a per-user folder.

    For demos and tests with made-up user names (``gpu-local-simple``); use
    ``gpu-local`` where users are system accounts.
    """

    def get_env(self):
        env = super().get_env()
        env.update(visible_devices(self.gpu_uuids))
        return env
