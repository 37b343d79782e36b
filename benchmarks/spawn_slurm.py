"""What gpu-slurm costs on a real Slurm cluster: ``scripts/bench spawn_slurm``.

Starts the private one-node cluster (gpuspawner/backends/slurm/dev.py: slurmctld, slurmd
and munged under a temporary directory, ``gpu:a100:2,gpu:t4:2``) and prints figures only
(asserts nothing about timing):

1. submit-to-ready, median over ``--rounds`` spawns each, of batchspawner's plain
   ``SlurmSpawner`` with ``req_gres = "gpu:a100:1"`` and of gpu-slurm asked for 1 x A100
   (``--gres=gpu:a100:1``), each on its own real JupyterHub, the same cluster, command and
   poll interval, interleaved (who goes first rotates), and their ratio (goal: 1.05 or less).
   Slurm starts jobs at its scheduler's passes (``sched_interval=1``, backfill every second), so
   single spawns vary by about a second; every spawn's figure is printed too.
   A spawn is timed from the REST POST until the hub says the server is ready (polled every
   20 ms); the server is stopped and its job gone from ``squeue`` before the next spawn.
2. the spawn form's availability read for ``--nodes`` nodes (default 1,000) of recorded
   ``sinfo --json`` output (tests/slurm/fixtures/sinfo-mixed.json, its node copied with
   other names, GPU types, partitions and use): parsing the text and counting free/total per
   GPU type, median and p99 over ``--reads`` reads (goal: under 50 ms).

Needs root, slurm-wlm and munge (scripts/setup installs them) for part 1; part 2 runs anywhere
(``--form-only``).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# the test helpers by their plain names, as under pytest (scripts/bench puts pytest's pythonpath on this process's path)
from gpuspawner.backends.slurm.capacity import GresTypes, gpu_availability, read_nodes

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "slurm" / "fixtures" / "sinfo-mixed.json"
NVML_NAMES = {"a100": "NVIDIA A100-SXM4-80GB", "t4": "Tesla T4"}  # the stand-in NVML's name of each type
GPU_PROFILE = [{"slug": "gpu", "display_name": "GPU", "gpu_models": ["any"], "gpu_counts": [1],
                "default_gpus": 1, "default": True}]

# batchspawner's SlurmSpawner as a site configures it for one A100; only the home directory does not
# come from the system's user database (the hub's users are not system users here), as gpu-slurm's
# home_dir_template does (batchspawner's req_homedir is not configurable)
PLAIN_CONFIG = """
from batchspawner import SlurmSpawner
from traitlets import default

class PlainSlurmSpawner(SlurmSpawner):
    @default("req_homedir")
    def _home(self):
        return settings["dir"] + "/users/" + self.user.name

    def user_env(self, env):
        env["USER"] = self.user.name
        env["HOME"] = self.req_homedir
        return env

c.JupyterHub.spawner_class = PlainSlurmSpawner
c.SlurmSpawner.exec_prefix = ""
c.SlurmSpawner.req_gres = "gpu:a100:1"
c.SlurmSpawner.startup_poll_interval = 0.5
c.Spawner.cmd = ["jupyterhub-singleuser"]
c.Spawner.args = ["--allow-root"]
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 60
c.Spawner.env_keep = ["PATH", "PYTHONPATH", "LANG", "SLURM_CONF", "LD_LIBRARY_PATH", "FAKENVML_CONFIG"]
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# ------------------------------------------------------------------ 1. submit-to-ready


def timed_spawn(hub, body) -> float:
    """Seconds from the POST until the hub says the server of user ``bench`` is ready."""
    t0 = time.perf_counter()
    r = hub.spawn("bench", body)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"{r.status_code} {r.text}\n{hub.log()}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        server = hub.user("bench")["servers"].get("")
        if server and server.get("ready"):
            return time.perf_counter() - t0
        time.sleep(0.02)
    raise RuntimeError(f"not ready after 300 s:\n{hub.log()}")


def stop(hub, cluster) -> None:
    hub.stop_server("bench", timeout=120)
    deadline = time.monotonic() + 60
    while cluster.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)


def submit_to_ready(hubs: dict, cluster, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    bodies = {"plain": "", "gpu": {"profile": "gpu", "gpus": 1, "gpu_model": "a100"}}
    for n in range(rounds + 1):  # round 0 warms both up and is not counted
        order = list(hubs.items())
        order = order[n % len(order):] + order[:n % len(order)]
        for key, hub in order:
            seconds = timed_spawn(hub, bodies[key])
            if n:
                times.setdefault(key, []).append(seconds)
            stop(hub, cluster)
    return times


def spawn_benchmark(rounds: int) -> None:
    import fakenvml
    from gpuspawner.backends.slurm.dev import SlurmCluster, absent_programs
    from hub import BASE_HUB_CONFIG, Hub
    from slurmhub import SLURM_HUB_CONFIG

    absent = absent_programs()
    if absent:
        print(f"submit-to-ready: cannot run: {', '.join(absent)} absent (scripts/setup installs slurm-wlm and munge)")
        return
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    cluster = SlurmCluster(work / "cluster", {"a100": 2, "t4": 2})
    hubs = {}
    try:
        cluster.start()
        libdir = fakenvml.build(ROOT / "build" / "fakenvml")
        devices = [fakenvml.make_device(i, NVML_NAMES[m], minor_number=i, device_node=str(node))
                   for i, (m, node) in enumerate(zip(cluster.models(), cluster.device_nodes(), strict=True))]
        fakenvml.write_config(work / "gpus.json", {"devices": devices})
        env = {**fakenvml.env(libdir, work / "gpus.json"), "SLURM_CONF": str(cluster.conf)}
        for key, config in (("plain", BASE_HUB_CONFIG + PLAIN_CONFIG), ("gpu", SLURM_HUB_CONFIG)):
            (work / key).mkdir()
            (work / key / "jupyterhub_config.py").write_text(config)
            hub = Hub(work / key, env, GPU_PROFILE, config_file=work / key / "jupyterhub_config.py")
            hubs[key] = hub
            hub.start(timeout=120)
            hub.add_users("bench")
            (hub.dir / "users" / "bench").mkdir(parents=True, exist_ok=True)
        t = submit_to_ready(hubs, cluster, rounds)
        print(f"submit-to-ready, median of {rounds} each (same cluster, --gres=gpu:a100:1, interleaved):")
        labels = {"plain": "batchspawner SlurmSpawner", "gpu": "gpu-slurm, 1 x A100"}
        for key, label in labels.items():
            v = t[key]
            print(f"  {label:28s} {statistics.median(v):6.3f} s (min {min(v):.3f}, max {max(v):.3f}); "
                  f"all: {' '.join(f'{x:.2f}' for x in v)}")
        ratio = statistics.median(t["gpu"]) / statistics.median(t["plain"])
        print(f"  ratio gpu-slurm / SlurmSpawner: {ratio:.3f} (goal <= 1.05)")
    finally:
        for hub in hubs.values():
            hub.close()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ 2. the form's availability read


def synthetic_sinfo(count: int) -> str:
    """``sinfo --json`` output with ``count`` nodes: the recorded node, renamed, with varied GPUs and use."""
    data = json.loads(FIXTURE.read_text())
    template = data["nodes"][0]
    kinds = [("a100", 8), ("h100", 8), ("t4", 4), ("l40s", 4)]
    nodes = []
    for n in range(count):
        kind, total = kinds[n % len(kinds)]
        used = n % (total + 1)
        node = dict(template)
        node.update({
            "name": f"gpu{n:04d}", "hostname": f"gpu{n:04d}", "address": f"gpu{n:04d}",
            "partitions": ["gpu", "long"] if n % 3 else ["gpu"],
            "gres": f"gpu:{kind}:{total}(S:0-1)",
            "gres_used": f"gpu:{kind}:{used}(IDX:{'0-' + str(used - 1) if used else 'N/A'})",
            "state": "mixed" if used else "idle",
            "state_flags": ["DRAIN"] if n % 97 == 0 else [],
        })
        nodes.append(node)
    data["nodes"] = nodes
    return json.dumps(data)


def form_benchmark(count: int, reads: int) -> None:
    text = synthetic_sinfo(count)
    types = GresTypes()
    times = []
    shown = []
    for _ in range(reads):
        t0 = time.perf_counter()
        shown = gpu_availability(read_nodes(text), types, ("gpu",))
        times.append((time.perf_counter() - t0) * 1000)
    print(f"the form's availability read, {count} nodes of sinfo --json ({len(text) / 1e6:.1f} MB), {reads} reads:")
    print(f"  parse + free/total per GPU type: median {statistics.median(times):.1f} ms, "
          f"p99 {percentile(times, 99):.1f} ms, max {max(times):.1f} ms (goal < 50 ms)")
    print("  shown: " + "; ".join(a.label for a in shown))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed spawns per spawner (default 9)")
    parser.add_argument("--nodes", type=int, default=1000, help="nodes in the sinfo --json output (default 1000)")
    parser.add_argument("--reads", type=int, default=200, help="timed availability reads (default 200)")
    parser.add_argument("--form-only", action="store_true", help="only the availability read (no cluster)")
    args = parser.parse_args()
    print(f"# {platform.node()}, {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    form_benchmark(args.nodes, args.reads)
    if not args.form_only:
        spawn_benchmark(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
