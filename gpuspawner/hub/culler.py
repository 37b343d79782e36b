"""GPU-aware idle culler: a JupyterHub service that stops servers whose GPUs stay idle.

Run by the hub as a managed service (``gpuspawner.hub.setup.configure(c, culler={...})``)::

    python -m gpuspawner.hub.culler --url http://127.0.0.1:8000 --period 60 \\
        --threshold 5 --idle-timeout 3600 --warn-before 600

Every ``period`` seconds it lists the servers holding GPUs (``GET /hub/api/gpus``),
reads each server's monitor with history (``GET {server}/api/gpus?history=...``,
through the proxy at ``--url``) and tracks how long all of the server's GPUs
stayed below ``threshold`` % utilisation, whatever its kernels do. After
``idle-timeout - warn-before`` seconds idle it posts a notice to the server
(``POST {server}/api/gpus/notices``), which JupyterLab shows; when the server
is still idle ``idle-timeout`` seconds in and at least ``warn-before`` seconds
after the warning, it stops the server and logs why. Any GPU at or above the
threshold starts the count again. Needs the scopes in ``setup.CULLER_SCOPES``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

log = logging.getLogger("gpuspawner.culler")

NOTICE_ID = "gpu-culler"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} seconds"
    if seconds < 7200:
        return f"{round(seconds / 60)} minutes"
    return f"{seconds / 3600:.1f} hours"


@dataclass
class _Idle:
    idle_since: float | None = None  # sample time when the current idle stretch began
    last_sample: float = float("-inf")  # newest sample seen (known or not)
    last_known: float = float("-inf")  # newest sample with a utilisation value
    warned_at: float | None = None  # wall time of the warning


@dataclass
class IdleTracker:
    """Pure bookkeeping: per server, since when its GPUs are idle and what to do now."""

    threshold: float
    idle_timeout: float
    warn_before: float
    _servers: dict[str, _Idle] = field(default_factory=dict)

    def observe(self, owner: str, samples: list[tuple[float, float | None]], now: float) -> tuple[str, float]:
        """Feed (sample time, highest GPU utilisation) pairs; return (action, seconds idle).

        Actions: ``"busy"``, ``"idle"`` (not long enough yet), ``"warn"`` (warn now)
        and ``"stop"`` (warned long enough ago and still idle).
        """
        state = self._servers.setdefault(owner, _Idle())
        for at, utilization in sorted(samples):
            if at <= state.last_sample:
                continue
            state.last_sample = at
            if utilization is None:  # unknown time counts neither as idle nor as busy
                continue
            state.last_known = at
            if utilization >= self.threshold:
                state.idle_since, state.warned_at = None, None
            elif state.idle_since is None:
                state.idle_since = at
        if state.idle_since is None:
            return "busy", 0.0
        idle_for = state.last_known - state.idle_since
        if state.warned_at is None:
            if idle_for >= self.idle_timeout - self.warn_before:
                return "warn", idle_for
            return "idle", idle_for
        if idle_for >= self.idle_timeout and now - state.warned_at >= self.warn_before:
            return "stop", idle_for
        return "idle", idle_for

    def warned(self, owner: str, now: float) -> None:
        self._servers.setdefault(owner, _Idle()).warned_at = now

    def forget_except(self, owners: set[str]) -> None:
        for gone in set(self._servers) - owners:
            del self._servers[gone]


def highest_utilization(sample: dict) -> float | None:
    values = [g.get("utilization_gpu") for g in sample.get("gpus", [])]
    values = [v for v in values if isinstance(v, (int, float))]
    return max(values) if values else None


class Culler:
    def __init__(self, args: argparse.Namespace, api_url: str, token: str) -> None:
        self.args = args
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.tracker = IdleTracker(args.threshold, args.idle_timeout, args.warn_before)
        self.http = AsyncHTTPClient()

    async def _call(self, method: str, url: str, body: dict | None = None) -> tuple[int, dict | None]:
        request = HTTPRequest(
            url, method=method, headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=json.dumps(body) if body is not None else None, allow_nonstandard_methods=True,
            connect_timeout=10, request_timeout=30, follow_redirects=False,
        )
        response = await self.http.fetch(request, raise_error=False)
        try:
            data = json.loads(response.body) if response.body else None
        except ValueError:
            data = None
        return response.code, data

    def _server_url(self, path: str) -> str:
        return path if path.startswith("http") else self.args.url.rstrip("/") + path

    async def holders(self) -> dict[str, dict]:
        """owner -> {user, server, url, uuids} for running servers holding GPUs."""
        code, data = await self._call("GET", f"{self.api_url}/gpus")
        if code != 200 or not data:
            log.error("cannot read the GPU overview: HTTP %s %s", code, data)
            return {}
        found: dict[str, dict] = {}
        for gpu in data["gpus"]:
            holder = gpu.get("holder")
            if holder and holder.get("state") == "running" and holder.get("url"):
                entry = found.setdefault(holder["owner"], {**holder, "uuids": []})
                entry["uuids"].append(gpu["uuid"])
        return found

    async def check(self, owner: str, holder: dict, now: float) -> None:
        base = self._server_url(holder["url"]).rstrip("/")
        window = max(self.args.period * 3, 30)
        code, sample = await self._call("GET", f"{base}/api/gpus?history={window:g}")
        if code != 200 or not sample:
            log.warning("%s: cannot read its GPU monitor (HTTP %s); not judging it this time", owner, code)
            return
        samples = [(s["time"], highest_utilization(s)) for s in sample.get("history", [])]
        samples.append((sample["time"], highest_utilization(sample)))
        action, idle_for = self.tracker.observe(owner, samples, now)
        what = (f"its GPUs ({', '.join(holder['uuids'])}) stayed below {self.args.threshold:g}% utilisation "
                f"for {_duration(idle_for)}")
        if action == "warn":
            message = (f"This server will be stopped in {_duration(self.args.warn_before)} because its GPUs are idle "
                       f"(below {self.args.threshold:g}% utilisation for {_duration(idle_for)}). "
                       "Use them, or stop the server yourself to give them to others.")
            notice = {"id": NOTICE_ID, "level": "warning", "message": message, "source": "gpu-culler"}
            code, _ = await self._call("POST", f"{base}/api/gpus/notices", notice)
            self.tracker.warned(owner, now)
            log.warning("warned %s (notice HTTP %s): %s; stopping it in %s unless they are used",
                        owner, code, what, _duration(self.args.warn_before))
        elif action == "stop":
            user, server = holder["user"], holder["server"]
            path = f"/users/{quote(user)}/servers/{quote(server)}" if server else f"/users/{quote(user)}/server"
            code, data = await self._call("DELETE", self.api_url + path)
            log.warning("stopping %s because %s (idle timeout %s, warned %s before): HTTP %s",
                        owner, what, _duration(self.args.idle_timeout), _duration(self.args.warn_before), code)

    async def once(self) -> None:
        holders = await self.holders()
        self.tracker.forget_except(set(holders))
        now = time.time()
        await asyncio.gather(*(self.check(o, h, now) for o, h in holders.items()), return_exceptions=False)

    async def run(self) -> None:
        log.info("GPU idle culler: every %ss, stop servers whose GPUs stay below %s%% for %ss (warning %ss before)",
                 self.args.period, self.args.threshold, self.args.idle_timeout, self.args.warn_before)
        while True:
            try:
                await self.once()
            except Exception:
                log.exception("culling round failed")
            await asyncio.sleep(self.args.period)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpuspawner.hub.culler", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("JUPYTERHUB_PUBLIC_URL", "http://127.0.0.1:8000"),
                        help="the proxy's URL, through which the servers' monitors are reached")
    parser.add_argument("--period", type=float, default=60.0, help="seconds between rounds")
    parser.add_argument("--threshold", type=float, default=5.0, help="GPU utilisation (%%) below which a GPU is idle")
    parser.add_argument("--idle-timeout", type=float, default=3600.0, help="seconds idle before the server is stopped")
    parser.add_argument("--warn-before", type=float, default=600.0, help="seconds between the warning and the stop")
    args = parser.parse_args(argv)
    for name in ("period", "idle_timeout"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0 <= args.warn_before < args.idle_timeout:
        parser.error("--warn-before must be >= 0 and less than --idle-timeout")
    if not 0 < args.threshold <= 100:
        parser.error("--threshold must be a percentage above 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(levelname)1.1s %(asctime)s gpu-culler] %(message)s")
    token = os.environ.get("JUPYTERHUB_API_TOKEN")
    api_url = os.environ.get("JUPYTERHUB_API_URL")
    if not token or not api_url:
        sys.exit("gpu-culler: JUPYTERHUB_API_TOKEN and JUPYTERHUB_API_URL must be set (run it as a JupyterHub service)")
    asyncio.run(Culler(args, api_url, token).run())


if __name__ == "__main__":
    main()
