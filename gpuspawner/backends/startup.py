"""A hub's gpuspawner configuration checked when the hub starts, not at the first spawn."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from traitlets import TraitError

__all__ = ["check_configuration_at_hub_start", "refusal_at_start"]


def refusal_at_start(spawner_class: type, config) -> str | None:
    """Why the hub's configuration of ``spawner_class`` is refused, or None: the sentence of
    the first setting a validator of the class refuses (a :class:`~traitlets.TraitError`).

    The class is built once from ``config``, for a stand-in user (KubeSpawner names its pod
    after one); a class that cannot be built so (say, it needs a cluster that does not answer)
    is not checked here, and says what is wrong at its first spawn.
    """
    probe = SimpleNamespace(name="gpuspawner-configuration-check", id=0, url="/", groups=[])
    try:
        spawner_class(config=config, user=probe)
    except TraitError as e:
        return f"{spawner_class.__name__}: {e}"
    except Exception:
        return None
    return None


def check_configuration_at_hub_start(mixin: type) -> None:
    """Make a starting JupyterHub check its gpuspawner class (a subclass of ``mixin``) before anything else:
    a setting the class refuses (:func:`refusal_at_start`) stops the hub at start with its
    sentence, instead of a bare 500 at the first spawn.

    JupyterHub has no hook for this, and loads every spawner class it knows (gpuspawner's
    among them) before its configuration exists. So the first import of a gpuspawner backend
    in a process that runs JupyterHub wraps, once, ``JupyterHub.init_spawners``, which every
    hub start awaits once its configuration and database are loaded; a hub whose spawner
    class is not gpuspawner's is not affected. Outside a hub process nothing changes.
    """
    app_module = sys.modules.get("jupyterhub.app")
    if app_module is None:
        return
    hub = app_module.JupyterHub
    original = hub.init_spawners
    if getattr(original, "gpuspawner_checks_configuration", False):
        return

    async def init_spawners(self, *args, **kwargs):
        spawner_class = self.spawner_class
        if isinstance(spawner_class, type) and issubclass(spawner_class, mixin):
            refusal = refusal_at_start(spawner_class, self.config)
            if refusal is not None:
                self.log.critical("Refusing to start: %s", refusal)
                self.exit(1)
        return await original(self, *args, **kwargs)

    init_spawners.gpuspawner_checks_configuration = True
    init_spawners.__doc__ = original.__doc__
    hub.init_spawners = init_spawners
