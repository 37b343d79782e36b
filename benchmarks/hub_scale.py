"""The hub at scale: ``scripts/bench hub_scale [--small]``.

A real JupyterHub (gpu-local-simple) with ``--users`` users (default 1,000) and a static
inventory of ``--gpus`` simulated GPUs (default 10,000: 8 per host, NVLink between them,
A100s and H100s, plus one host of 8 Tesla T4s that a ``queue: true`` profile waits for).
Servers are mock processes (a few lines of ``http.server`` answering every request), so
the hub, not its servers, does the work. Figures only; nothing about timing is asserted.

Three phases, the first two with the hub profiled (cProfile in the hub's event-loop thread, switched
on and off by signals from here):

1. spawns: ``--spawns`` REST spawns (1, 2, 4 or 8 GPUs of any model, or none) from
   ``--clients`` threads at once, plus ``--queued`` spawns of the T4 profile, of which
   all but 8 wait in the hub's queue. Printed: the answer time of each POST (JupyterHub
   answers 201 once the server is up, 202 when it is still starting or queued), the
   hub's CPU per spawn, and the share of it spent in gpuspawner's own code;
2. mixed load: form loads (``GET /hub/spawn`` by logged-in users), ``GET /hub/api/gpus``
   (everyone's GPUs, an admin's view) and server stops and new spawns, all at once.
   Every stop wakes the queue, and every waiting spawn computes its estimate again (its
   place, what is held and its wait estimate, :mod:`gpuspawner.waits`): the time each estimate
   took is measured inside the hub (around ``GPUQueue.position`` ... ``describe``).

3. reads only: the same form loads and reads with nothing spawning or stopping, for what
   JupyterHub's own work for spawns and stops (database commits, new tokens) adds to their tail.

Goals printed beside the figures (issue 30): form and ``/hub/api/gpus`` p99 < 100 ms,
an estimate < 10 ms. Then, from each phase's profile: the hub's CPU per part (gpuspawner,
JupyterHub's own code, its database: SQLAlchemy and SQLite, Tornado and the sockets, the
rest), the CPU of one form load and one ``/hub/api/gpus`` read split into JupyterHub's
authentication, its spawn page and gpuspawner's part, the event loop's longest runs of one
callback (over 20 ms: what every request behind them waited for, with the request or task
that ran) and gpuspawner's top functions. ``--keep-profiles DIR`` keeps the cProfile
figures (``spawns.prof``, ``mixed.prof``) for ``python -m pstats``.

The defaults run in about a minute on 2 cores (7 before the first hot spots found here were
fixed, 3 before the second round), ``--small`` (100 users, 1,000 GPUs) in 30 seconds. The hub,
its proxy and the mock servers are stopped by pid on every way out, SIGTERM and SIGHUP included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import requests
from storm import cpu_seconds, figures, percentile

import gpuspawner
from hub import BASE_HUB_CONFIG, Hub, login, pid_alive

MODELS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
GPUSPAWNER = str(Path(gpuspawner.__file__).parent) + "/"  # the package the hub runs (and its files' names)
#: parts of the hub's CPU time (:meth:`Profiled.parts`): marks in a function's file name or name; the first
#: part that matches counts it
PARTS = {
    "gpuspawner": (GPUSPAWNER,),
    "JupyterHub": ("/jupyterhub/",),
    "its database (SQLAlchemy, SQLite)": ("/sqlalchemy/", "sqlite3"),
    "Tornado and sockets": ("/tornado/", "socket", "pycurl"),
    "other": (),
}
PROFILE_ON, PROFILE_OFF = signal.SIGRTMIN + 1, signal.SIGRTMIN + 2  # as the hub's configuration below says
T4_HOST_GPUS = 8  # the one host of the scarce model the queue profile waits for

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU", "gpu_models": ["any"], "gpu_counts": [0, 1, 2, 4, 8], "default_gpus": 1,
     "default": True},
    {"slug": "t4q", "display_name": "T4, queued", "gpu_models": ["t4"], "gpu_counts": [1], "queue": True},
]

MOCK_SERVER = """
import http.server, os, urllib.parse
url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"gpus": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((url.hostname, url.port), Answer).serve_forever()
"""

# The hub's own part: the inventory, profiles and mock servers, and the instruments: a profiler of the
# event-loop thread switched on by PROFILE_ON and off (its figures written) by PROFILE_OFF
# (JupyterHub's own SIGUSR1 logs its status), each queue estimate timed, the event loop's long runs.
HUB_CONFIG = BASE_HUB_CONFIG + """
import cProfile, signal, time
from gpuspawner.hub.setup import configure
from gpuspawner.queue import GPUQueue
bench = json.loads(open(settings["dir"] + "/bench.json").read())
c.JupyterHub.spawner_class = "gpu-local-simple"
c.GPUSimpleLocalProcessSpawner.allow_root_servers = True  # mock servers only, on a throwaway hub
c.GPUSpawnerMixin.gpu_isolation = "off"
c.Spawner.cmd = [bench["python"], "-I", "-S", bench["mock"]]
c.Spawner.args = []
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60
c.LocalProcessSpawner.env_keep = ["PATH", "LANG"]
c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]
c.GPUSpawnerMixin.gpu_inventory = "static"
c.GPUSpawnerMixin.static_gpus = bench["gpus"]
c.GPUSpawnerMixin.gpu_profiles = bench["profiles"]
if bench["database"]:
    c.JupyterHub.db_url = "sqlite:///" + bench["database"]
c.JupyterHub.concurrent_spawn_limit = 0
c.JupyterHub.api_page_default_limit = c.JupyterHub.api_page_max_limit = 5000  # every user in one page
c.JupyterHub.load_roles[0]["scopes"].append("custom:gpus:read")
configure(c)

_profile = {"now": None, "estimates": []}
_started = [None]
_position, _describe = GPUQueue.position, GPUQueue.describe

def _timed_position(self, *args, **kwargs):
    _started[0] = time.perf_counter()
    return _position(self, *args, **kwargs)

def _timed_describe(self, *args, **kwargs):
    text = _describe(self, *args, **kwargs)
    if _started[0] is not None:
        _profile["estimates"].append(time.perf_counter() - _started[0])
        _started[0] = None
    return text

GPUQueue.position, GPUQueue.describe = _timed_position, _timed_describe

# the event loop's longest runs of one callback (what every request behind it waits for), with what ran
import asyncio.events, weakref
_run, _profile["blocks"] = asyncio.events.Handle._run, []

def _what(handle):  # what a slow callback ran: a task's coroutines (outermost first), a request's path
    task = getattr(getattr(handle, "_callback", None), "__self__", None)
    if not isinstance(task, asyncio.Task):
        return repr(handle)[:200]
    names, coro, request = [], task.get_coro(), None
    while coro is not None and len(names) < 6:
        names.append(getattr(coro, "__qualname__", type(coro).__name__))
        frame = getattr(coro, "cr_frame", None)
        handler = frame.f_locals.get("self") if frame is not None else None
        request = request or getattr(handler, "request", None)
        coro = getattr(coro, "cr_await", None)
    where = f"{request.method} {request.path} " if request is not None else ""
    return where + " > ".join(names)

_said = weakref.WeakKeyDictionary()  # task -> what it runs, found at its first step (a task ends saying no more)

def _timed_run(self):
    task = getattr(getattr(self, "_callback", None), "__self__", None)
    if _profile["now"] is not None and isinstance(task, asyncio.Task) and task not in _said:
        _said[task] = _what(self)
    t0, cpu0 = time.perf_counter(), time.thread_time()
    _run(self)
    took = time.perf_counter() - t0
    if took > 0.02 and _profile["now"] is not None:
        _profile["blocks"].append((took, time.thread_time() - cpu0, _said.get(task) or _what(self)))

asyncio.events.Handle._run = _timed_run

def _profile_on(signum, frame):
    _profile["estimates"], _profile["blocks"] = [], []
    _profile["now"] = cProfile.Profile()  # (time.thread_time would leave out others' work, at twice the cost)
    _profile["now"].enable()

def _profile_off(signum, frame):
    _profile["now"].disable()
    _profile["now"].dump_stats(settings["dir"] + "/phase.prof")
    _profile["now"] = None
    with open(settings["dir"] + "/blocks.json", "w") as f:
        json.dump(sorted(_profile["blocks"], reverse=True), f)
    with open(settings["dir"] + "/estimates.json", "w") as f:
        json.dump(_profile["estimates"], f)

signal.signal(signal.SIGRTMIN + 1, _profile_on)
signal.signal(signal.SIGRTMIN + 2, _profile_off)
"""


def inventory(count: int) -> list[dict]:
    """``count`` GPUs, 8 per host with NVLink between them, the last host's 8 Tesla T4s (PCIe)."""
    gpus = []
    hosts = max(1, (count - T4_HOST_GPUS) // 8)
    for h in range(hosts):
        name = MODELS[h % len(MODELS)]
        for i in range(8):
            links = {str(j): "NV12" for j in range(8) if j != i}
            gpus.append({"uuid": f"GPU-{h:05d}-{i}", "name": name, "host": f"gpu{h:05d}", "index": i,
                         "memory_total": 80 * 2**30, "links": links})
    for i in range(T4_HOST_GPUS):
        gpus.append({"uuid": f"GPU-t4-{i}", "name": "Tesla T4", "host": "t4host", "index": i,
                     "memory_total": 15 * 2**30})
    return gpus


class Profiled:
    """One phase with the hub profiled: its CPU time, cProfile's figures and the estimates' times."""

    def __init__(self, hub: Hub, keep: Path | None = None) -> None:
        self.hub = hub
        self.keep = keep  # where to copy the phase's cProfile figures
        self.cpu = 0.0
        self.stats: pstats.Stats | None = None
        self.estimates: list[float] = []
        self.blocks: list[tuple[float, float, str]] = []  # (seconds, of them the hub's CPU, what ran)

    def __enter__(self) -> Profiled:
        os.kill(self.hub.proc.pid, PROFILE_ON)
        time.sleep(0.2)  # the handler runs between two bytecodes of the hub's main thread
        self.cpu = cpu_seconds(self.hub.proc.pid)
        return self

    def __exit__(self, *exc) -> None:
        self.cpu = cpu_seconds(self.hub.proc.pid) - self.cpu
        prof = self.hub.dir / "phase.prof"
        prof.unlink(missing_ok=True)
        os.kill(self.hub.proc.pid, PROFILE_OFF)
        deadline = time.monotonic() + 60
        while not prof.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # written in one go after the estimates
        self.stats = pstats.Stats(str(prof))
        if self.keep is not None:
            self.keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(prof, self.keep)
        self.estimates = json.loads((self.hub.dir / "estimates.json").read_text())
        self.blocks = json.loads((self.hub.dir / "blocks.json").read_text())

    def longest_blocks(self, count: int = 5) -> list[str]:
        """The event loop's longest runs of one callback (over 20 ms, profiled): what requests waited behind."""
        return [f"      {seconds * 1000:7.1f} ms (CPU {cpu * 1000:5.1f} ms)  {what}"
                for seconds, cpu, what in self.blocks[:count]]


    def parts(self) -> dict[str, float]:
        """The share of the hub's event-loop thread's CPU time per part (:data:`PARTS`)."""
        parts: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        for (filename, _, func), (_, _, tottime, _, _) in self.stats.stats.items():
            if filename == "~" and "select." in func:  # the event loop waiting for work
                continue
            where = f"{filename} {func}"
            part = next((name for name, marks in PARTS.items() if any(m in where for m in marks)), "other")
            parts[part] += tottime
        total = sum(parts.values()) or 1.0
        return {name: seconds / total for name, seconds in parts.items()}

    def said_parts(self) -> str:
        return ", ".join(f"{name} {share:.0%}" for name, share in self.parts().items())

    def per_request(self, path: str, func: str, requests: int) -> float:
        """CPU seconds per request in function ``func`` of a file ending in ``path`` and below it (a coroutine's
        every resumption counted, its waits not)."""
        seconds = sum(cumtime for (filename, _, name), (_, _, _, cumtime, _) in self.stats.stats.items()
                      if name == func and filename.endswith(path))
        return seconds / max(1, requests)

    def top(self, count: int = 8) -> list[str]:
        """gpuspawner's functions with the most time in them and below them (cumulative)."""
        rows = []
        for (filename, line, func), (_, calls, tottime, cumtime, _) in self.stats.stats.items():
            if filename.startswith(GPUSPAWNER):
                where = filename[len(GPUSPAWNER):]
                rows.append((cumtime, tottime, calls, f"{where}:{line} {func}"))
        rows.sort(reverse=True)
        return [f"      {cum * 1000:9.1f} ms cum {tot * 1000:8.1f} ms own {calls:7d} calls  {name}"
                for cum, tot, calls, name in rows[:count]]


def timed(call) -> tuple[float, requests.Response]:
    t0 = time.perf_counter()
    r = call()
    return time.perf_counter() - t0, r


def spawn_body(rng: random.Random) -> dict:
    """A server of 0, 1, 2, 4 or 8 A100s or H100s (not "any": any model includes the T4s, and a request
    for GPUs that queued requests wait for is refused, code ``queued_ahead``)."""
    gpus = rng.choice([0, 1, 1, 1, 2, 2, 4, 8])
    return {"profile": "gpu", "gpus": gpus, "gpu_model": rng.choice(["a100-sxm4-80gb", "h100-80gb-hbm3"])}


def run_all(jobs: list, clients: int) -> list:
    pool = ThreadPoolExecutor(clients)
    try:
        return list(pool.map(lambda job: job(), jobs))
    finally:  # stopped (a signal, an error): the jobs not begun are dropped, the hub stopped sooner
        pool.shutdown(cancel_futures=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="100 users, 1,000 GPUs, fewer requests")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=10000)
    parser.add_argument("--spawns", type=int, default=60, help="GPU servers spawned in phase 1")
    parser.add_argument("--queued", type=int, default=16, help="spawns of the queued T4 profile (8 T4s)")
    parser.add_argument("--forms", type=int, default=100, help="form loads in phase 2")
    parser.add_argument("--reads", type=int, default=30, help="GET /hub/api/gpus in phase 2")
    parser.add_argument("--churn", type=int, default=10, help="server stops (and as many new spawns) in phase 2")
    parser.add_argument("--clients", type=int, default=8, help="concurrent client threads")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--database", metavar="DIR",
                        help="keep the hub's SQLite database in a folder made in DIR (e.g. /dev/shm: no disk "
                             "writes to wait for) instead of beside the hub on disk")
    parser.add_argument("--keep-profiles", type=Path, metavar="DIR",
                        help="copy each phase's cProfile figures to DIR/spawns.prof and DIR/mixed.prof")
    args = parser.parse_args()
    if args.small:
        args.users, args.gpus, args.spawns, args.queued = 100, 1000, 20, 12
        args.forms, args.reads, args.churn = 60, 40, 8
    rng = random.Random(args.seed)
    gpus = inventory(args.gpus)
    print(f"hub_scale: {args.users} users, {len(gpus)} GPUs on {len({g['host'] for g in gpus})} hosts, "
          f"{args.clients} clients, the hub's database in {args.database or 'its folder'}; {platform.node()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)

    folder = Path(tempfile.mkdtemp(prefix="gpuspawner-hub-scale-"))
    database = Path(tempfile.mkdtemp(prefix="gpuspawner-hub-scale-db-", dir=args.database)) if args.database else None
    mock = folder / "mock_server.py"
    mock.write_text(MOCK_SERVER)
    config = folder / "jupyterhub_config.py"
    config.write_text(HUB_CONFIG)
    hub = Hub(folder / "hub", {}, config_file=config)
    (hub.dir / "bench.json").write_text(json.dumps(
        {"python": sys.executable, "mock": str(mock), "gpus": gpus, "profiles": PROFILES,
         "database": str(database / "hub.sqlite") if database else None}))
    try:
        t0 = time.perf_counter()
        hub.start(timeout=300)
        print(f"  hub answered {time.perf_counter() - t0:.1f} s after its start", flush=True)
        names = [f"u{n:04d}" for n in range(args.users)]
        for n in range(0, len(names), 200):
            hub.add_users(*names[n:n + 200])
        order = names[:]
        rng.shuffle(order)
        spawners, queued = order[:args.spawns], order[args.spawns:args.spawns + args.queued]
        rest = order[args.spawns + args.queued:]
        newcomers, formers = rest[:args.churn], rest[args.churn:][:max(1, args.forms // 4)]
        sessions = {name: login(hub, name) for name in formers}

        # ---------------------------------------------------------------- phase 1: spawns
        jobs = [partial(timed, partial(hub.spawn, n, spawn_body(rng))) for n in spawners]
        # a queued spawn's POST is answered 202 after JupyterHub's slow_spawn_timeout (10 s): their own threads
        waits = [partial(timed, partial(hub.spawn, n, {"profile": "t4q", "gpus": 1, "gpu_model": "t4"}))
                 for n in queued]
        keep = args.keep_profiles
        with (Profiled(hub, keep and keep / "spawns.prof") as spawning,
              ThreadPoolExecutor(max(1, len(waits))) as waiting_pool):
            queued_answers = [waiting_pool.submit(job) for job in waits]
            answers = run_all(jobs, args.clients)
            answers += [future.result() for future in queued_answers]
            wait_started(hub, spawners)
        statuses = sorted({r.status_code for _, r in answers})
        print("\n1. spawns")
        print(f"  POST answer  {figures([s for s, _ in answers], 'ms', 1000)}; statuses {statuses}")
        for status in sorted({r.status_code for _, r in answers} - {201, 202}):
            print(f"    {status}: {next(r.text for _, r in answers if r.status_code == status)[:300]}")
        per_spawn = spawning.cpu / len(jobs)
        share = spawning.parts()["gpuspawner"]
        print(f"  hub CPU per spawn {per_spawn * 1000:.1f} ms (profiled), of it in gpuspawner's own code "
              f"{share:.0%}: {per_spawn * share * 1000:.1f} ms")
        print(f"  the hub's CPU: {spawning.said_parts()}")
        print("  top gpuspawner functions:\n" + "\n".join(spawning.top()))

        # ---------------------------------------------------------------- phase 2: mixed load
        forms, reads, churn = [], [], []
        form_users = list(sessions)

        def form(name: str) -> None:
            seconds, r = timed(lambda: sessions[name].get(hub.url + "/hub/spawn", timeout=90))
            assert r.ok and 'name="profile"' in r.text, (r.status_code, r.url)
            forms.append(seconds)

        def read() -> None:
            seconds, r = timed(lambda: hub.api("GET", "/gpus"))
            assert r.ok, r.text
            reads.append(seconds)

        def swap(old: str, new: str) -> None:
            seconds, r = timed(lambda: hub.api("DELETE", f"/users/{old}/server"))
            churn.append(seconds)
            seconds, r = timed(lambda: hub.spawn(new, spawn_body(rng)))
            churn.append(seconds)

        jobs = [partial(form, form_users[k % len(form_users)]) for k in range(args.forms)]
        jobs += [read] * args.reads
        jobs += [partial(swap, old, new) for old, new in zip(spawners, newcomers, strict=False)]
        rng.shuffle(jobs)
        with Profiled(hub, keep and keep / "mixed.prof") as mixed:
            run_all(jobs, args.clients)
        waiting = len(hub.api("GET", "/gpus").json().get("queue", []))
        print(f"\n2. mixed load (form loads, /hub/api/gpus reads, stops and spawns at once; "
              f"load average now {os.getloadavg()[0]:.2f})")
        print(f"  form (GET /hub/spawn)  {figures(forms, 'ms', 1000)}; goal p99 < 100 ms")
        print(f"  GET /hub/api/gpus      {figures(reads, 'ms', 1000)}; goal p99 < 100 ms")
        print(f"  stop/spawn answer      {figures(churn, 'ms', 1000)}")
        estimates = spawning.estimates + mixed.estimates
        print(f"  queue estimate (in the hub, {waiting} waiting) {figures(estimates, 'ms', 1000)}; goal < 10 ms")
        print(f"  hub CPU in this phase {mixed.cpu:.1f} s (profiled): {mixed.said_parts()}")
        auth = mixed.per_request("jupyterhub/handlers/base.py", "prepare", len(jobs) + len(churn) // 2)
        page = mixed.per_request("jupyterhub/handlers/pages.py", "_get", len(forms))
        ours = mixed.per_request("gpuspawner/backends/options.py", "get_options_form", len(forms))
        api = mixed.per_request("gpuspawner/hub/handlers.py", "get", len(reads))
        print(f"  hub CPU per request (profiled): form {(auth + page) * 1000:.1f} ms (JupyterHub's authentication "
              f"{auth * 1000:.1f} ms, its spawn page {(page - ours) * 1000:.1f} ms, gpuspawner's form "
              f"{ours * 1000:.1f} ms); /hub/api/gpus {(auth + api) * 1000:.1f} ms (authentication "
              f"{auth * 1000:.1f} ms, gpuspawner's overview {api * 1000:.1f} ms)")
        print(f"  the event loop ran one callback over 20 ms {len(mixed.blocks)} times, "
              f"{sum(b[0] for b in mixed.blocks):.1f} s in all (the hub's CPU in them "
              f"{sum(b[1] for b in mixed.blocks):.1f} s); the longest:\n" + "\n".join(mixed.longest_blocks()))
        print("  top gpuspawner functions:\n" + "\n".join(mixed.top()))

        # ---------------------------------------------------------------- phase 3: reads only
        # the same form loads and reads with no spawn or stop beside them: what JupyterHub's own work for
        # spawns and stops (its database commits, new tokens) adds to their tail
        mixed_forms, mixed_reads = forms, reads
        forms, reads = [], []
        jobs = [partial(form, form_users[k % len(form_users)]) for k in range(args.forms)] + [read] * args.reads
        rng.shuffle(jobs)
        run_all(jobs, args.clients)
        print(f"\n3. reads only (the same form loads and reads, nothing spawning or stopping; "
              f"load average now {os.getloadavg()[0]:.2f})")
        print(f"  form (GET /hub/spawn)  {figures(forms, 'ms', 1000)}")
        print(f"  GET /hub/api/gpus      {figures(reads, 'ms', 1000)}")
        forms, reads = mixed_forms, mixed_reads
        goals = [("form p99", percentile(forms, 99), 0.1), ("/hub/api/gpus p99", percentile(reads, 99), 0.1),
                 ("estimate p99", percentile(estimates, 99) if estimates else 0.0, 0.01)]
        print("\ngoals: " + "; ".join(f"{label} {value * 1000:.1f} ms {'met' if value < goal else 'NOT met'}"
                                      for label, value, goal in goals))
    except BaseException:
        exit_code = hub.proc.poll() if hub.proc else None
        print(("the hub is still running" if exit_code is None else f"the hub exited ({exit_code})")
              + f"; its log ends:\n{hub.log()}")
        raise
    finally:
        proxy = proxy_pid(hub)
        hub.close()
        left = [f"{what} {pid}" for what, pid in (("hub", hub.proc and hub.proc.pid), ("proxy", proxy))
                if pid and not ended(pid)]
        shutil.rmtree(folder, ignore_errors=True)
        if database:
            shutil.rmtree(database, ignore_errors=True)
        print(f"\nstopped the hub, its proxy and its servers; removed {folder}" if not left else
              f"\nNOT stopped: {', '.join(left)}; removed {folder}")
    return 0


def proxy_pid(hub: Hub) -> int | None:
    """The pid of the hub's configurable-http-proxy, from the pid file JupyterHub writes."""
    try:
        return int((hub.dir / "proxy.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def ended(pid: int, timeout: float = 15) -> bool:
    """Whether process ``pid`` ends within ``timeout`` seconds (a zombie has ended)."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not pid_alive(pid)


def exit_on_signal(signum: int, frame) -> None:
    """SIGTERM or SIGHUP (``timeout``, a closed terminal, a job stopped by pid): exit through ``main``'s
    ``finally``, which stops the hub and its proxy, instead of dying and leaving them running."""
    raise SystemExit(128 + signum)


def wait_started(hub: Hub, names: list[str], timeout: float = 300) -> None:
    """Until every server of ``names`` is ready or gone (a 202 still starting)."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        users = {u["name"]: u for u in hub.api("GET", "/users").json()}
        pending = {n for n in pending if any(s.get("pending") for s in users[n]["servers"].values())}
        if pending:
            time.sleep(0.3)


if __name__ == "__main__":
    threading.current_thread().name = "hub_scale"
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, exit_on_signal)
    sys.exit(main())
