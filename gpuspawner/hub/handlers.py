"""The GPU overview: ``/hub/gpus`` (page) and ``/hub/api/gpus`` (JSON).

Every GPU and its holder needs the custom scope ``custom:gpus:read`` (defined by
:mod:`gpuspawner.hub.setup`; grant it with a role) or ``admin-ui``, which
JupyterHub's admin role holds (its scopes cannot be changed), so admins read
everything by default. Any other logged-in user (whose request may read their
own servers, ``read:servers!user=NAME``, as their browser session and default
tokens may) sees their own: free/total per model and the GPUs, cluster holdings
and queue places of their own servers and jobs. Anyone else gets 403.

``/hub/gpus?fragment=admin`` (readers of everything only) is the section
``admin.html`` loads into JupyterHub's admin page: each server or job holding
GPUs, with their count and model.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from jupyterhub.apihandlers import APIHandler
from jupyterhub.handlers import BaseHandler
from tornado import web

from ..jobs.manager import JobManager
from ..owner import Owner
from ..state import HubState, hub_state_of_app
from .live import LiveStats
from .overview import GPUEntries, Holder, build, held_by_owner, own_view, to_json

SCOPE = "custom:gpus:read"
ADMIN_SCOPE = "admin-ui"  # in JupyterHub's admin role
SETTINGS_KEY = "gpuspawner_ops"  # tornado_settings entry: {"token": a token that may access servers}
_USERS_BY_NAME = "gpuspawner_users_by_name"  # tornado_settings entry: (how many users, name -> user)

class _Overview:
    """Shared by the page and the API handler (both are JupyterHub BaseHandlers)."""

    def require_scope(self) -> None:
        if not self.current_user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if SCOPE not in self.expanded_scopes and ADMIN_SCOPE not in self.expanded_scopes:
            raise web.HTTPError(403, f"The GPU overview needs the scope {SCOPE} (administrators have it).")

    def viewer(self) -> str | None:
        """Whose GPUs this request may see: None for everyone's, else the requesting user's name (their own).

        403 for a request without credentials, a service without :data:`SCOPE`, and a
        token that may not read its own user's servers.
        """
        user = self.current_user
        if not user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if SCOPE in self.expanded_scopes or ADMIN_SCOPE in self.expanded_scopes:
            return None
        if getattr(user, "kind", "") == "user" and self.has_scope(f"read:servers!user={user.name}"):
            return user.name
        raise web.HTTPError(403, f"The GPU overview needs the scope {SCOPE} (administrators have it), "
                                 "or a user's own read:servers scope for their own GPUs.")

    def compute_etag(self) -> None:
        """No ETag: the answers are never cached (``Cache-Control: no-store``), and hashing one of 10,000
        GPUs (3 MB) takes 5 ms."""
        return None

    def _find_holder_user(self, name: str):
        """The hub's user ``name`` (None if there is none): found among the users the hub holds in memory
        (each user with a server, running or pending), by an index of their names kept while the hub holds
        as many users, where JupyterHub's ``find_user`` is a database query (2 ms each: 1,000 holders, 2 s a
        read); asked from the database when the index does not know the name (made again if the database does).
        """
        users = self.users
        index = self.settings.get(_USERS_BY_NAME)
        if index is None or index[0] != len(users):
            index = self.settings[_USERS_BY_NAME] = (len(users), {u.name: u for u in dict.values(users)})
        user = index[1].get(name)
        if user is not None and user.name == name and dict.get(users, user.id) is user:
            return user
        found = self.find_user(name)
        if found is not None:  # renamed or added since: the index is made again at the next read
            self.settings[_USERS_BY_NAME] = None
        return found

    def _holders(self, allocations: dict, ledger) -> tuple[dict, dict]:
        holders, targets = {}, {}
        jobs = self.hub_state.cached(JobManager)
        out_of_service = self.hub_state.out_of_service
        for owner in allocations:
            withheld = out_of_service.get(owner)
            if withheld is not None:  # what last held them is not over: held, and why
                was = Owner.parse(withheld.was)
                holders[owner] = Holder(owner, was.user, was.label, withheld.since, "out of service", None, was.kind)
                continue
            parsed = Owner.parse(owner)
            user_name, server_name = parsed.user, parsed.label
            if parsed.is_job:
                record = jobs.get(parsed.job) if jobs is not None else None
                state = record.state if record is not None else "running"
                holders[owner] = Holder(owner, user_name, server_name, ledger.since(owner), state, None, "job")
                continue
            user = self._find_holder_user(user_name)
            state, url, wait = "not running", None, None
            if user is not None and server_name in user.orm_spawners:
                spawner = user.spawners[server_name]
                if spawner.pending:
                    state = {"spawn": "starting", "stop": "stopping"}.get(spawner.pending, spawner.pending)
                    wait = getattr(spawner, "gpu_wait", None) if spawner.pending == "spawn" else None
                elif spawner.ready:
                    state, url = "running", user.server_url(server_name)
                    if spawner.server is not None:
                        targets[owner] = spawner.server.url
            holders[owner] = Holder(owner, user_name, server_name, ledger.since(owner), state, url, wait=wait)
        return holders, targets

    @property
    def hub_state(self) -> HubState:
        """The GPU state this hub's spawners share."""
        return hub_state_of_app(self.settings)

    async def overview(self, viewer: str | None = None) -> dict:
        """Every GPU (``viewer`` None), or what user ``viewer`` sees of them (:func:`own_view`)."""
        state = self.hub_state
        ledger = state.ledger
        reading = await state.inventory.read()
        allocations = ledger.allocations()
        holders, targets = self._holders(allocations, ledger)
        if viewer is not None:  # read only the viewer's own servers' monitors
            targets = {owner: url for owner, url in targets.items() if Owner.parse(owner).user == viewer}
        live_stats = state.cache(LiveStats)
        live = {}
        if state.inventory_source == "nvml":
            live.update(await live_stats.from_hub_nvml([g.uuid for g in reading.gpus]))
        token = (self.settings.get(SETTINGS_KEY) or {}).get("token")
        from_servers, problems = await live_stats.from_monitors(targets, token)
        problems = {**problems, **{w.owner: w.reason for w in state.out_of_service.entries()}}
        for uuid, numbers in from_servers.items():
            if uuid not in live or numbers.sampled_at >= live[uuid].sampled_at - 5:
                live[uuid] = numbers
        kept = state.cache(GPUEntries)
        await kept.prepare(reading)
        data = build(reading, allocations, holders, live, problems, state.queue.waiters(), time.time(), kept,
                     why=state.queue.why)
        data["isolation"] = self.isolation()
        data["outages"] = {uuid: o.to_dict() for uuid, o in state.health.tracker.outages().items()}
        return data if viewer is None else own_view(data, viewer)

    def isolation(self) -> dict | None:
        """How this hub's backend keeps servers off each other's GPUs, where it says (gpu-local)."""
        summary = getattr(self.settings.get("spawner_class"), "gpu_isolation_summary", None)
        if summary is None:
            return None
        isolation = summary()
        return {"enforced": isolation.enforced, "mechanism": isolation.mechanism, "note": isolation.note}


class GPUsAPIHandler(_Overview, APIHandler):
    """``GET /hub/api/gpus``: the overview as JSON."""

    async def get(self) -> None:
        viewer = self.viewer()
        self.set_header("Cache-Control", "no-store")
        self.finish(to_json(await self.overview(viewer)))


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


#: ``?fragment=`` of the overview page -> the template it renders
FRAGMENTS = {"": "gpuspawner_gpus.html", "1": "gpuspawner_gpus_tables.html", "admin": "gpuspawner_admin_gpus.html"}


class GPUsPageHandler(_Overview, BaseHandler):
    """``GET /hub/gpus``: the overview page (``?fragment=1``: only the tables, for the page's refresh;
    ``?fragment=admin``: the admin page's section, for readers of everyone's GPUs)."""

    @web.authenticated
    async def get(self) -> None:
        fragment = self.get_argument("fragment", "")
        if fragment not in FRAGMENTS:
            raise web.HTTPError(400, "fragment=%s: use 1 or admin, or leave it out", fragment[:40])
        if fragment == "admin":
            self.require_scope()
        viewer = self.viewer()
        data = await self.overview(viewer)
        now = data["time"]
        namespace = dict(gpus=data, ago=_ago, when=_when, gib=_gib, now=now, held=held_by_owner(data))
        name = FRAGMENTS[fragment]
        self.set_header("Cache-Control", "no-store")
        self.finish(await self.render_template(name, **namespace))


def handlers() -> list[tuple[str, type]]:
    """Routes for ``c.JupyterHub.extra_handlers`` (JupyterHub prefixes them with ``/hub``)."""
    return [(r"/gpus", GPUsPageHandler), (r"/api/gpus", GPUsAPIHandler)]
