"""The admin GPU overview: ``/hub/gpus`` (page) and ``/hub/api/gpus`` (JSON).

Both need the custom scope ``custom:gpus:read`` (defined by
:mod:`gpuspawner.hub.setup`; grant it with a role) or ``admin-ui``, which
JupyterHub's admin role holds (its scopes cannot be changed), so admins can
read the overview by default; anyone else gets 403.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from jupyterhub.apihandlers import APIHandler
from jupyterhub.handlers import BaseHandler
from tornado import web
from traitlets.config import Config

from ..queue import shared_queue
from ..spawners.base import GPUSpawnerMixin
from . import metrics
from .live import LiveStats
from .overview import Holder, build

SCOPE = "custom:gpus:read"
ADMIN_SCOPE = "admin-ui"  # in JupyterHub's admin role
SETTINGS_KEY = "gpuspawner_ops"  # tornado_settings entry: {"token": a token that may access servers}

_live = LiveStats()
_probes: dict[int, GPUSpawnerMixin] = {}


def configured_mixin(settings: dict) -> GPUSpawnerMixin:
    """A GPUSpawnerMixin with the GPU settings the hub's spawner class is configured with."""
    key = id(settings["config"])
    if key not in _probes:
        config, spawner_class = settings["config"], settings.get("spawner_class")
        names = set(GPUSpawnerMixin.class_trait_names(config=True))
        merged = Config()
        for klass in reversed(getattr(spawner_class, "__mro__", (GPUSpawnerMixin,))):
            section = config.get(klass.__name__) if klass.__name__ in config else None
            for name, value in (section or {}).items():
                if name in names:
                    merged.GPUSpawnerMixin[name] = value
        _probes[key] = GPUSpawnerMixin(config=merged)
    return _probes[key]


class _Overview:
    """Shared by the page and the API handler (both are JupyterHub BaseHandlers)."""

    def require_scope(self) -> None:
        if not self.current_user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if SCOPE not in self.expanded_scopes and ADMIN_SCOPE not in self.expanded_scopes:
            raise web.HTTPError(403, f"The GPU overview needs the scope {SCOPE} (administrators have it).")

    def _holders(self, allocations: dict, ledger) -> tuple[dict, dict]:
        holders, targets = {}, {}
        for owner in allocations:
            user_name, server_name = owner.split("/", 1)
            user = self.find_user(user_name)
            state, url = "not running", None
            if user is not None and server_name in user.orm_spawners:
                spawner = user.spawners[server_name]
                if spawner.pending:
                    state = {"spawn": "starting", "stop": "stopping"}.get(spawner.pending, spawner.pending)
                elif spawner.ready:
                    state, url = "running", user.server_url(server_name)
                    if spawner.server is not None:
                        targets[owner] = spawner.server.url
            holders[owner] = Holder(owner, user_name, server_name, ledger.since(owner), state, url)
        return holders, targets

    async def overview(self) -> dict:
        probe = configured_mixin(self.settings)
        inventory, ledger = probe.inventory, probe._ledger()
        metrics.COLLECTOR.watch(inventory, ledger)
        reading = await inventory.read()
        allocations = ledger.allocations()
        holders, targets = self._holders(allocations, ledger)
        live = {}
        if probe.gpu_inventory == "nvml":
            live.update(await _live.from_hub_nvml([g.uuid for g in reading.gpus]))
        token = (self.settings.get(SETTINGS_KEY) or {}).get("token")
        from_servers, problems = await _live.from_monitors(targets, token)
        for uuid, numbers in from_servers.items():
            if uuid not in live or numbers.sampled_at >= live[uuid].sampled_at - 5:
                live[uuid] = numbers
        return build(reading, allocations, holders, live, problems, shared_queue().waiters(), time.time())


class GPUsAPIHandler(_Overview, APIHandler):
    """``GET /hub/api/gpus``: the overview as JSON."""

    async def get(self) -> None:
        self.require_scope()
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(await self.overview()))


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "unknown"
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _gib(value: int | None) -> str:
    return "N/A" if value is None else f"{value / 2**30:.1f}"


class GPUsPageHandler(_Overview, BaseHandler):
    """``GET /hub/gpus``: the overview page (``?fragment=1``: only the tables, for the page's refresh)."""

    @web.authenticated
    async def get(self) -> None:
        self.require_scope()
        data = await self.overview()
        now = data["time"]
        namespace = dict(gpus=data, ago=_ago, when=_when, gib=_gib, now=now)
        name = "gpuspawner_gpus_tables.html" if self.get_argument("fragment", "") else "gpuspawner_gpus.html"
        self.set_header("Cache-Control", "no-store")
        self.finish(await self.render_template(name, **namespace))


def handlers() -> list[tuple[str, type]]:
    """Routes for ``c.JupyterHub.extra_handlers`` (JupyterHub prefixes them with ``/hub``)."""
    return [(r"/gpus", GPUsPageHandler), (r"/api/gpus", GPUsAPIHandler)]
