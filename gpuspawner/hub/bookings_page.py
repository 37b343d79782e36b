"""The bookings page, ``/hub/gpus/bookings``: book GPUs ahead, see who booked when, cancel.

The page shows, per GPU model, a timeline of the next :data:`DAYS` days: who holds
its GPUs now (rendered here from the GPU overview, so a user sees their own holdings
and administrators everyone's, as on ``/hub/gpus``) and the booked windows (read by
the page's script from the bookings REST API, ``GET /hub/api/gpus/bookings``, which
answers a user their own and their groups' bookings and administrators all). Its
form posts a new booking to ``POST /hub/api/gpus/bookings`` with the user's cookie
and XSRF token; a refused booking shows the API's sentence (HTTP 400) and books
nothing. The user's own bookings are listed with a button that cancels them
(``DELETE /hub/api/gpus/bookings/<id>``). Administrators may book for a group.

Logged-out visitors are sent to the login page; a token that may not read its own
servers gets 403, as for the overview.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable

from jupyterhub import orm
from jupyterhub.handlers import BaseHandler
from tornado import web

from . import booking_keeper as keeping
from .handlers import _Overview
from .overview import build, own_view

#: how many days ahead the timeline shows
DAYS = 7


def holding_now(data: dict, models_of: Callable[[str], list[str]] | None = None) -> dict[str, list[dict]]:
    """Model slug -> who holds its GPUs now, from the overview (``build``'s or ``own_view``'s answer):
    ``[{"user", "server", "gpus"}]`` per server or job, by user. A cluster placement counts under its
    resource, or under the models ``models_of(owner)`` says its GPUs are of (gpu-kube: its pod's)."""
    per: dict[str, dict[str, dict]] = defaultdict(dict)
    for gpu in data["gpus"]:
        holder = gpu["holder"]
        if holder:
            row = per[gpu["model"]].setdefault(holder["owner"], {"user": holder["user"],
                                                                 "server": holder["server"], "gpus": 0})
            row["gpus"] += 1
    for holding in data.get("cluster", []):
        known = Counter(models_of(holding["owner"])) if models_of is not None else None
        for resource, count in (known or holding["resources"]).items():
            row = per[resource].setdefault(holding["owner"], {"user": holding["user"],
                                                              "server": holding["server"], "gpus": 0})
            row["gpus"] += count
    return {model: sorted(rows.values(), key=lambda r: (r["user"], r["server"])) for model, rows in per.items()}


class BookingsPageHandler(_Overview, BaseHandler):
    """``GET /hub/gpus/bookings``: the timeline, the booking form and the user's bookings."""

    async def holdings(self, viewer: str | None) -> dict:
        """The overview without live numbers (no server's monitor is read): who holds which GPU."""
        state = self.hub_state
        reading = await state.inventory.read()
        allocations = state.ledger.allocations()
        holders, _ = self._holders(allocations, state.ledger)
        data = build(reading, allocations, holders, {}, {}, [], time.time())
        return data if viewer is None else own_view(data, viewer)

    def models_held(self) -> Callable[[str], list[str]] | None:
        """Ledger owner -> the models of its GPUs, where the booking keeper knows them (gpu-kube)."""
        held = getattr(keeping.keeper_of(self.settings), "held_models", None)
        if held is None:
            return None
        state, allocations = self.hub_state, self.hub_state.ledger.allocations()
        return lambda owner: held(state, owner, tuple(allocations.get(owner, ())))

    @web.authenticated
    async def get(self) -> None:
        viewer = self.viewer()
        data = await self.holdings(viewer)
        admin = viewer is None
        if admin:
            groups = sorted(g.name for g in self.db.query(orm.Group))
        else:
            groups = sorted(g.name for g in self.current_user.groups)
        models = await keeping.models(self.settings) or [  # the cluster's, where bookings are held there
            {"model": m["model"], "name": m["name"], "total": m["total"]} for m in data["models"]]
        self.set_header("Cache-Control", "no-store")
        self.finish(await self.render_template(
            "gpuspawner_bookings.html", models=models, holding=holding_now(data, self.models_held()), admin=admin,
            groups=groups,
            me=self.current_user.name, now=data["time"], days=DAYS, simulated=data["simulated"],
        ))


def handlers() -> list[tuple[str, type]]:
    """Routes for ``c.JupyterHub.extra_handlers`` (JupyterHub prefixes them with ``/hub``)."""
    return [(r"/gpus/bookings", BookingsPageHandler)]
