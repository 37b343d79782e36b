"""GPU health in a running hub: the API, the notices, the watch (see :mod:`gpuspawner.health`).

- ``GET /hub/api/gpus/health``: the GPUs out of service for their health, each with ``reason``,
  ``since`` and ``cleared`` (since when its condition has cleared; null while it still fails);
- ``POST /hub/api/gpus/health/<uuid>`` with ``{"healthy": true}`` brings a GPU back once its condition
  has cleared (409 with a sentence before), ``{"healthy": false, "reason": "..."}`` takes one out.
  Administrators only (403 for anyone else); a bad body is a 400 naming what is wrong, and changes nothing.
  The button on ``/hub/gpus`` posts the first.
- :func:`watch` (called once the hub is up) restores what a previous run had out of service (the hub's
  database, :mod:`gpuspawner.health_store`; kept after every change), starts the NVML watch and,
  every :data:`PERIOD` seconds, tells the users whose server holds a GPU that went out of service, in
  JupyterLab (a notice, through :func:`gpuspawner.hub.judging.post_notice`, as the culler and bookings
  do), once per outage.
"""

from __future__ import annotations

import asyncio
import logging

from jupyterhub.apihandlers import APIHandler
from tornado import web

from ..health import WORDS, Outage, parse_health_body
from ..health_store import HealthStore
from ..owner import Owner
from ..state import HubState, hub_state_of_app
from .handlers import SETTINGS_KEY
from .judging import HubHTTP, post_notice

log = logging.getLogger("gpuspawner.health")

NOTICE_ID = "gpu-health"
PERIOD = 2.0  # seconds between two looks for users to tell


class _Admin:
    def require_admin(self) -> None:
        user = self.current_user
        if not user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if not getattr(user, "admin", False):
            raise web.HTTPError(403, "Only administrators may see or change GPU health.")

    @property
    def state(self) -> HubState:
        return hub_state_of_app(self.settings)


def _entry(outage: Outage, state: HubState) -> dict:
    gpu = state.gpu_info(outage.uuid)
    return {**outage.to_dict(), "name": gpu["name"], "host": gpu["host"], "index": gpu["index"],
            "held_by": state.ledger.holder(outage.uuid)}


class HealthListHandler(_Admin, APIHandler):
    """``GET /hub/api/gpus/health``"""

    def get(self) -> None:
        self.require_admin()
        state = self.state
        self.set_header("Cache-Control", "no-store")
        self.finish({"out_of_service": [_entry(o, state) for o in state.health.tracker.outages().values()]})


class HealthHandler(_Admin, APIHandler):
    """``POST /hub/api/gpus/health/<uuid>``"""

    async def post(self, uuid: str) -> None:
        self.require_admin()
        try:
            healthy, reason = parse_health_body(self.request.body)
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        state = self.state
        reading = await state.inventory.read()
        tracker = state.health.tracker
        if tracker.get(uuid) is None and uuid not in {g.uuid for g in reading.gpus}:
            raise web.HTTPError(404, f"No GPU {uuid} on this hub.")
        if healthy:
            try:
                tracker.bring_back(uuid)
            except KeyError as e:
                raise web.HTTPError(409, e.args[0]) from None
            except ValueError as e:
                raise web.HTTPError(409, str(e)) from None
        else:
            tracker.failed(uuid, WORDS["admin"].format(reason=reason), manual=True)
        await _refresh(state)
        outage = tracker.get(uuid)
        self.finish({"uuid": uuid, "healthy": outage is None, **({"outage": outage.to_dict()} if outage else {})})


def handlers() -> list[tuple[str, type]]:
    """Routes for ``c.JupyterHub.extra_handlers``."""
    return [(r"/api/gpus/health", HealthListHandler), (r"/api/gpus/health/([^/]+)", HealthHandler)]


async def _refresh(state: HubState) -> None:
    """Read the GPUs again now, so that placement, the form and the metrics see the change at once."""
    state.inventory.expire()
    await state.inventory.read()


class Teller:
    """Tells each server holding a GPU that went out of service, once per outage (owner, uuid, since)."""

    def __init__(self, settings: dict, state: HubState) -> None:
        self.settings, self.state = settings, state
        self.call = HubHTTP((settings.get(SETTINGS_KEY) or {}).get("token", ""))  # the overview's: access:servers
        self.told: set[tuple[str, str, float]] = set()

    async def round(self) -> None:
        outages = self.state.health.tracker.outages()
        for uuid, outage in outages.items():
            owner = self.state.ledger.holder(uuid)
            if owner is None or (owner, uuid, outage.since) in self.told:
                continue
            url = self._server_url(owner)
            if url is None:
                continue
            name = self.state.gpu_info(uuid)["name"] or "GPU"
            message = WORDS["notice"].format(name=name, uuid=uuid, reason=outage.reason)
            code = await post_notice(self.call, url.rstrip("/"), message, source="gpu-health",
                                     notice_id=NOTICE_ID, level="error")
            if 200 <= code < 300:
                self.told.add((owner, uuid, outage.since))
                log.warning("%s told that GPU %s is out of service", owner, uuid)
        self.told = {t for t in self.told if t[1] in outages}

    def _server_url(self, owner: str) -> str | None:
        parsed = Owner.parse(owner)
        if parsed.is_job:
            return None
        try:
            spawner = self.settings["users"][parsed.user].spawners.get(parsed.server)
        except KeyError:
            return None
        if spawner is None or not spawner.ready or spawner.server is None:
            return None
        return spawner.server.url


def watch(settings: dict) -> Teller:
    """In a running hub: watch the GPUs' health and tell the users on a GPU that fails."""
    state = hub_state_of_app(settings)
    loop = asyncio.get_running_loop()
    store = HealthStore(settings["db"].get_bind())  # what a previous run of the hub had out of service
    state.health.tracker.restore(store.load())
    state.inventory.expire()

    def refresh() -> None:
        store.replace(state.health.tracker.outages().values())
        asyncio.ensure_future(_refresh(state))

    state.health.start(loop, refresh)
    teller = state.cache(Teller, lambda: Teller(settings, state))
    state.every("gpu-health", PERIOD, teller.round)
    return teller
