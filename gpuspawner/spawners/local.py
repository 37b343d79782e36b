"""``gpu-local``: single-user servers as local processes on exactly their GPUs."""

from __future__ import annotations

import os

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from .base import GPUSpawnerMixin


def visible_devices(uuids: tuple[str, ...]) -> dict[str, str]:
    """The environment that confines CUDA (and GPU tools) to the given GPUs.

    CUDA accepts GPU UUIDs in CUDA_VISIBLE_DEVICES; an empty value hides every
    GPU. NVIDIA_VISIBLE_DEVICES carries the same set for tools that read it
    (the container runtime's convention, and gpuspawner's monitor).
    """
    joined = ",".join(uuids)
    return {"CUDA_VISIBLE_DEVICES": joined, "NVIDIA_VISIBLE_DEVICES": joined or "none"}


class GPULocalProcessSpawner(GPUSpawnerMixin, LocalProcessSpawner):
    """LocalProcessSpawner whose servers see only the GPUs placed for them."""

    def get_env(self):
        env = super().get_env()
        env.update(visible_devices(self.gpu_uuids))
        return env


class _VforkSimpleLocalProcessSpawner(SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner that starts servers without a ``preexec_fn``.

    Its ``preexec_fn`` only makes the user's folder and changes into it, but any
    ``preexec_fn`` makes Popen fork the whole hub on the event loop (24 ms for a
    150 MB process, 20-90 ms each during a storm of spawns on 2 cores); without
    one Python uses vfork (0.1 ms). The folder is made here and given as ``cwd``.
    """

    def make_preexec_fn(self, name):
        return None

    async def start(self):
        os.makedirs(self.home_dir, 0o755, exist_ok=True)
        self.popen_kwargs = {**self.popen_kwargs, "cwd": self.home_dir}
        return await super().start()


class GPUSimpleLocalProcessSpawner(GPUSpawnerMixin, _VforkSimpleLocalProcessSpawner):
    """The same, running every server as the hub's own user in a per-user folder.

    For demos and tests with made-up user names (``gpu-local-simple``); use
    ``gpu-local`` where users are system accounts.
    """

    def get_env(self):
        env = super().get_env()
        env.update(visible_devices(self.gpu_uuids))
        return env
