"""Telling a user that their queued server is ready: :class:`GPUTellingMixin`, a base of the spawner mixin.

A spawn that waited in the hub's queue (its progress said where it waited) tells its user, once
JupyterHub has its server up and routed, through the hub's notifier
(:class:`gpuspawner.notifications.Teller`): by email, webhook or in JupyterLab, as they chose. A
spawn that got its GPUs at once tells nothing (its user is watching the progress page), nor does a
notebook job (its end is what its user hears of). It never delays or fails the spawn.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..notifications import GPUNotifySettings, Teller
from ..owner import Owner


def ready_text(server: str, url: str) -> str:
    """What a user is told when their queued server is ready."""
    where = f"Open it at {url}" if url else "Open it from the hub's home page"
    return (f"Your server{f' {server!r}' if server else ''} waited in the queue for GPUs and is now running. "
            f"{where}. Its GPUs are yours until you stop it (or it stays idle and is culled).")


class GPUTellingMixin(GPUNotifySettings):
    """Notices the spawner itself gives: its queued start is ready."""

    #: whether this start waited in the hub's queue
    gpu_queued: bool = False

    async def wait_in_queue(self, *args: Any, **kwargs: Any):
        before = len(getattr(self, "_gpu_events", ()))
        result = await super().wait_in_queue(*args, **kwargs)
        self.gpu_queued = len(getattr(self, "_gpu_events", ())) > before  # the queue reported a wait
        return result

    async def start(self):
        # the mixin's start reserved the GPUs (and waited) before this: what that start said, once
        queued, self.gpu_queued = self.gpu_queued, False
        result = await super().start()
        spawn = getattr(self, "_spawn_future", None)  # JupyterHub's: done once the server is up and routed
        if queued and spawn is not None and not Owner.parse(self.gpu_owner).is_job:
            teller = self.hub_state.cache(Teller)
            if teller.notifier is not None:
                self._gpu_telling = asyncio.get_running_loop().create_task(self._tell_when_ready(spawn, teller))
        return result

    async def _tell_when_ready(self, spawn: asyncio.Future, teller: Teller) -> None:
        try:
            await asyncio.shield(spawn)
        except Exception:
            return  # it failed: JupyterHub shows why
        if not self.ready:
            return
        url = self.user.public_url(self.name) or self.user.server_url(self.name)
        teller.later(self.user.name, "ready", "Your GPU server is ready", ready_text(self.name, url), url)
