"""GPU monitor cost: NVML calls and server CPU with 0, 1, 10 and 100 stream clients; snapshot latency.

Starts a real ``jupyter server`` with the monitor on the stand-in NVML (4
simulated GPUs, its default settings: 1 sample per second) and counts NVML
calls with FAKENVML_COUNTS. Server CPU comes from /proc/PID/stat of the server
process. Each client is one browser tab with the status bar (its GPU panel
closed); one more row has the panel on screen. The 0 row is measured after a
request and ``idle_pause`` (nobody watching); a last row has nobody watching
but a GPU culler reading the history
every ``--culler-period`` seconds, as gpuspawner's culler does. Goals: never
more NVML calls than nvdashboard at any number of clients; they do not grow
with clients; under 3% of one core at 100 clients.

    scripts/bench monitor [--window 30] [--nvdashboard [PATH]] [--culler-period 60]

``--nvdashboard`` measures jupyterlab-nvdashboard the same way, in the same
run: a second ``jupyter server`` with only nvdashboard's server extension (the
monitor switched off there) on the same stand-in devices, each client one
JupyterLab page with nvdashboard's "GPU Utilization" and "GPU Memory" widgets
open, that is one websocket to each of ``nvdashboard/gpu_utilization`` and
``nvdashboard/gpu_usage`` (their default period is 1 s, like the monitor's).
nvdashboard is pip-installed with ``--no-deps --target PATH`` (default
``build/nvdashboard``) and put on the server's PYTHONPATH only, so the
project's environment is not changed; its requirements must already be met
by this environment, else the script says which one is not and skips it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path

import requests
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

import fakenvml
from jupyter_server_proc import JupyterServer

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
CLIENT_COUNTS = (0, 1, 10, 100)
IDLE_PAUSE = 30.0  # GPUMonitor.idle_pause's default: after it, nobody is watching
NVDASHBOARD = "jupyterlab-nvdashboard"
NVDASHBOARD_WIDGETS = ("gpu_utilization", "gpu_usage")  # "GPU Utilization" and "GPU Memory"

Client = Callable[[JupyterServer, list[int], int], Awaitable[None]]


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def stream_client(server: JupyterServer, received: list[int], index: int, view: str = "status") -> None:
    """One browser tab: one event stream, ``api/gpus/stream``; ``view=panel`` when its GPU panel is on screen."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    path = server.base_url + "api/gpus/stream" + ("?view=panel" if view == "panel" else "")
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: token {server.token}\r\n"
                 "Accept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"event: sample"):
                received[index] += 1
    finally:
        writer.close()


async def nvdashboard_client(server: JupyterServer, received: list[int], index: int) -> None:
    """nvdashboard's two GPU widgets: one websocket each; counts data messages (not the "connected" one)."""
    async def widget(name: str) -> None:
        url = f"ws://127.0.0.1:{server.port}{server.base_url}nvdashboard/{name}"
        conn = await websocket_connect(HTTPRequest(url, headers=server.auth))
        try:
            while (message := await conn.read_message()) is not None:
                if "status" not in json.loads(message):
                    received[index] += 1
        finally:
            conn.close()
    await asyncio.gather(*(widget(name) for name in NVDASHBOARD_WIDGETS))


async def culler_client(server: JupyterServer, period: float) -> None:
    """What gpuspawner's culler asks of a server every round: its monitor with 3 periods of history."""
    session = requests.Session()
    session.headers.update(server.auth)
    while True:
        r = await asyncio.to_thread(session.get, server.url + "api/gpus", params={"history": f"{3 * period:g}"},
                                    timeout=30)
        assert r.status_code == 200 and r.json()["history"], r.text[:300]
        await asyncio.sleep(period)


async def measure(server: JupyterServer, counts: Path, client: Client, clients: int, window: float,
                  culler_period: float | None = None) -> dict:
    received = [0] * clients
    tasks = [asyncio.create_task(client(server, received, i)) for i in range(clients)]
    if culler_period is not None:
        tasks.append(asyncio.create_task(culler_client(server, culler_period)))
    deadline = time.monotonic() + 60
    while received and min(received) == 0 and time.monotonic() < deadline:  # every client connected, got data
        failed = [t for t in tasks if t.done() and t.exception()]
        if failed:
            raise RuntimeError(f"a client failed: {failed[0].exception()!r}")
        await asyncio.sleep(0.2)
    if received and min(received) == 0:
        raise RuntimeError(f"{received.count(0)} of {clients} clients got no data within 60 s")
    await asyncio.sleep(1.0)
    calls0, cpu0 = fakenvml.read_counts(counts), cpu_seconds(server.proc.pid)
    t0, got0 = time.monotonic(), sum(received)
    await asyncio.sleep(window)
    calls1, cpu1 = fakenvml.read_counts(counts), cpu_seconds(server.proc.pid)
    t1, got1 = time.monotonic(), sum(received)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = t1 - t0
    by_function = {name: (n - calls0.get(name, 0)) / elapsed for name, n in calls1.items() if n > calls0.get(name, 0)}
    return {
        "clients": clients,
        "nvml_per_s": sum(by_function.values()),
        "by_function": by_function,
        "cpu_pct": 100 * (cpu1 - cpu0) / elapsed,
        "messages_per_s": (got1 - got0) / elapsed,
    }


def run_rows(name: str, server: JupyterServer, counts: Path, client: Client, window: float) -> list[dict]:
    print(f"{name}: server pid {server.proc.pid}, {window:.0f} s per row, load average {load_average()}")
    print(f"{'clients':>8} {'NVML calls/s':>13} {'server CPU %':>13} {'messages/s':>11}")
    rows = []
    for n in CLIENT_COUNTS:
        if n == 0:  # nobody watching: after a request (a page load) and idle_pause
            server.get("api/gpus")
            time.sleep(IDLE_PAUSE + 2)
        row = asyncio.run(measure(server, counts, client, n, window))
        rows.append(row)
        print(f"{row['clients']:>8} {row['nvml_per_s']:>13.1f} {row['cpu_pct']:>13.2f} {row['messages_per_s']:>11.1f}")
    one, hundred = rows[CLIENT_COUNTS.index(1)], rows[CLIENT_COUNTS.index(100)]
    calls = ", ".join(f"{f} {r:.1f}/s" for f, r in sorted(one["by_function"].items()))
    print(f"  NVML calls at 1 client: {calls}")
    ratio = hundred["nvml_per_s"] / one["nvml_per_s"] if one["nvml_per_s"] else float("nan")
    print(f"  NVML calls/s at 100 clients / at 1 client: {ratio:.2f}")
    return rows


def culler_row(server: JupyterServer, counts: Path, period: float) -> dict:
    """Nobody watching, the GPU culler reading the history every ``period`` s: over 3 periods."""
    time.sleep(IDLE_PAUSE + 2)
    row = asyncio.run(measure(server, counts, stream_client, 0, 3 * period, culler_period=period))
    calls = ", ".join(f"{f} {r:.2f}/s" for f, r in sorted(row["by_function"].items()))
    print(f"nobody watching, a GPU culler reading api/gpus?history={3 * period:g} every {period:g} s "
          f"(over {3 * period:g} s): {row['nvml_per_s']:.2f} NVML calls/s, server CPU {row['cpu_pct']:.2f}% ({calls})")
    return row


def snapshot_latency(server: JupyterServer, n: int = 300) -> tuple[float, float]:
    session = requests.Session()
    session.headers.update(server.auth)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        r = session.get(server.url + "api/gpus", timeout=30)
        times.append(time.perf_counter() - t)
        assert r.status_code == 200
    times.sort()
    return statistics.median(times) * 1000, times[int(0.99 * (n - 1))] * 1000


# -------------------------------------------------------------- nvdashboard --

def installed_nvdashboard(target: Path) -> metadata.Distribution | None:
    return next((d for d in metadata.distributions(path=[str(target)])
                 if canonicalize_name(d.metadata["Name"]) == NVDASHBOARD), None)


def install_nvdashboard(target: Path) -> str | None:
    """pip-install nvdashboard into ``target`` (no dependencies); None, or why it cannot be used here."""
    if installed_nvdashboard(target) is None:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), NVDASHBOARD]
        pip = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if pip.returncode != 0:
            last = (pip.stderr.strip().splitlines() or ["?"])[-1]
            return f"`pip install --no-deps --target {target} {NVDASHBOARD}` failed: {last}"
    dist = installed_nvdashboard(target)
    if dist is None:
        return f"pip installed no {NVDASHBOARD} distribution into {target}"
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue  # an extra (test) or another platform
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            return f"{NVDASHBOARD} {dist.version} requires {req}, which this environment lacks"
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            return (f"{NVDASHBOARD} {dist.version} requires {req}; this environment has {req.name} {have}, "
                    "and changing it would change what the tests run against")
    return None


def nvdashboard_server(workdir: Path, target: Path, env: dict[str, str]) -> JupyterServer:
    """A jupyter server with nvdashboard's extension and without the monitor (so its NVML calls are nvdashboard's)."""
    (workdir / "jupyter-config").mkdir(parents=True, exist_ok=True)
    (workdir / "jupyter-config" / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": {"gpuspawner.monitor": False, "jupyterlab_nvdashboard": True}}}))
    path = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH", "")) if p)
    return JupyterServer(workdir, {**env, "PYTHONPATH": path})


NVML_FAILURE = re.compile(r"Function Not Found|NVMLError")


def nvdashboard_problem(server: JupyterServer) -> str | None:
    """Why nvdashboard did not come up on the stand-in (from its status endpoint and the server log), or None."""
    log = server.log_path.read_text(errors="replace")
    lines = log.splitlines()
    if nvml := [x.strip() for x in lines if NVML_FAILURE.search(x)]:
        return f"its server log shows {nvml[0]!r}"
    if tracebacks := [i for i, x in enumerate(lines) if x.lstrip().startswith("Traceback")]:
        # a traceback ends at its first line less indented than its body: the exception
        end = next((x.strip() for x in lines[tracebacks[0] + 2:] if x.strip() and not x.startswith("  ")), "?")
        return f"its server log shows a traceback ending {end!r}"
    r = server.get("nvdashboard/accelerators/check")
    if r.status_code != 200:
        return f"GET nvdashboard/accelerators/check answered {r.status_code}: the extension did not load"
    if not r.json().get("ngpus"):
        return f"nvdashboard sees no GPU on the stand-in: {r.text}"
    if server.get("api/gpus").status_code != 404:
        return "the monitor is still enabled in nvdashboard's server; its NVML calls would be counted too"
    return None


def compare(monitor: list[dict], nvdashboard: list[dict]) -> None:
    print("side by side (ratio: monitor / nvdashboard; the goal is at most 1 at every count):")
    print(f"{'clients':>8} {'NVML/s monitor':>15} {'nvdashboard':>12} {'ratio':>7}"
          f" {'CPU % monitor':>14} {'nvdashboard':>12} {'ratio':>7}")
    met = True
    for m, d in zip(monitor, nvdashboard, strict=True):
        met = met and m["nvml_per_s"] <= d["nvml_per_s"]
        nvml = f"{m['nvml_per_s'] / d['nvml_per_s']:.2f}" if d["nvml_per_s"] else "-"  # 0 / 0: no ratio
        cpu = f"{m['cpu_pct'] / d['cpu_pct']:.2f}" if d["cpu_pct"] else "-"  # under one clock tick: no ratio
        print(f"{m['clients']:>8} {m['nvml_per_s']:>15.1f} {d['nvml_per_s']:>12.1f} {nvml:>7}"
              f" {m['cpu_pct']:>14.2f} {d['cpu_pct']:>12.2f} {cpu:>7}")
    one, hundred = CLIENT_COUNTS.index(1), CLIENT_COUNTS.index(100)
    per_client = (nvdashboard[hundred]["nvml_per_s"] - nvdashboard[one]["nvml_per_s"]) / 99
    print(f"nvdashboard NVML calls/s per added client: {per_client:.1f}")
    print(f"goal (monitor's NVML calls/s at most nvdashboard's at {', '.join(map(str, CLIENT_COUNTS))} clients): "
          f"{'met' if met else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=30.0,
                        help="seconds measured per client count (a multiple of GPUMonitor.detail_interval, 15 s, "
                             "so that each row holds as many complete readings as the pace gives)")
    parser.add_argument("--culler-period", type=float, default=60.0,
                        help="seconds between a GPU culler's reads in the last row (0: no such row)")
    parser.add_argument("--nvdashboard", nargs="?", const=str(ROOT / "build" / "nvdashboard"), default=None,
                        metavar="PATH",
                        help="also measure jupyterlab-nvdashboard, pip-installed (--no-deps --target) into PATH "
                             "(default build/nvdashboard) if it is not there yet")
    args = parser.parse_args()
    for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        os.environ.pop(key, None)
    print(f"load average at start: {load_average()} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="gpuspawner-bench-") as tmp:
        tmp = Path(tmp)
        libdir = fakenvml.build(ROOT / "build" / "fakenvml")
        config = tmp / "gpus.json"
        devices = [fakenvml.make_device(i, utilization_gpu=20 * i, memory_used=i * 2**30,
                                        processes=[{"pid": 100000 + i, "used_memory": 2**30}]) for i in range(4)]
        fakenvml.write_config(config, {"devices": devices})
        counts = tmp / "counts"
        server = JupyterServer(tmp / "server", fakenvml.env(libdir, config, counts), ["--GPUMonitor.interval=1"])
        with server:
            print("gpuspawner monitor: 4 simulated GPUs, default settings (a sample a second while watched); "
                  "each client one api/gpus/stream (one browser tab's status bar, its GPU panel closed)")
            monitor_rows = run_rows("gpuspawner monitor", server, counts, stream_client, args.window)
            p50, p99 = snapshot_latency(server)
            print(f"snapshot GET api/gpus latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms (300 sequential requests)")
            panel = asyncio.run(measure(server, counts, functools.partial(stream_client, view="panel"), 1,
                                        args.window))
            print(f"1 client with the GPU panel on screen (api/gpus/stream?view=panel: everything every sample): "
                  f"{panel['nvml_per_s']:.1f} NVML calls/s, server CPU {panel['cpu_pct']:.2f}%")
            if args.culler_period:
                culler_row(server, counts, args.culler_period)
        if args.nvdashboard is None:
            print(f"{NVDASHBOARD}: not measured (pass --nvdashboard [PATH])")
            return
        target = Path(args.nvdashboard).resolve()
        if why := install_nvdashboard(target):
            print(f"{NVDASHBOARD}: not measured: {why}")
            return
        version = installed_nvdashboard(target).version
        nvd_counts = tmp / "counts-nvdashboard"
        server = nvdashboard_server(tmp / "nvdashboard", target, fakenvml.env(libdir, config, nvd_counts))
        with server:
            if why := nvdashboard_problem(server):
                print(f"{NVDASHBOARD} {version}: not measured: {why}")
                return
            print(f"{NVDASHBOARD} {version} (from {target}): the same 4 GPUs; each client one websocket to "
                  f"each of {', '.join('nvdashboard/' + w for w in NVDASHBOARD_WIDGETS)} (1 message/s each)")
            startup = ", ".join(f"{f} {n}" for f, n in sorted(fakenvml.read_counts(nvd_counts).items()))
            print(f"  its NVML calls at start (import-time probes), none failing in its log: {startup}")
            nvd_rows = run_rows(f"{NVDASHBOARD} {version}", server, nvd_counts, nvdashboard_client, args.window)
            if why := nvdashboard_problem(server):
                print(f"{NVDASHBOARD}: errors during the measurement: {why}")
        compare(monitor_rows, nvd_rows)
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
