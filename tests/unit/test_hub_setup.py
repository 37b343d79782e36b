"""configure(c): what it adds to a JupyterHub configuration, whatever the configuration held before."""

from __future__ import annotations

from traitlets.config import Config

from gpuspawner.hub.setup import configure


def _value(item, initial):
    """A configuration value as the hub will see it (appends and updates on an unset value are lazy)."""
    return item.get_value(initial) if hasattr(item, "get_value") else item


def _role(c: Config, name: str) -> dict:
    return next(r for r in c.JupyterHub.load_roles if r["name"] == name)


def test_on_an_empty_configuration_users_and_their_servers_may_run_their_own_jobs():
    c = Config()
    configure(c)
    assert _role(c, "user")["scopes"] == ["self", "custom:gpu-jobs!user"]
    assert _role(c, "server")["scopes"] == ["users:activity!user", "access:servers!server", "custom:gpu-jobs!user"]
    assert "custom:gpu-jobs" in _value(c.JupyterHub.custom_scopes, {})
    assert any(path.endswith("/gpu-jobs") for path, _handler in _value(c.JupyterHub.extra_handlers, []))


def test_roles_set_before_are_kept_and_extended_once():
    c = Config()
    c.JupyterHub.load_roles.append({"name": "user", "scopes": ["self", "read:hub"]})
    c.JupyterHub.load_roles.append({"name": "tests", "scopes": ["admin:users"], "services": ["tests"]})
    configure(c)
    assert _role(c, "user")["scopes"] == ["self", "read:hub", "custom:gpu-jobs!user"]
    assert _role(c, "tests")["scopes"] == ["admin:users"]
    names = [r["name"] for r in c.JupyterHub.load_roles]
    assert names.count("user") == 1 and names.count("server") == 1
