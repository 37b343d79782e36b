"""Loading the monitor into a running jupyter_server.

Loading reads configuration (``GPUMonitor``), the visible devices from the
environment and registers the handlers. It calls no NVML: the sampler thread
starts with the first request and reads NVML there. Anything that goes wrong
here is logged and leaves the server running without the monitor.
"""

from __future__ import annotations

import asyncio
import os
import time

from .config import GPUMonitor
from .handlers import handlers
from .kernels import Attributor, kernel_table
from .notices import SETTINGS_KEY as NOTICES_KEY, NoticeBoard, NoticesHandler
from .sampler import Sampler
from .visibility import Visibility

#: Seconds between refreshes of the kernel pid table while sampling.
KERNEL_TABLE_REFRESH = 5.0

SETTINGS_KEY = "gpuspawner_sampler"


class _KernelTableRefresher:
    """On the loop, after a sample: refresh the kernel pid table if it is old."""

    def __init__(self, serverapp, attributor: Attributor) -> None:
        self.serverapp = serverapp
        self.attributor = attributor
        self.refreshed = 0.0
        self.task: asyncio.Task | None = None

    def __call__(self) -> None:
        if self.task is not None and not self.task.done():
            return
        if time.monotonic() - self.refreshed < KERNEL_TABLE_REFRESH:
            return
        self.refreshed = time.monotonic()
        self.task = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        app = self.serverapp
        try:
            self.attributor.table = await kernel_table(app.kernel_manager, getattr(app, "session_manager", None))
        except Exception:
            app.log.exception("gpuspawner.monitor: reading the kernel table failed")


def load(serverapp) -> None:
    """Register the monitor's handlers on ``serverapp``."""
    try:
        config = GPUMonitor(parent=serverapp)
        if not config.enabled:
            serverapp.log.info("gpuspawner.monitor: disabled by GPUMonitor.enabled = False")
            return
        attributor = Attributor()
        sampler = Sampler(
            Visibility.from_env(os.environ),
            interval=config.interval,
            history_seconds=config.history_seconds,
            idle_pause=config.idle_pause,
            static_refresh=config.static_refresh,
            attribute=attributor,
            detail_interval=config.detail_interval,
            idle_interval=config.idle_interval,
        )
        sampler.on_publish = _KernelTableRefresher(serverapp, attributor)
        web_app = serverapp.web_app
        web_app.settings[SETTINGS_KEY] = sampler
        web_app.settings[NOTICES_KEY] = NoticeBoard()
        web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]) + [
            (web_app.settings["base_url"].rstrip("/") + "/api/gpus/notices", NoticesHandler),
        ])
        serverapp.log.info(
            "gpuspawner.monitor: GPU statistics at %sapi/gpus (%s)", web_app.settings["base_url"],
            sampler.visibility.describe(),
        )
    except Exception:
        serverapp.log.exception("gpuspawner.monitor: not loaded; the server runs without GPU statistics")


def unload(serverapp) -> None:
    sampler = serverapp.web_app.settings.get(SETTINGS_KEY)
    if sampler is not None:
        sampler.stop()
