"""Slurm's own start estimate beside ours, on a real Slurm cluster: ``scripts/bench slurm_estimates``.

Starts the private one-node cluster (gpuspawner/backends/slurm/dev.py; ``--gpus`` A100s) and drives
it with the replay's synthetic day (:func:`gpuspawner.replay.trace.synthetic_trace`: the same
arrival and length generator, ``--load`` x the GPUs, ``--hours`` of it), compressed: one simulated
minute is one real second (``--scale`` 60). Each session becomes a batch job at its arrival that
``sleep``s its length and asks ``--gres=gpu:a100:N``; in the time-limit run every job has the
profile's time limit (``--limit-hours``: Slurm's backfill plan rests on it, and a job that
reaches it is ended), in the other none (partition MaxTime=INFINITE).

At every submission two estimates are recorded for the job:

- **Slurm's**: the first start time ``squeue --json`` gives the pending job (what ``squeue
  --start`` shows; the backfill pass sets it within a second of the submission); "now + 1 year"
  (Slurm's placeholder without time limits) is counted apart;
- **ours**: :func:`gpuspawner.estimate.estimate` on the same state, read from ``squeue`` the moment
  before: the running jobs (holders: since their start, latest end their start + time limit),
  the pending jobs ahead (in Slurm's order) and the free GPUs, with the usage history of other
  days of the same trace (seeds ``--seed`` + 1...: what the hub's usage table would hold).

When a job starts, both are compared with its real start. For the jobs that waited (started
more than ``--waited`` simulated minutes after submission) it prints, per run and per
estimator: median absolute error (simulated minutes), the share within one simulated minute,
the share within 25 % of the wait or 2 minutes (the replay's goal), the share of Slurm's at
"now + 1 year" and, for ours, the share inside the stated interval. Figures only; it asserts
nothing. Needs root, slurm-wlm and munge (scripts/setup installs them).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpuspawner.backends.slurm.dev import SlurmCluster, cannot_start
from gpuspawner.backends.slurm.queue import read_jobs
from gpuspawner.estimate import Ask, Estimate, History, Holder, estimate
from gpuspawner.replay.trace import Session, TraceParams, synthetic_trace

YEAR = 300 * 24 * 3600  # Slurm's placeholder is now + 1 year: anything this far is no estimate


@dataclass
class Row:
    session: Session
    length: float  # real seconds it holds its GPUs
    limit: float | None  # real seconds of its time limit
    submitted: float = 0.0
    job: str = ""
    slurm: float | None = None  # Slurm's first estimate (epoch)
    ours: Estimate | None = None
    started: float | None = None


def history(params: TraceParams, gpus: int, days: int, scale: float, limit: float | None) -> History:
    """Session lengths (real seconds) of ``days`` other days of the same trace, as a hub records them."""
    rows = []
    for day in range(1, days + 1):
        for s in synthetic_trace(TraceParams(**{**params.__dict__, "seed": params.seed + day}), gpus):
            length = s.planned / scale
            rows.append(("gpu", s.user, length if limit is None else min(length, limit)))
    return History(rows)


def our_estimate(row: Row, squeue: dict, now: float, gpus: int, past: History) -> Estimate:
    """Ours, from Slurm's state: running jobs hold, pending jobs (Slurm's order) are ahead."""
    holders, ahead, used = [], [], 0
    jobs = read_jobs(squeue)
    for job in jobs:
        count = _count(job.gpus)
        if job.state in ("RUNNING", "COMPLETING", "CONFIGURING"):
            used += count
            limit = _limit(squeue, job.id)
            holders.append(Holder(job.id, count, float(job.start_time or now), "node/a100", job.name, "gpu",
                                  None if limit is None else job.start_time + limit, "job" if limit else ""))
    for job in sorted((j for j in jobs if j.pending), key=lambda j: (-j.priority, j.submit_time, int(j.id))):
        ahead.append(Ask(job.id, _count(job.gpus), job.name, "gpu"))
    ask = Ask(f"new-{row.session.id}", row.session.count, row.session.user, "gpu")
    return estimate(ask, now, {"node/a100": max(0, gpus - used)}, holders, ahead, past)


def _count(gres: str) -> int:
    digits = gres.rsplit(":", 1)[-1]
    return int(digits) if digits.isdigit() else 1


def _limit(squeue: dict, job_id: str) -> float | None:
    for raw in squeue["jobs"]:
        if str(raw.get("job_id")) == job_id:
            value = raw.get("time_limit")
            if isinstance(value, dict):
                value = value.get("number") if value.get("set", True) and not value.get("infinite") else None
            return None if value in (None, 0, 4294967295) else float(value) * 60
    return None


def drive(cluster: SlurmCluster, rows: list[Row], gpus: int, past: History, scale: float, poll: float) -> None:
    """Submit each row at its (compressed) arrival; poll squeue for Slurm's estimates and real starts."""
    t0 = time.time() + 2
    queue = sorted(rows, key=lambda r: r.session.arrive)
    by_job: dict[str, Row] = {}
    while queue or any(r.started is None for r in by_job.values()):
        now = time.time()
        squeue = json.loads(cluster.run("squeue", "--json").stdout)
        while queue and t0 + queue[0].session.arrive / scale <= now:
            row = queue.pop(0)
            row.ours = our_estimate(row, squeue, now, gpus, past)
            args = ["sbatch", "--parsable", f"--job-name={row.session.user}", f"--gres=gpu:a100:{row.session.count}",
                    "--output=/dev/null", f"--wrap=sleep {row.length:.1f}"]
            if row.limit is not None:
                args.insert(1, f"--time={max(1, math.ceil(row.limit / 60))}")
            row.submitted = time.time()
            row.job = cluster.run(*args).stdout.strip().split(";")[0]
            by_job[row.job] = row
        for job in read_jobs(squeue):
            row = by_job.get(job.id)
            if row is None:
                continue
            if job.pending and row.slurm is None and job.start_time:
                row.slurm = float(job.start_time)
            elif not job.pending and row.started is None and job.start_time:
                row.started = float(job.start_time)
        time.sleep(poll)


def figures(rows: list[Row], scale: float, waited: float) -> dict:
    done = [r for r in rows if r.started is not None and (r.started - r.submitted) * scale > waited * 60]
    out = {"waited": len(done)}
    if not done:
        return out
    minute = 60 / scale

    def summary(errors: list[float], waits: list[float]) -> dict:
        median = statistics.median(errors)  # inf: most had no estimate
        return {"median_error_min": round(median * scale / 60, 1) if median < math.inf else None,
                "within_1min_pct": round(100 * sum(e <= minute for e in errors) / len(errors), 1),
                "within_goal_pct": round(100 * sum(e <= max(0.25 * w, 2 * minute)
                                                   for e, w in zip(errors, waits, strict=True)) / len(errors), 1)}

    waits = [r.started - r.submitted for r in done]
    year = [r for r in done if r.slurm is not None and r.slurm - r.submitted > YEAR]
    slurm_errors = [abs((r.slurm if r.slurm is not None and r not in year else math.inf) - r.started) for r in done]
    out["median_wait_min"] = round(statistics.median(waits) * scale / 60, 1)
    out["slurm"] = {**summary(slurm_errors, waits), "now_plus_year_pct": round(100 * len(year) / len(done), 1),
                    "none_pct": round(100 * sum(r.slurm is None for r in done) / len(done), 1)}
    ours = [abs((r.ours.likely if r.ours.likely is not None else math.inf) - r.started) for r in done]
    inside = [r.ours.low is not None and r.ours.high is not None and r.ours.low - 1 <= r.started <= r.ours.high + 1
              for r in done]
    out["ours"] = {**summary(ours, waits), "in_interval_pct": round(100 * sum(inside) / len(done), 1)}
    return out


def run(args: argparse.Namespace, limit_hours: float | None) -> dict:
    params = TraceParams(load=args.load, hours=args.hours, seed=args.seed)
    scale = args.scale
    limit = None if limit_hours is None else limit_hours * 3600 / scale
    rows = [Row(s, s.planned / scale if limit is None else min(s.planned / scale, limit), limit)
            for s in synthetic_trace(params, args.gpus)]
    past = history(params, args.gpus, args.history_days, scale, limit)
    with tempfile.TemporaryDirectory(prefix="slurm-estimates-") as tmp:
        cluster = SlurmCluster(Path(tmp), {"a100": args.gpus}, cpus=max(8, args.gpus * 2))
        try:
            cluster.start()
            drive(cluster, rows, args.gpus, past, scale, args.poll)
        finally:
            cluster.stop()
    return {"time_limit_h": limit_hours, "jobs": len(rows), **figures(rows, scale, args.waited)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--hours", type=float, default=3.0, help="simulated hours of arrivals")
    parser.add_argument("--scale", type=float, default=60.0, help="simulated seconds per real second")
    parser.add_argument("--limit-hours", type=float, default=4.0, help="the jobs' time limit (simulated)")
    parser.add_argument("--history-days", type=int, default=5)
    parser.add_argument("--waited", type=float, default=2.0, help="simulated minutes that count as a wait")
    parser.add_argument("--poll", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=("limit", "none"), help="one run only")
    args = parser.parse_args(argv)
    why = cannot_start()
    if why:
        print(f"slurm_estimates: {why}", file=sys.stderr)
        return 1
    print(f"# {platform.node()}: {args.gpus} x a100 on one Slurm node, load {args.load:.0%}, {args.hours} h "
          f"simulated at {args.scale:g}x")
    limits = {"limit": [args.limit_hours], "none": [None]}.get(args.only, [args.limit_hours, None])
    for limit_hours in limits:
        print(json.dumps(run(args, limit_hours)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
