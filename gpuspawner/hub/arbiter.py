"""GPU-aware culling for sites that run jupyterhub-idle-culler 2.0: its ``cull_arbiter_hook``.

jupyterhub-idle-culler 2.0 asks a hook, for every ready server at every round
(``cull_every`` seconds), ``hook(inactive=timedelta, inactive_limit=seconds, server=model)``
and stops the server when it answers True. In the culler's configuration file
(``idle_culler_config.py`` in its working directory, or the file ``--config`` names)::

    from gpuspawner.hub.arbiter import GPUCullArbiter
    c.IdleCuller.cull_arbiter_hook = GPUCullArbiter("https://hub.example.org", threshold=5, warn_before=600,
                                                    kernel_activity=True)

:class:`GPUCullArbiter` answers as gpuspawner's own culler (:mod:`gpuspawner.hub.culler`) would:

- A server holding GPUs (``GET /hub/api/gpus``) is judged by its GPUs, with the built-in
  culler's rule (:class:`gpuspawner.idle.IdleTracker`), the idle culler's ``--timeout``
  being the idle timeout: once all its GPUs have stayed below ``threshold`` % for
  ``timeout - warn_before`` seconds its user gets the warning notice in JupyterLab, and it
  is culled when they are still idle ``timeout`` seconds in, ``warn_before`` seconds or more
  after that warning. A busy GPU keeps it running, however long since the user was active;
  hub activity (an open browser tab) does not keep idle GPUs. With ``kernel_activity=True``
  its kernels count too, as with the built-in culler's ``--kernel-activity on``: a kernel
  running code, or active since the last look (``GET {server}/api/kernels``), is use. A
  server whose monitor (or kernels) cannot be read, or that did not take the warning, is not
  culled that round.
- A notebook GPU job is never culled (it ends by itself); a server holding no GPU gets the
  idle culler's own rule (``inactive >= inactive_limit``).

It reads each server's monitor history (``GET {server}/api/gpus?history=1``, through the
proxy at ``url``) and reports the samples, and why a culled server ended, to the hub's usage
accounting, as the built-in culler does. Time the monitor no longer remembers (a
``cull_every`` longer than the servers' ``GPUMonitor.history_seconds``, 600 by default)
counts as use, so a gap never makes a server look idle longer than it was. The idle
culler's service needs, beside its own scopes, those in :data:`ARBITER_SCOPES`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from datetime import timedelta

from ..idle import IdleTracker
from .handlers import SCOPE
from .judging import HubHTTP, Judge, _duration, start_key
from .usage import REPORT_SCOPE

#: what the idle culler's role needs beside its own (list:users, read:users:activity, read:servers, delete:servers)
ARBITER_SCOPES = [SCOPE, REPORT_SCOPE, "access:servers"]
OVERVIEW_TTL = 5.0  # seconds one read of /hub/api/gpus serves the servers of a round


def _log() -> logging.Logger:
    """The idle culler's own logger where it runs (its lines, its format), else this module's."""
    from traitlets.config import Application

    return Application.instance().log if Application.initialized() else logging.getLogger(__name__)


def _culler_timeout() -> float | None:
    """The running idle culler's ``--timeout``, where this is loaded by one."""
    from traitlets.config import Application

    return getattr(Application.instance(), "timeout", None) if Application.initialized() else None


class GPUCullArbiter:
    """``c.IdleCuller.cull_arbiter_hook``: the GPU rule of gpuspawner's culler (see the module's docstring).

    ``url``: the proxy's URL, through which the servers' monitors are reached (default
    ``$JUPYTERHUB_PUBLIC_URL``, else ``http://127.0.0.1:8000``); ``threshold``: GPU
    utilisation (%) below which a GPU is idle; ``warn_before``: seconds between the
    warning and the cull (less than the culler's ``--timeout``); ``kernel_activity``: a
    kernel running code, or active since the last look, counts as use, as a busy GPU does.
    The hub's API URL and token are the culler's own (``JUPYTERHUB_API_URL``,
    ``JUPYTERHUB_API_TOKEN``).
    """

    def __init__(self, url: str | None = None, *, threshold: float = 5.0, warn_before: float = 600.0,
                 kernel_activity: bool = False) -> None:
        # SystemExit, not ValueError: the idle culler logs an Exception raised in its configuration file
        # and goes on culling by its own rule (GPU-busy servers too); a bad setting must stop it instead
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 100:
            raise SystemExit(f"gpuspawner: GPUCullArbiter(threshold={threshold!r}): must be a GPU utilisation "
                             "in percent, above 0 and at most 100")
        if isinstance(warn_before, bool) or not isinstance(warn_before, (int, float)) or not warn_before >= 0:
            raise SystemExit(f"gpuspawner: GPUCullArbiter(warn_before={warn_before!r}): must be seconds, 0 or more")
        timeout = _culler_timeout()  # set on its command line (one set later in its file is checked at each call)
        if timeout is not None and warn_before >= timeout:
            raise SystemExit(f"gpuspawner: GPUCullArbiter(warn_before={warn_before!r}): must be less than the idle "
                             f"culler's --timeout ({timeout})")
        if not isinstance(kernel_activity, bool):
            raise SystemExit(f"gpuspawner: GPUCullArbiter(kernel_activity={kernel_activity!r}): must be True or False")
        self.kernel_activity = kernel_activity
        self.url = (url or os.environ.get("JUPYTERHUB_PUBLIC_URL") or "http://127.0.0.1:8000").rstrip("/")
        self.threshold = float(threshold)
        self.warn_before = float(warn_before)
        self._trackers: dict[float, IdleTracker] = {}  # one per idle timeout (the culler's --timeout)
        self._newest: dict[str, float] = {}  # start key -> newest sample time fed to the trackers
        self._overview: tuple[float, asyncio.Future] | None = None
        self._call = HubHTTP()  # the culler's own token, read at each call
        self._judge = Judge(self._call, self._api, threshold=self.threshold, warn_before=self.warn_before,
                            kernel_activity=kernel_activity, source="idle-culler", log=_log, prefix="gpuspawner: ")

    def _api(self, path: str) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api").rstrip("/") + path

    async def _holders(self) -> dict[str, dict] | None:
        """Server full name (``user/server``) -> its GPU holder on the overview, read once per round."""
        now = time.monotonic()
        if self._overview is None or now - self._overview[0] > OVERVIEW_TTL:
            self._overview = (now, asyncio.ensure_future(self._call("GET", self._api("/gpus"))))
        code, data = await asyncio.shield(self._overview[1])
        if code != 200 or not isinstance(data, dict):
            _log().error("gpuspawner: cannot read the GPU overview (HTTP %s %s); culling no GPU server", code, data)
            return None
        found: dict[str, dict] = {}
        for gpu in data.get("gpus", []):
            holder = gpu.get("holder")
            if holder:
                entry = found.setdefault(f"{holder['user']}/{holder['server']}", {**holder, "uuids": []})
                entry["uuids"].append(gpu["uuid"])
        starts = {start_key(holder) for holder in found.values()}
        for tracker in self._trackers.values():  # what is tracked of a start ends with it
            tracker.forget_except(starts)
        self._newest = {key: at for key, at in self._newest.items() if key in starts}
        return found

    def _tracker(self, idle_timeout: float) -> IdleTracker:
        if idle_timeout not in self._trackers:
            self._trackers[idle_timeout] = IdleTracker(self.threshold, idle_timeout, self.warn_before)
        return self._trackers[idle_timeout]

    async def __call__(self, *, inactive: timedelta | None, inactive_limit: float, server: dict, **_) -> bool:
        try:
            return await self._decide(inactive, inactive_limit, server)
        except Exception:  # a failure on one server must not end the culler's round, nor cull it
            _log().exception("gpuspawner: deciding on %s failed; not culling it", server.get("full_name"))
            return False

    async def _decide(self, inactive: timedelta | None, inactive_limit: float, server: dict) -> bool:
        classic = inactive is not None and inactive.total_seconds() >= inactive_limit
        holders = await self._holders()
        if holders is None:
            return False
        holder = holders.get(server.get("full_name", ""))
        if holder is None:
            return classic
        if holder.get("kind") == "job":
            return False
        if self.warn_before >= inactive_limit:
            _log().error("gpuspawner: GPUCullArbiter(warn_before=%g) must be less than the idle culler's "
                         "--timeout (%s); culling no GPU server", self.warn_before, inactive_limit)
            return False
        return await self._judge_holder(holder, float(inactive_limit))

    async def _judge_holder(self, holder: dict, idle_timeout: float) -> bool:
        owner, key = holder["owner"], start_key(holder)
        if holder.get("state") != "running" or not holder.get("url"):
            return False
        base = (holder["url"] if holder["url"].startswith("http") else self.url + holder["url"]).rstrip("/")
        # the idle culler decides every --cull-every: the stop comes then, not to the second
        action, what = await self._judge.judge(self._tracker(idle_timeout), key, holder, base, time.time(),
                                               history="1", when=f"in {_duration(self.warn_before)} or a little later",
                                               gap=self._gap)
        if action != "stop":
            return False
        await self._judge.report(owner, end_reason="culled")
        _log().warning("gpuspawner: culling %s: %s (warned %s before)", owner, what, _duration(self.warn_before))
        return True

    def _gap(self, key: str, samples: list) -> None:
        """Time the monitor no longer remembers (since the newest sample of the last look) counts as use."""
        oldest, newest = min(at for at, _ in samples), max(at for at, _ in samples)
        seen = self._newest.get(key)
        if seen is not None and oldest > seen:
            samples.append(((seen + oldest) / 2, 100.0))
        self._newest[key] = max(newest, seen or newest)
