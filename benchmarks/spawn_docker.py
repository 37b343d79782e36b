"""What gpu-docker costs on a real Docker engine: ``scripts/bench spawn_docker``.

Starts a private dockerd with the stand-in NVIDIA hook (tests/docker/engine.py),
builds or loads the single-user image, and prints figures only (asserts
nothing about timing):

1. spawn-to-ready, median over ``--rounds`` spawns each, of plain DockerSpawner
   (without GPU, and with the usual count=1 GPU request, which runs the same
   NVIDIA hook) and of gpu-docker (1 GPU) on the same engine and image,
   interleaved, and the ratios of gpu-docker to both (goal: 1.03 or less). A spawn is timed from
   the REST POST until the Jupyter server in the container answers (polled every
   20 ms at the container's address), and until the hub marks it ready (the
   hub's own check backs off with random jitter, so that figure is coarser).
2. a storm: ``--storm`` concurrent 1-GPU spawns on 16 stand-in GPUs; double
   allocations (GPUs in two running containers, read from the engine's
   DeviceRequests and each container's NVIDIA_VISIBLE_DEVICES: must be 0),
   started/refused counts, and the hub API's latency (GET /hub/api/users/NAME)
   p50/p99 sampled while the storm runs.

Needs root (dockerd), docker.io and mmdebstrap (scripts/setup installs them).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

# the test helpers by their plain names, as under pytest (scripts/bench puts pytest's pythonpath on this process's path)
from spawn_timing import interleaved, no_engine_here, print_medians, timed_spawn

import fakenvml
from dockerhub import DockerHub
from engine import Engine, gpu_config, visible_devices

ROOT = Path(__file__).resolve().parent.parent

GPU_PROFILE = [{"slug": "gpu", "display_name": "GPU", "gpu_models": ["any"], "gpu_counts": [1],
                "default_gpus": 1, "default": True}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def container_url(hub: DockerHub, name: str) -> str | None:
    try:
        c = hub.container(name)
        ip = c.attrs["NetworkSettings"]["Networks"][hub.engine.network]["IPAddress"]
    except Exception:
        return None
    return f"http://{ip}:8888/user/{name}/api" if ip else None


def spawn_to_ready(hubs: dict[str, DockerHub], rounds: int) -> dict[str, list[float]]:
    def spawn(key: str, hub: DockerHub, name: str, round_: int) -> tuple[float, float]:
        body = {"profile": "gpu", "gpus": 1} if key == "gpu" else ""
        timed = timed_spawn(hub, name, body, lambda: container_url(hub, name))
        hub.stop_server(name, timeout=120)
        return timed

    return interleaved(hubs, rounds, spawn)


def storm(hub: DockerHub, count: int) -> dict:
    users = [f"s{n:02d}" for n in range(count)]
    hub.add_users(*users, "watcher")
    statuses: Counter = Counter()
    latencies: list[float] = []
    done = threading.Event()

    def spawn(name):
        r = hub.spawn(name, {"profile": "gpu", "gpus": 1})
        statuses[r.status_code] += 1

    def watch():
        while not done.is_set():
            t0 = time.perf_counter()
            hub.api("GET", "/users/watcher")
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=spawn, args=(u,)) for u in users]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for u in users:  # 202 replies: wait until each server is ready or gone
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            server = hub.user(u)["servers"].get("")
            if not server or server.get("ready"):
                break
            time.sleep(0.5)
    wall = time.perf_counter() - t0
    done.set()
    watcher.join()

    owners: Counter = Counter()
    running = 0
    for c in hub.containers():
        c.reload()
        if c.status != "running":
            continue
        running += 1
        requested = [u for r in c.attrs["HostConfig"].get("DeviceRequests") or [] for u in r["DeviceIDs"]]
        seen = set(requested) | set(visible_devices(c).split(","))
        for uuid in seen:
            owners[uuid] += 1
    return {
        "wall": wall, "statuses": dict(statuses), "running": running,
        "double": sum(1 for n in owners.values() if n > 1), "gpus_in_use": len(owners),
        "latencies": latencies,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="timed spawns per spawner (default 15)")
    parser.add_argument("--storm", type=int, default=40, help="concurrent spawns in the storm (default 40)")
    args = parser.parse_args()
    if no_engine_here():
        return 1
    print(f"# {platform.node()}, {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    work = Path(tempfile.mkdtemp(prefix="bench-docker-"))
    engine = Engine()
    hubs = []
    try:
        engine.start()
        engine.build_image()
        libdir = fakenvml.build(ROOT / "build" / "fakenvml")
        fakenvml.write_config(engine.gpus_path, gpu_config(16))
        env = fakenvml.env(libdir, engine.gpus_path)

        def hub(name, **kw):
            kw.setdefault("slow_spawn_timeout", 300)
            h = DockerHub(work / name, engine, env, libdir, GPU_PROFILE, **kw)
            hubs.append(h)
            h.start(timeout=120)
            return h

        # the usual GPU DockerSpawner config: a count-based request (always GPU 0), same runtime hook
        count_request = {
            "device_requests": [{"driver": "nvidia", "count": 1, "capabilities": [["compute", "utility"]]}],
        }
        spawners = {
            "plain": hub("plain", spawner_class="docker", slow_spawn_timeout=0),
            "plain+gpu": hub("plaingpu", spawner_class="docker", slow_spawn_timeout=0, extra_host_config=count_request),
            "gpu": hub("gpu", slow_spawn_timeout=0),
        }
        t = spawn_to_ready(spawners, args.rounds)
        labels = {"plain": "DockerSpawner, no GPU", "plain+gpu": "DockerSpawner, count=1 GPU request",
                  "gpu": "gpu-docker, 1 GPU by UUID"}
        print(f"spawn-to-ready, median of {args.rounds} each (same engine and image, interleaved):")
        for title, suffix in (("until the server in the container answers", ""),
                              ("until the hub says ready (its check backs off with jitter)", "_hub")):
            print(f"  {title}:")
            print_medians(t, labels, suffix)
            g = statistics.median(t["gpu" + suffix])
            print(f"    ratio gpu-docker / DockerSpawner with the same GPU request: "
                  f"{g / statistics.median(t['plain+gpu' + suffix]):.3f} (goal <= 1.03); "
                  f"/ DockerSpawner without GPU: {g / statistics.median(t['plain' + suffix]):.3f}")
        for h in spawners.values():
            h.close()

        stormy = hub("storm", spawner_class="gpu-docker")
        s = storm(stormy, args.storm)
        lat = [x * 1000 for x in s["latencies"]]
        print(f"storm: {args.storm} concurrent 1-GPU spawns on 16 GPUs, {s['wall']:.1f} s until all settled")
        print(f"  replies: {dict(sorted(s['statuses'].items()))}; running containers: {s['running']}; "
              f"GPUs in use: {s['gpus_in_use']}")
        print(f"  double allocations: {s['double']}")
        print(f"  hub API GET /hub/api/users/NAME during the storm: p50 {percentile(lat, 50):.1f} ms, "
              f"p99 {percentile(lat, 99):.1f} ms, max {max(lat):.1f} ms ({len(lat)} requests)")
    finally:
        for h in hubs:
            h.close()
        engine.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
