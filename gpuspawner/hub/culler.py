"""GPU-aware idle culler: a JupyterHub service that stops servers whose GPUs stay idle.

Run by the hub as a managed service (``gpuspawner.hub.setup.configure(c, culler={...})``)::

    python -m gpuspawner.hub.culler --url http://127.0.0.1:8000 --period 60 \\
        --threshold 5 --idle-timeout 3600 --warn-before 600

Every ``period`` seconds it lists the servers holding GPUs (``GET /hub/api/gpus``),
reads each server's monitor with history (``GET {server}/api/gpus?history=...``,
through the proxy at ``--url``) and tracks how long all of the server's GPUs
stayed below ``threshold`` % utilisation. By default that is all it looks at,
whatever the kernels do; with ``--kernel-activity on`` it also reads the
server's kernels (``GET {server}/api/kernels``, Jupyter Server's own API) and
counts a kernel running code (``execution_state`` busy) or active since the
last round (``last_activity``: code run, completions and inspections as the
user types) as use, as a busy GPU is (:class:`gpuspawner.idle.IdleTracker`).
After ``idle-timeout - warn-before`` seconds idle it posts a notice to the server
(``POST {server}/api/gpus/notices``), which JupyterLab shows; when the server
is still idle ``idle-timeout`` seconds in and at least ``warn-before`` seconds
after the warning, it stops the server and logs why. Any GPU at or above the
threshold starts the count again. Needs the scopes in ``setup.CULLER_SCOPES``.

Tracking belongs to one start of one server: it is keyed by the server and the
time its GPUs were taken (``since`` in ``/hub/api/gpus``), so a server stopped
and started again, however quickly, begins with a clean record. A server is
stopped only after a warning that its server accepted (a notice the server did
not take is tried again the next round), and only while the start that was
warned still holds the GPUs: the culler reads the overview again right before
it stops a server, so a user who restarted meanwhile keeps the new server.

Lifetime: one culler per hub, and none without its hub.

- *It ends with its hub.* Every ``HUB_CHECK_INTERVAL`` second it compares its
  parent's pid with the hub's (``--hub-pid``, which ``configure()`` sets to the
  pid of the hub process that loads the configuration; by default the parent
  it had at start). A process whose parent dies is handed to another parent,
  so a different ``getppid()`` means the hub is gone, even when it was
  SIGKILLed and had no chance to stop its services: the culler then exits.
  Comparing the parent, rather than asking whether the hub's pid is alive,
  cannot be fooled by a new process reusing that pid.
- *A hub never has two cullers.* Before its first round the culler takes an
  exclusive lock (``flock``) on its pid file (``--pid-file``, default
  ``jupyterhub-gpu-culler.pid`` in the working directory, which for a managed
  service is the hub's, as for JupyterHub's own ``jupyterhub-proxy.pid``) and
  writes its pid into it; it holds the lock until it exits, and the kernel
  releases it however it exits. A culler that finds the lock held (a hub
  restarted before its old culler noticed) sends SIGTERM to the pid in the file,
  then SIGKILL if the holder still holds the lock after ``TAKEOVER_GRACE``
  seconds, and acts only once it holds the lock itself. So the lock, not the
  file's existence, says whether a culler runs: a stale file left behind by a
  killed culler is simply locked again. Give each hub its own pid file (the
  runnable default keeps it in its state directory): hubs sharing one would
  stop each other's cullers.
- *It stops at once when told.* SIGINT and SIGTERM (JupyterHub's service
  cleanup sends SIGINT, then SIGTERM after ``interrupt_timeout``) cancel the
  round in progress, close the HTTP client, release the lock and exit with
  status 0. The handlers are installed explicitly, because a hub started as a
  background job of a shell runs with SIGINT ignored, and its children inherit
  that.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import fcntl
import logging
import os
import signal
import sys
import time
from urllib.parse import quote

from ..idle import IdleTracker
from .judging import NOTICE_ID, HubHTTP, Judge, _duration, post_notice, start_key, warning_message

__all__ = ["NOTICE_ID", "Culler", "IdleTracker", "main", "parse_args", "post_notice", "warning_message"]

log = logging.getLogger("gpuspawner.culler")

PID_FILE = "jupyterhub-gpu-culler.pid"
HUB_CHECK_INTERVAL = 1.0  # seconds between checks that the hub is still there
TAKEOVER_GRACE = 5.0  # seconds a previous culler gets to exit on SIGTERM, then again on SIGKILL


class Culler:
    def __init__(self, args: argparse.Namespace, api_url: str, token: str) -> None:
        self.args = args
        self.api_url = api_url.rstrip("/")
        self.tracker = IdleTracker(args.threshold, args.idle_timeout, args.warn_before)
        self.call = HubHTTP(token)
        self.judge = Judge(self.call, lambda path: self.api_url + path, threshold=args.threshold,
                           warn_before=args.warn_before, kernel_activity=args.kernel_activity == "on",
                           source="gpu-culler", log=lambda: log)

    def close(self) -> None:
        self.call.close()

    def _server_url(self, path: str) -> str:
        return path if path.startswith("http") else self.args.url.rstrip("/") + path

    async def holders(self) -> dict[str, dict]:
        """start key -> {owner, user, server, since, url, uuids} for running servers holding GPUs.

        The key (:func:`start_key`) names one start of one server, so that what is
        tracked of an earlier start never carries over to the next.
        """
        code, data = await self.call("GET", f"{self.api_url}/gpus")
        if code != 200 or not data:
            log.error("cannot read the GPU overview: HTTP %s %s", code, data)
            return {}
        found: dict[str, dict] = {}
        for gpu in data["gpus"]:
            holder = gpu.get("holder")
            if holder and holder.get("kind") == "job":
                continue  # a notebook job ends by itself (or at its time limit): never culled
            if holder and holder.get("state") == "running" and holder.get("url"):
                entry = found.setdefault(start_key(holder), {**holder, "uuids": []})
                entry["uuids"].append(gpu["uuid"])
        return found

    async def check(self, key: str, holder: dict, now: float) -> None:
        owner = holder["owner"]
        base = self._server_url(holder["url"]).rstrip("/")
        window = max(self.args.period * 3, 30)
        action, what = await self.judge.judge(self.tracker, key, holder, base, now, history=f"{window:g}",
                                              when=f"in {_duration(self.args.warn_before)}")
        if action != "stop":
            return
        if key not in await self.holders():
            log.info("%s: not stopped: the start that was warned no longer holds its GPUs", owner)
            return
        user, server = holder["user"], holder["server"]
        path = f"/users/{quote(user)}/servers/{quote(server)}" if server else f"/users/{quote(user)}/server"
        await self.judge.report(owner, end_reason="culled")  # before the stop: the usage record says why it ended
        code, _ = await self.call("DELETE", self.api_url + path)
        log.warning("stopping %s because %s (idle timeout %s, warned %s before): HTTP %s",
                    owner, what, _duration(self.args.idle_timeout), _duration(self.args.warn_before), code)

    async def once(self) -> None:
        holders = await self.holders()
        self.tracker.forget_except(set(holders))
        now = time.time()
        await asyncio.gather(*(self.check(k, h, now) for k, h in holders.items()), return_exceptions=False)

    async def run(self) -> None:
        log.info("GPU idle culler: every %ss, stop servers whose GPUs stay below %s%%%s for %ss (warning %ss before)",
                 self.args.period, self.args.threshold,
                 " and whose kernels run no code" if self.args.kernel_activity == "on" else "",
                 self.args.idle_timeout, self.args.warn_before)
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
    parser.add_argument("--kernel-activity", choices=("on", "off"), default="off",
                        help="on: a kernel running code, or active since the last round, counts as use, as a "
                             "busy GPU does (read from the server's /api/kernels); off: the GPUs alone decide")
    parser.add_argument("--pid-file", default=PID_FILE,
                        help="file locked while this culler runs, holding its pid; a new culler stops the "
                             "one that holds it (one per hub; relative paths are in the working directory)")
    parser.add_argument("--hub-pid", type=int, default=None,
                        help="the hub's pid: exit when it is no longer this process's parent "
                             "(default: the parent at start)")
    args = parser.parse_args(argv)
    for name in ("period", "idle_timeout"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0 <= args.warn_before < args.idle_timeout:
        parser.error("--warn-before must be >= 0 and less than --idle-timeout")
    if not 0 < args.threshold <= 100:
        parser.error("--threshold must be a percentage above 0")
    return args


def _is_culler(pid: int) -> bool:
    """Whether ``pid`` runs a culler, where /proc tells; elsewhere the lock's holder is trusted."""
    if not os.path.isdir("/proc/self"):
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"gpuspawner.hub.culler" in f.read()
    except OSError:
        return False


class PidLock:
    """The pid file, locked for as long as this culler runs (see the module's docstring)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.fd: int | None = None

    def _try(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def _holder(self) -> int | None:
        os.lseek(self.fd, 0, os.SEEK_SET)
        text = os.read(self.fd, 32).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None

    def _wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self._try():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def acquire(self) -> None:
        """Take the lock, stopping the culler that holds it; raise RuntimeError if it cannot be had."""
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not self._try():
            for sig in (signal.SIGTERM, signal.SIGKILL):
                holder = self._holder()
                if holder is None or not _is_culler(holder):
                    # the holder has not written its pid yet, or the file holds a stale one: wait
                    if self._wait(TAKEOVER_GRACE):
                        break
                    continue
                log.warning("%s: the culler of a previous hub (pid %s) still runs; sending it %s",
                            self.path, holder, sig.name)
                try:
                    os.kill(holder, sig)
                except ProcessLookupError:
                    pass
                if self._wait(TAKEOVER_GRACE):
                    break
            else:
                raise RuntimeError(f"{self.path} stays locked by pid {self._holder()}; not starting a second culler")
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Empty the file and unlock it (never remove it: a waiting culler holds it open)."""
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)
            self.fd = None


async def _watch_hub(hub_pid: int, stop) -> None:
    while os.getppid() == hub_pid:
        await asyncio.sleep(HUB_CHECK_INTERVAL)
    stop(f"the hub (pid {hub_pid}) is gone")


async def serve(args: argparse.Namespace, api_url: str, token: str) -> str:
    """Cull until SIGINT, SIGTERM or the hub's end; return why it stopped."""
    main_task = asyncio.current_task()
    why: list[str] = []

    def stop(reason: str) -> None:
        if not why:
            why.append(reason)
            main_task.cancel()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, f"received {sig.name}")
    watch = asyncio.ensure_future(_watch_hub(args.hub_pid or os.getppid(), stop))
    culler = Culler(args, api_url, token)
    try:
        await culler.run()
    except asyncio.CancelledError:
        if not why:
            raise
    finally:
        watch.cancel()
        culler.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return why[0]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(levelname)1.1s %(asctime)s gpu-culler] %(message)s")
    token = os.environ.get("JUPYTERHUB_API_TOKEN")
    api_url = os.environ.get("JUPYTERHUB_API_URL")
    if not token or not api_url:
        sys.exit("gpu-culler: JUPYTERHUB_API_TOKEN and JUPYTERHUB_API_URL must be set (run it as a JupyterHub service)")
    if args.hub_pid and os.getppid() != args.hub_pid:
        sys.exit(f"gpu-culler: the hub (pid {args.hub_pid}) is gone already")
    for sig in (signal.SIGINT, signal.SIGTERM):  # until serve() handles them: end at once, even if inherited ignored
        signal.signal(sig, signal.SIG_DFL)
    lock = PidLock(args.pid_file)
    try:
        lock.acquire()
    except RuntimeError as error:
        sys.exit(f"gpu-culler: {error}")
    try:
        why = asyncio.run(serve(args, api_url, token))
    finally:
        lock.release()
    log.info("stopped: %s", why)


if __name__ == "__main__":
    main()
