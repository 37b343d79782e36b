"""GPU health watch cost: NVML calls per second the hub's watcher makes, and how soon it sees an XID.

Runs :class:`gpuspawner.health_nvml.NVMLHealthWatcher` (events plus a check every
``--interval`` seconds) in a child process on the stand-in NVML with N simulated
A100s, counts its NVML calls with FAKENVML_COUNTS over ``--window`` seconds, then
appends XID 79 to one GPU's device file and prints how long until the tracker
has it out of service. Figures only; the tests assert behaviour.

    scripts/bench health [--gpus 4 8] [--interval 5] [--window 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import fakenvml
from gpuspawner.simulation import simulated_config

CHILD = r'''
import json, logging, sys, time
logging.disable(logging.ERROR)  # the tracker's "out of service" line
from gpuspawner.health import HealthTracker
from gpuspawner.health_nvml import NVMLHealthWatcher
import fakenvml
interval, window, config = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
tracker = HealthTracker()
watcher = NVMLHealthWatcher(tracker, interval)
watcher.start()
while watcher.checks == 0:
    time.sleep(0.01)
start = time.monotonic()
time.sleep(window)
print(json.dumps({"window": time.monotonic() - start}), flush=True)
sys.stdin.readline()  # the parent read the counts; now the XID
devices = json.load(open(config))
devices["devices"][0]["xid_events"] = [79]
t0 = time.monotonic()
fakenvml.write_config(config, devices)
while not tracker.outages():
    time.sleep(0.001)
print(json.dumps({"xid_seen_s": time.monotonic() - t0}), flush=True)
watcher.stop()
'''


def measure(libdir: Path, folder: Path, gpus: int, interval: float, window: float) -> dict:
    config, counts = folder / f"gpus{gpus}.json", folder / f"counts{gpus}"
    fakenvml.write_config(config, simulated_config(a100=gpus, t4=0))
    env = {**os.environ, **fakenvml.env(libdir, config, counts)}
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), str(interval), str(window), str(config)],
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    before = fakenvml.read_counts(counts)
    seconds = json.loads(child.stdout.readline())["window"]
    after = fakenvml.read_counts(counts)
    child.stdin.write("\n")
    child.stdin.flush()
    seen = json.loads(child.stdout.readline())["xid_seen_s"]
    child.wait(timeout=30)
    per_fn = {fn: after.get(fn, 0) - before.get(fn, 0) for fn in after}
    waits = per_fn.get("nvmlEventSetWait_v2", 0)
    total = sum(per_fn.values())
    return {"gpus": gpus, "calls_per_s": total / seconds, "waits_per_s": waits / seconds,
            "checks_calls_per_s": (total - waits) / seconds, "xid_seen_ms": seen * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        libdir = fakenvml.build(Path(tmp) / "lib")
        print(f"GPU health watcher, a check every {args.interval:g} s, events between ({args.window:g} s windows)")
        print(f"{'GPUs':>5} {'NVML calls/s':>13} {'of them waits':>14} {'checks':>7} {'XID seen after':>15}")
        for n in args.gpus:
            r = measure(libdir, Path(tmp), n, args.interval, args.window)
            print(f"{r['gpus']:>5} {r['calls_per_s']:>13.2f} {r['waits_per_s']:>14.2f} {r['checks_calls_per_s']:>7.2f}"
                  f" {r['xid_seen_ms']:>12.0f} ms")


if __name__ == "__main__":
    main()
