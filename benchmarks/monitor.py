"""GPU monitor cost: NVML calls and server CPU with 1, 10 and 100 stream clients; snapshot latency.

Starts a real ``jupyter server`` with the monitor on the stand-in NVML (4
simulated GPUs, 1 sample per second) and counts NVML calls with
FAKENVML_COUNTS. Server CPU comes from /proc/PID/stat of the server process.
Goal: NVML calls per second do not grow with clients; under 3% of one core at
100 clients.

    .venv/bin/python benchmarks/monitor.py [--window 20]

jupyterlab-nvdashboard, if importable in a ``--nvdashboard PATH`` directory
(``pip install --target PATH jupyterlab-nvdashboard``), is tried on the same
stand-in; the script says why when it cannot be measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

import requests  # noqa: E402

import fakenvml  # noqa: E402
from jupyter_server_proc import JupyterServer  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


async def stream_client(port: int, path: str, token: str, received: list[int], index: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: token {token}\r\n"
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


async def measure(server: JupyterServer, counts: Path, clients: int, window: float) -> dict:
    received = [0] * clients
    path = server.base_url + "api/gpus/stream"
    tasks = [asyncio.create_task(stream_client(server.port, path, server.token, received, i)) for i in range(clients)]
    deadline = time.monotonic() + 60
    while min(received) == 0 and time.monotonic() < deadline:  # every client connected and got a sample
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    calls0, cpu0 = sum(fakenvml.read_counts(counts).values()), cpu_seconds(server.proc.pid)
    t0, got0 = time.monotonic(), sum(received)
    await asyncio.sleep(window)
    calls1, cpu1 = sum(fakenvml.read_counts(counts).values()), cpu_seconds(server.proc.pid)
    t1, got1 = time.monotonic(), sum(received)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = t1 - t0
    return {
        "clients": clients,
        "nvml_per_s": (calls1 - calls0) / elapsed,
        "cpu_pct": 100 * (cpu1 - cpu0) / elapsed,
        "events_per_s": (got1 - got0) / elapsed,
    }


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


def nvdashboard_note(libdir: Path, config: Path, target: str | None) -> str:
    if not target:
        return ("jupyterlab-nvdashboard: not measured "
                "(pass --nvdashboard PATH of `pip install --target PATH jupyterlab-nvdashboard`)")
    env = {**os.environ, **fakenvml.env(libdir, config), "PYTHONPATH": target}
    probe = subprocess.run([sys.executable, "-c", "import jupyterlab_nvdashboard.apps.gpu as g; print(g.ngpus)"],
                           env=env, capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return (f"jupyterlab-nvdashboard: not measured: its module fails to import on the stand-in NVML ({last}); "
                "it calls NVLink/PCIe functions at import time that the stand-in does not export")
    return f"jupyterlab-nvdashboard: imports ({probe.stdout.strip()} GPUs); websocket measurement not implemented"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per client count")
    parser.add_argument("--nvdashboard", default=None,
                        help="directory where jupyterlab-nvdashboard is pip-installed (--target)")
    args = parser.parse_args()
    for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        os.environ.pop(key, None)
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
            print(f"gpuspawner monitor: 4 simulated GPUs, 1 sample/s, {args.window:.0f} s per row, "
                  f"server pid {server.proc.pid}")
            print(f"{'clients':>8} {'NVML calls/s':>13} {'server CPU %':>13} {'events/s':>9}")
            rows = []
            for n in (1, 10, 100):
                row = asyncio.run(measure(server, counts, n, args.window))
                rows.append(row)
                print(f"{row['clients']:>8} {row['nvml_per_s']:>13.1f} {row['cpu_pct']:>13.2f} "
                      f"{row['events_per_s']:>9.1f}")
            ratio = rows[-1]["nvml_per_s"] / rows[0]["nvml_per_s"] if rows[0]["nvml_per_s"] else float("nan")
            print(f"NVML calls/s at 100 clients / at 1 client: {ratio:.2f}")
            p50, p99 = snapshot_latency(server)
            print(f"snapshot GET api/gpus latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms (300 sequential requests)")
        print(nvdashboard_note(libdir, config, args.nvdashboard))


if __name__ == "__main__":
    main()
