"""Wire gpuspawner's operations into a JupyterHub configuration: one call.

```python
from gpuspawner.hub.setup import configure
configure(c, culler={"url": "http://127.0.0.1:8000", "idle_timeout": 3600})
```

It registers the pages ``/hub/gpus``, ``/hub/gpus/usage`` and ``/hub/gpus/bookings`` and APIs
``/hub/api/gpus``, ``/hub/api/gpus/usage`` and ``/hub/api/gpus/budgets`` (everyone's for admins, each user's own
for them; linked from the hub's navigation bar by ``templates/page.html``, and
JupyterHub's admin page gets a section of the GPUs each server holds from
``templates/admin.html``; a site's own ``page.html`` or ``admin.html`` in a
template folder listed before gpuspawner's wins) (plus the culler's
``/hub/api/gpus/usage/report``, scope ``custom:gpus:report``, and each user's browser
notification feed ``/hub/api/gpus/notifications/feed``, :mod:`.browser_feed`; the progress
stream's ready event names the server's GPUs, ``c.Spawner.progress_ready_hook``, unless the site set one), defines
the custom scope ``custom:gpus:read`` (grant it in a role to let a service or
user read the overview; admins read it through their ``admin-ui`` scope,
since JupyterHub's admin role cannot be changed), the notebook GPU job API
``/hub/api/users/NAME/gpu-jobs`` with its scope ``custom:gpu-jobs`` (given to
every user for themselves, and to their servers' tokens, by adding
``custom:gpu-jobs!user`` to the ``user`` and ``server`` roles), once the hub is up
attaches usage accounting to the hub's database (so every allocation is recorded
from the hub's start, whether or not a server spawns or a page is read) and
recovers the jobs a previous run of the hub left, reads the GPU bookings
(``/hub/api/gpus/bookings``, :mod:`.bookings`) and releases unused windows on a timer, watches the GPUs'
health (``/hub/api/gpus/health``, :mod:`.health`: broken GPUs out of placement, their users told), tells, warns
and stops the servers admitted until a booked window (:mod:`.booking_notices`), warns, then stops or lets
finish, the servers and jobs of users whose GPU budget runs out (:mod:`.budget_notices`), makes the hub's notifier
(:mod:`.notify`; each user's settings at ``/hub/gpus/notifications``, :mod:`.notify_api`), creates the hub-internal
service ``gpuspawner-overview`` (scope ``access:servers``) whose token reads
the servers' monitors (and posts the booking notices), and, with ``culler``, starts the GPU idle culler as a
managed service with the role it needs. It also checks the spawner's settings
(:func:`check_spawner`): a hub whose servers could not start, or would run as
root, stops at start with sentences saying why and what to do. The culler is told the pid of the
process that loads this configuration (the hub) and exits when that hub is
gone; ``pid_file`` (default ``jupyterhub-gpu-culler.pid`` in the hub's working
directory) keeps a restarted hub from having two cullers (see ``culler.py``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from traitlets.config import LazyConfigValue

from ..recommended import (
    RECOMMENDED_CULLER as RECOMMENDED_CULLER,  # the runnable hub's settings, re-exported
    RECOMMENDED_QUEUE_TIMEOUT as RECOMMENDED_QUEUE_TIMEOUT,
    RECOMMENDED_QUOTA_PER_USER as RECOMMENDED_QUOTA_PER_USER,
)
from . import (
    booking_notices,
    bookings,
    bookings_page,
    budget_notices,
    budgets,
    health,
    jobs,
    notify,
    notify_api,
    usage,
    usage_page,
)
from .culler import parse_args as culler_arguments
from .handlers import SCOPE, SETTINGS_KEY, handlers

TEMPLATES = str(Path(__file__).resolve().parent / "templates")
OVERVIEW_SERVICE = "gpuspawner-overview"
CULLER_SERVICE = "gpu-culler"
CULLER_SCOPES = ["list:users", "read:users", "read:servers", "servers", "access:servers", SCOPE, usage.REPORT_SCOPE]

#: culler option -> command-line flag of ``python -m gpuspawner.hub.culler``
CULLER_OPTIONS = {
    "url": "--url", "period": "--period", "threshold": "--threshold",
    "idle_timeout": "--idle-timeout", "warn_before": "--warn-before", "pid_file": "--pid-file",
    "kernel_activity": "--kernel-activity",  # True/"on": a kernel running code counts as use
}


def configure(c: Any, *, culler: dict | None = None, python: str = sys.executable) -> None:
    """Add the GPU overview, its scope, and optionally the GPU idle culler, to config ``c``; check the spawner."""
    check_spawner(c)
    c.JupyterHub.extra_handlers.extend(usage.handlers() + usage_page.handlers() + handlers())
    c.JupyterHub.extra_handlers.extend(jobs.handlers() + bookings.handlers())
    c.JupyterHub.extra_handlers.extend(bookings_page.handlers() + budgets.handlers() + health.handlers())
    c.JupyterHub.extra_handlers.extend(notify_api.handlers())
    paths = c.JupyterHub.template_paths
    if isinstance(paths, LazyConfigValue):  # a list of its own, so JupyterHub's folder comes after ours
        paths = c.JupyterHub.template_paths = paths.get_value([])
    paths.append(TEMPLATES)
    _browser_notifications(c)
    c.JupyterHub.custom_scopes.update({
        SCOPE: {"description": "Read the GPU overview and usage: every GPU, who holds it, live utilisation, "
                        "GPU-hours per user and group."},
        usage.REPORT_SCOPE: {"description": "Report GPU utilisation samples and why a server is stopped "
                                            "(the GPU idle culler), for usage accounting."},
        jobs.JOB_SCOPE: {"description": "Run, list and cancel notebook GPU jobs."},
    })
    token = secrets.token_hex(32)  # new at each start; JupyterHub replaces the old one in its database
    c.JupyterHub.tornado_settings.update({SETTINGS_KEY: {"token": token}})
    c.JupyterHub.services.append({"name": OVERVIEW_SERVICE, "api_token": token})
    roles = c.JupyterHub.load_roles
    if isinstance(roles, LazyConfigValue):  # not set yet (or only appended to): make it a list to look into
        roles = c.JupyterHub.load_roles = roles.get_value([])
    _grant_own_jobs(roles)
    _when_hub_is_up()
    roles.append({"name": OVERVIEW_SERVICE, "description": "Read the servers' GPU monitors",
                  "scopes": ["access:servers"], "services": [OVERVIEW_SERVICE]})
    if culler is not None:
        unknown = set(culler) - set(CULLER_OPTIONS)
        if unknown:
            raise ValueError(f"configure(culler=...): unknown keys {sorted(unknown)}; known: {sorted(CULLER_OPTIONS)}")
        # JupyterHub loads its configuration in its own process, which then starts the culler
        command = [python, "-m", "gpuspawner.hub.culler", "--hub-pid", str(os.getpid())]
        if culler.get("kernel_activity", "off") not in (True, False, "on", "off"):
            raise ValueError(f"configure(culler=...): kernel_activity={culler['kernel_activity']!r}; "
                             "use True or False")
        for key, flag in CULLER_OPTIONS.items():
            if key in culler:
                value = culler[key]
                command += [flag, ("on" if value else "off") if isinstance(value, bool) else str(value)]
        culler_arguments(command[3:])  # a bad setting stops the hub's start, naming it (not only the culler's)
        # wait estimates count an idle server as ending when the culler stops it
        c.GPUSpawnerMixin.gpu_culler_idle_timeout = culler_arguments(command[3:]).idle_timeout
        c.JupyterHub.services.append({"name": CULLER_SERVICE, "command": command})
        roles.append({"name": CULLER_SERVICE, "description": "Stop servers whose GPUs stay idle",
                      "scopes": CULLER_SCOPES, "services": [CULLER_SERVICE]})


def spawner_class(c: Any) -> type | None:
    """The class ``c.JupyterHub.spawner_class`` names (an entry point name, an import path or a class)."""
    from importlib.metadata import entry_points

    from traitlets.utils.importstring import import_item

    named = c.JupyterHub.get("spawner_class") if "JupyterHub" in c else None
    if named is None or isinstance(named, type):
        return named
    if isinstance(named, str):
        found = entry_points(group="jupyterhub.spawners", name=named)
        return next(iter(found)).load() if found else import_item(named)
    return None


def check_spawner(c: Any) -> None:
    """Stop the hub's start (SystemExit, with sentences) where its gpuspawner spawner could start no server.

    gpu-local and gpu-local-simple say why: servers that would run as root, accounts that
    could not run the servers' program (a Python under a folder only root may enter);
    gpu-slurm names the batchspawner settings it cannot honour beside its GPU choices.
    """
    cls = spawner_class(c)
    problems = getattr(cls, "gpu_startup_problems", None)
    found = problems(c) if problems is not None else []
    if found:
        raise SystemExit("\n".join(f"[gpuspawner] cannot start servers: {p}." for p in found))


#: JupyterHub's default scopes of the roles gpuspawner adds the job scope to
_DEFAULT_ROLE_SCOPES = {"user": ["self"], "server": ["users:activity!user", "access:servers!server"]}


def _grant_own_jobs(roles: list) -> None:
    """Let every user, and their servers' tokens, use the job API for themselves."""
    for name, defaults in _DEFAULT_ROLE_SCOPES.items():
        role = next((r for r in roles if r.get("name") == name), None)
        if role is None:
            role = {"name": name, "scopes": list(defaults)}
            roles.append(role)
        scopes = role.setdefault("scopes", list(defaults))
        if f"{jobs.JOB_SCOPE}!user" not in scopes:
            scopes.append(f"{jobs.JOB_SCOPE}!user")


def _when_hub_is_up() -> None:
    """Once the hub that loads this configuration is up: record usage, watch (or record the end of) its jobs.

    JupyterHub loads its configuration inside its running event loop; the hub
    application is the JupyterHub singleton. A timer looks every 0.2 s until the
    hub's web application exists, then attaches the usage recorder of the hub's
    :class:`~gpuspawner.state.HubState` to the hub's database (what the ledger did
    before, e.g. servers adopted at start, is written with its own times) and asks
    the hub's job manager (which keeps the recovery task) to recover.
    Outside a hub (a script importing the configuration) nothing is scheduled.
    """
    from jupyterhub.app import JupyterHub

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if not JupyterHub.initialized():
        return
    app = JupyterHub.instance()

    def when_ready() -> None:
        if getattr(app, "tornado_application", None) is None or "users" not in app.tornado_settings:
            loop.call_later(0.2, when_ready)
            return
        usage.attach_recorder(app.tornado_settings)
        bookings.start_keeping(app.tornado_settings)
        booking_notices.watch(app.tornado_settings)
        budget_notices.watch(app.tornado_settings)
        health.watch(app.tornado_settings)
        notify.attach(app.tornado_settings)  # before jobs are recovered: their ends are told
        recovery = jobs.job_manager(app.tornado_settings).recovered()
        recovery.add_done_callback(_log_failure(app))

    loop.call_soon(when_ready)


def _log_failure(app):
    def done(future) -> None:
        if not future.cancelled() and future.exception() is not None:
            app.log.error("gpuspawner: recovering notebook GPU jobs failed", exc_info=future.exception())

    return done


def _browser_notifications(c: Any) -> None:
    """Each user's browser notification feed (:mod:`.browser_feed`), and the server's GPUs in the progress
    stream's ready event (``c.Spawner.progress_ready_hook``) unless the site set its own hook."""
    from . import browser_feed

    c.JupyterHub.extra_handlers.extend(browser_feed.handlers())
    if "progress_ready_hook" not in c.Spawner:
        c.Spawner.progress_ready_hook = browser_feed.ready_event_gpus
