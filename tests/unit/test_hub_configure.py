"""``configure(c)`` on a configuration that has not set ``load_roles`` (the runnable default's case)."""

from __future__ import annotations

from traitlets.config import Config

from gpuspawner.hub.jobs import JOB_SCOPE
from gpuspawner.hub.setup import OVERVIEW_SERVICE, configure


def test_configure_without_load_roles_grants_the_job_scope_and_keeps_earlier_appends():
    c = Config()
    c.JupyterHub.load_roles.append({"name": "site", "scopes": ["read:users"], "users": ["admin"]})
    configure(c)
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["site"]["scopes"] == ["read:users"]
    assert f"{JOB_SCOPE}!user" in roles["user"]["scopes"] and "self" in roles["user"]["scopes"]
    assert f"{JOB_SCOPE}!user" in roles["server"]["scopes"]
    assert OVERVIEW_SERVICE in roles
