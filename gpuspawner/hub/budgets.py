"""GPU-hour budgets over REST: ``GET /hub/api/gpus/budgets`` (and the standing the usage page shows).

Reading follows the usage API's rule (:meth:`~.usage._Usage.whose`): any user reads their own
standing; readers of everyone's GPUs (``custom:gpus:read``; admins through ``admin-ui``) read
everyone's who has a budget, or one user's with ``user=``. Each answer's standing is also
what the Prometheus gauge ``gpuspawner_budget_left{user}`` serves afterwards.

``{"unit": "A100-hours", "users": [{"user", "unit", "at", "left", "limit", "exhausted", "summary",
"budgets": [{"scope", "name", "hours", "period", "rolling", "limit", "used", "left", "exhausted",
"since", "until", "resets", "available_again"}]}]}`` (times ISO 8601, UTC; see
:mod:`gpuspawner.budgets` for what each means).
"""

from __future__ import annotations

import time

from jupyterhub import orm
from jupyterhub.apihandlers import APIHandler
from tornado import web

from ..backends.budgets import GPUBudgetSettings, budget_keeper
from ..budgets import BudgetPolicy, Standing
from ..inputs import dumps
from ..state import settings_for
from .usage import BadParameter, _Usage


def budget_settings(settings: dict) -> GPUBudgetSettings:
    """The hub's budget settings (``settings``: its tornado settings), as its spawner class reads them."""
    return settings_for(settings["config"], settings.get("spawner_class"), GPUBudgetSettings)


def budget_policy(settings: dict) -> BudgetPolicy:
    """The hub's configured budgets."""
    return budget_settings(settings).budget_policy()


def standings(handler, policy: BudgetPolicy, user: str | None) -> list[Standing]:
    """``user``'s standing (None: of every user a budget applies to), noted by the hub's keeper."""
    if user is not None:
        found = handler.find_user(user)
        users = {user: [g.name for g in found.groups] if found is not None else []}
    else:
        users = {}
        for orm_user in handler.db.query(orm.User).order_by(orm.User.name):
            groups = [g.name for g in orm_user.groups]
            if policy.applying(orm_user.name, groups):
                users[orm_user.name] = groups
    return budget_keeper(handler.hub_state).standings(handler.db, policy, users, time.time())


class BudgetsAPIHandler(_Usage, APIHandler):
    """``GET /hub/api/gpus/budgets[?user=NAME]``."""

    async def get(self) -> None:
        try:
            user = self.whose()
        except BadParameter as e:
            raise web.HTTPError(400, "%s", str(e)) from e
        policy = budget_policy(self.settings)
        found = standings(self, policy, user) if policy.enabled else []
        self.set_header("Cache-Control", "no-store")
        self.finish(dumps({"unit": policy.unit, "exhausted": policy.exhausted,
                           "users": [s.as_json() for s in found]}))


def handlers() -> list[tuple[str, type]]:
    return [(r"/api/gpus/budgets", BudgetsAPIHandler)]
