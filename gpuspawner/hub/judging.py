"""Judging one server by its GPUs: the piece gpuspawner's culler service (:mod:`.culler`) and the
jupyterhub-idle-culler hook (:mod:`.arbiter`) share.

A :class:`Judge` reads a server's monitor with history (``GET {server}/api/gpus?history=...``) and,
where kernels count, its kernels (``GET {server}/api/kernels``), reports the samples to the hub's
usage accounting (``POST /hub/api/gpus/usage/report``), feeds them to an
:class:`~gpuspawner.idle.IdleTracker` and, when the tracker says so, warns the server's user with a
notice JupyterLab shows (``POST {server}/api/gpus/notices``, :func:`post_notice`) and by the hub's
notifier, as the user chose (``POST /hub/api/gpus/notifications/events``: :meth:`Judge.tell`). What to do on
"stop" is its caller's: the culler stops the server itself, the hook answers the idle culler. All
HTTP goes through one caller, :class:`HubHTTP` (JSON, the service's token).

The sentences a user and an admin read (:func:`warning_message`, :func:`idle_summary`) are here too,
so both cullers say the same thing.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from datetime import datetime

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ..idle import IdleTracker

NOTICE_ID = "gpu-culler"

#: (method, URL, JSON body or None) -> (HTTP status, parsed JSON body or None)
Call = Callable[[str, str, "dict | None"], Awaitable[tuple[int, "dict | list | None"]]]


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} seconds"
    if seconds < 7200:
        return f"{round(seconds / 60)} minutes"
    return f"{seconds / 3600:.1f} hours"


def start_key(holder: dict) -> str:
    """One start of one server: its owner and when it took its GPUs (``since`` on the overview)."""
    since = holder.get("since")
    return f"{holder['owner']}@{since!r}"


def kernel_activity(kernels: list, now: float) -> list[float]:
    """When a server's kernels (``GET /api/kernels``) were last active; ``now`` for one running code."""
    times = []
    for kernel in kernels if isinstance(kernels, list) else []:
        if not isinstance(kernel, dict):
            continue
        if kernel.get("execution_state") in ("busy", "starting"):
            times.append(now)
        try:
            times.append(datetime.fromisoformat(str(kernel["last_activity"]).replace("Z", "+00:00")).timestamp())
        except (KeyError, ValueError):
            pass
    return times


def idle_summary(uuids: list[str], threshold: float, idle_for: float, kernels: bool) -> str:
    """What kept a server idle, for the log: its GPUs (and, where they count, its kernels)."""
    kernels_too = " and its kernels ran no code" if kernels else ""
    return (f"its GPUs ({', '.join(uuids)}) stayed below {threshold:g}% utilisation{kernels_too} "
            f"for {_duration(idle_for)}")


def warning_message(when: str, threshold: float, idle_for: float, kernels: bool) -> str:
    """The notice a server gets before it is stopped ``when`` (words: "in 10 minutes")."""
    below = f"below {threshold:g}% utilisation"
    why = ("its GPUs and kernels are idle (GPUs " if kernels else "its GPUs are idle (") + below
    return (f"This server will be stopped {when} because {why}{', no code run,' if kernels else ''} "
            f"for {_duration(idle_for)}). Use them, or stop the server yourself to give them to others.")


def highest_utilization(sample: dict) -> float | None:
    values = [g.get("utilization_gpu") for g in sample.get("gpus", [])]
    values = [v for v in values if isinstance(v, (int, float))]
    return max(values) if values else None


class HubHTTP:
    """JSON requests with the service's token (``token``, else ``$JUPYTERHUB_API_TOKEN`` at each call).

    Calling it returns (HTTP status, parsed body or None); it never raises on an HTTP error. The
    Tornado client is made at the first call, on the event loop that makes it.
    """

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self._http: AsyncHTTPClient | None = None

    async def __call__(self, method: str, url: str, body: dict | None = None) -> tuple[int, dict | list | None]:
        if self._http is None:
            self._http = AsyncHTTPClient(force_instance=True)
        token = self.token or os.environ["JUPYTERHUB_API_TOKEN"]
        request = HTTPRequest(
            url, method=method, headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
            body=json.dumps(body) if body is not None else None, allow_nonstandard_methods=True,
            connect_timeout=10, request_timeout=30, follow_redirects=False,
        )
        response = await self._http.fetch(request, raise_error=False)
        try:
            return response.code, json.loads(response.body) if response.body else None
        except ValueError:
            return response.code, None

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


async def post_notice(call: Call, server: str, message: str, *, source: str, notice_id: str = NOTICE_ID,
                      level: str = "warning") -> int:
    """Post a notice to a server's monitor (``server``: its URL, no trailing slash), which JupyterLab
    shows; the HTTP status (2xx: the server took it). The same ``notice_id`` replaces an earlier one."""
    notice = {"id": notice_id, "level": level, "message": message, "source": source}
    code, _ = await call("POST", f"{server}/api/gpus/notices", notice)
    return code


class Judge:
    """Reads, reports and warns for one culler (see the module's docstring).

    ``call``: the HTTP caller; ``api``: hub API path (``/gpus/...``) -> URL; ``threshold``,
    ``warn_before``, ``kernel_activity``: the culler's settings; ``source``: who the notices come
    from; ``log`` and ``prefix``: where the lines go and how they begin.
    """

    def __init__(self, call: Call, api: Callable[[str], str], *, threshold: float, warn_before: float,
                 kernel_activity: bool, source: str, log: Callable[[], logging.Logger], prefix: str = "") -> None:
        self.call, self.api = call, api
        self.threshold, self.warn_before, self.kernel_activity = threshold, warn_before, kernel_activity
        self.source, self._log, self.prefix = source, log, prefix

    def _warning(self, text: str, *args) -> None:
        self._log().warning(self.prefix + text, *args)

    async def report(self, owner: str, samples: list | None = None, end_reason: str | None = None) -> None:
        """Tell the hub's usage accounting what was sampled, or why the server is about to stop."""
        body: dict = {"owner": owner, "threshold": self.threshold, "samples": [list(s) for s in samples or []]}
        if end_reason:
            body["end_reason"] = end_reason
        code, data = await self.call("POST", self.api("/gpus/usage/report"), body)
        if code != 200:
            self._warning("%s: the hub did not take the usage report (HTTP %s %s)", owner, code, data)

    async def tell(self, holder: dict, message: str, server: str) -> None:
        """Tell the server's user of the coming cull by the hub's notifier too (email, webhook: as they
        chose; ``POST /hub/api/gpus/notifications/events``); a failure only goes to the log."""
        name = f"Your server {holder['server']!r}" if holder.get("server") else "Your server"
        body = {"user": holder["user"], "event": "cull", "title": "Your idle GPU server will be stopped",
                "text": message.replace("This server", name, 1), "url": server + "/"}
        code, data = await self.call("POST", self.api("/gpus/notifications/events"), body)
        if code != 202:
            self._warning("%s: the hub did not take the cull notification (HTTP %s %s)", holder["owner"], code, data)

    async def read(self, owner: str, server: str, history: str) -> tuple[list, list[float]] | None:
        """(samples, kernel activity) of a server, its samples reported to the hub; None where its
        monitor (or kernels) cannot be read: then it is not judged this round."""
        code, sample = await self.call("GET", f"{server}/api/gpus?history={history}")
        if code != 200 or not isinstance(sample, dict):
            self._warning("%s: cannot read its GPU monitor (HTTP %s); not judging it this round", owner, code)
            return None
        samples = [(s["time"], highest_utilization(s)) for s in sample.get("history", [])]
        samples.append((sample["time"], highest_utilization(sample)))
        activity: list[float] = []
        if self.kernel_activity:
            code, kernels = await self.call("GET", f"{server}/api/kernels")
            if code != 200:
                self._warning("%s: cannot read its kernels (HTTP %s); not judging it this round", owner, code)
                return None
            activity = kernel_activity(kernels, sample["time"])
        await self.report(owner, samples)
        return samples, activity

    async def judge(self, tracker: IdleTracker, key: str, holder: dict, server: str, now: float, *,
                    history: str, when: str, gap: Callable[[str, list], None] | None = None) -> tuple[str, str]:
        """Read ``holder``'s server and decide: (action, what kept it idle). Actions are the tracker's
        (``"busy"``, ``"idle"``, ``"warn"``: warned now, or ``"stop"``: the caller stops it), or
        ``"unread"``. ``when``: when the warning says the stop comes ("in 3 minutes"); ``gap`` may
        add samples (the hook's rule for time its monitor forgot) before the tracker sees them."""
        owner = holder["owner"]
        read = await self.read(owner, server, history)
        if read is None:
            return "unread", ""
        samples, activity = read
        if gap is not None:
            gap(key, samples)
        action, idle_for = tracker.observe(key, samples, now, activity=activity)
        what = idle_summary(holder["uuids"], self.threshold, idle_for, self.kernel_activity)
        if action == "warn":
            message = warning_message(when, self.threshold, idle_for, self.kernel_activity)
            code = await post_notice(self.call, server, message, source=self.source)
            if not 200 <= code < 300:  # not warned: no stop until a warning got through
                self._warning("%s: its server did not take the warning (HTTP %s); trying again next round",
                              owner, code)
                return "idle", what
            tracker.warned(key, now)
            self._warning("warned %s: %s; stopping it %s unless they are used", owner, what, when)
            await self.tell(holder, message, server)
        return action, what
