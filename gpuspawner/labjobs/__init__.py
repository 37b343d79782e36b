"""jupyter-scheduler on the hub's GPUs: a jupyter_server extension that plugs gpuspawner into it.

Enabled on install (``jupyter-config/jupyter_server_config.d/gpuspawner.json``).
When linked (before ``jupyter_scheduler``, as extensions link in name order) it
sets ``SchedulerApp.scheduler_class`` and ``environment_manager_class`` to
:mod:`.scheduler`'s classes, unless the server's configuration names others;
without jupyter-scheduler installed it does nothing.
"""

from __future__ import annotations

import importlib.util

DEFAULTS = {
    "scheduler_class": "gpuspawner.labjobs.scheduler.GPUScheduler",
    "environment_manager_class": "gpuspawner.labjobs.scheduler.GPUEnvironments",
}


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "gpuspawner.labjobs"}]


def _link_jupyter_server_extension(serverapp) -> None:
    if importlib.util.find_spec("jupyter_scheduler") is None:
        return
    section = serverapp.config.SchedulerApp
    for key, value in DEFAULTS.items():
        if key not in section:
            section[key] = value


def _load_jupyter_server_extension(serverapp) -> None:
    serverapp.log.info("gpuspawner.labjobs: jupyter-scheduler jobs run on the hub's GPUs (%s)",
                       serverapp.config.SchedulerApp.get("scheduler_class"))
