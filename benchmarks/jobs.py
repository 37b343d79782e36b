"""Notebook GPU job latency: ``scripts/bench jobs [--backend local|docker] [--runs N]``.

Starts the runnable default (``jupyterhub_config.py``, through ``benchmarks/storm.py``'s
``StormHub``: free loopback ports, private state, 2 x A100 + 2 x T4 simulated through
the stand-in NVML; ``--backend docker`` adds a private dockerd and the single-user
image). It writes a notebook into a user's files whose first cell prints
``time.time()`` and whose last cell prints it again, submits it ``--runs`` times,
one after the other, as a 1 x T4 job (``POST /hub/api/users/NAME/gpu-jobs``), and
prints, per run and as p50/max:

- submit -> first cell: from sending the POST to the notebook's first cell running
  (the job's process or container, its kernel, then the cell);
- end -> GPUs free: from the notebook's last cell to the hub having given the GPU
  back (the job's ``ended`` time, which the hub records after releasing its GPUs):
  the executor writing the output notebook, the kernel shutting down, the hub seeing
  the end; the goal is under 2 s;
- the POST's own answer time.

Both clocks are this machine's (the job's container shares the kernel's clock).
Figures only; nothing is asserted. Everything started is stopped by pid.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from storm import StormHub, percentile, start_engine

from gpuspawner.accounts import ensure_account
from jobnotebooks import outputs_text, write

ROOT = Path(__file__).resolve().parent.parent
FIRST = "import time\nprint('START=%.6f' % time.time())"
LAST = "import time\nprint('END=%.6f' % time.time())"
USER = "bench"
ROLE_SCOPES = """
c.JupyterHub.load_roles[-1]["scopes"] += ["custom:gpus:read"]
"""


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def user_files(hub: StormHub, engine) -> Path:
    """Where the user's files are on this machine: their folder, or their Docker volume's data."""
    if engine is None:  # the system account the hub runs the user's servers and jobs as, made now as the hub would
        account = ensure_account(USER, hub.settings["account_prefix"], hub.dir / "state" / "users")
        return Path(account.pw_dir)
    volume = engine.client.volumes.create(f"gpuspawner-user-{USER}")
    path = Path(volume.attrs["Mountpoint"])
    os.chown(path, 1000, 1000)  # the image's user (jovyan)
    return path


def run_once(hub: StormHub, files: Path, n: int) -> dict:
    name = f"run{n}.ipynb"
    write(files / name, FIRST, "x = sum(range(10**6))", LAST)
    if (files / name).stat().st_uid == 0 and files.stat().st_uid != 0:
        os.chown(files / name, files.stat().st_uid, files.stat().st_gid)
    sent = time.time()
    r = hub.api("POST", f"/users/{USER}/gpu-jobs",
                json={"profile": "gpu", "gpus": 1, "gpu_model": "t4", "notebook": name})
    answered = time.time()
    if r.status_code != 201:
        raise SystemExit(f"job refused: {r.status_code} {r.text}")
    job_id = r.json()["id"]
    while True:
        job = hub.api("GET", f"/users/{USER}/gpu-jobs/{job_id}").json()
        if job["state"] not in ("queued", "starting", "running"):
            break
        time.sleep(0.1)
    if job["state"] != "completed":
        raise SystemExit(f"job {job_id} {job['state']}: {job['reason']}")
    text = outputs_text(files / job["outputs"]["ipynb"])
    start = float(text.split("START=", 1)[1].split()[0])
    end = float(text.split("END=", 1)[1].split()[0])
    return {"answer": answered - sent, "first_cell": start - sent, "end_to_free": epoch(job["ended"]) - end}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "docker"], default="local")
    parser.add_argument("--runs", type=int, default=5, help="jobs, one after the other (default 5)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (hub log) and print its path")
    args = parser.parse_args()
    print(f"# {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {Path('/proc/loadavg').read_text().split()[0]}")
    work = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    engine = hub = None
    try:
        image = ""
        if args.backend == "docker":
            engine, image = start_engine(args)
        hub = StormHub(work / "hub", args.backend, 2, 2, engine, image, ROLE_SCOPES)
        hub.start(timeout=120)
        hub.api("POST", "/users", json={"usernames": [USER]}).raise_for_status()
        files = user_files(hub, engine)
        runs = [run_once(hub, files, n) for n in range(args.runs)]
        print(f"gpu-{args.backend}, {args.runs} jobs of 1 x Tesla T4, one after the other")
        for n, run in enumerate(runs):
            print(f"  run {n}: answer {run['answer']:.3f} s, submit -> first cell {run['first_cell']:.3f} s, "
                  f"end -> GPUs free {run['end_to_free']:.3f} s")
        for key, label in (("answer", "POST answer"), ("first_cell", "submit -> first cell"),
                           ("end_to_free", "end -> GPUs free")):
            values = [r[key] for r in runs]
            print(f"  {label}: p50 {percentile(values, 50):.3f} s, max {max(values):.3f} s")
    finally:
        if hub is not None:
            hub.close()
        if engine is not None:
            engine.stop()
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
