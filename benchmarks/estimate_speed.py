"""The wait estimator's own speed: ``python benchmarks/estimate_speed.py``.

Times :func:`gpuspawner.estimate.for_gpus` as the hub's queue calls it, on a simulated inventory
(8 GPUs per host, A100s and H100s) where every GPU is held (``--per`` GPUs per server, default 1: 10,000
holders at 10,000 GPUs) by servers of 1,000 users
(each with a start in the last 8 hours and a history of 2,000 ended sessions), for a request of
any model and one of a named model, each behind ``--ahead`` requests. Figures only: the median
and worst of ``--repeat`` runs per case (the goal, issue 30: < 10 ms at 10,000 GPUs).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpuspawner.estimate import Ask, History, Holding, for_gpus
from gpuspawner.gpu import GPU, GPUs

MODELS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
HOUR = 3600.0


def case(gpus: int, users: int, seed: int, per: int = 1):
    rng = random.Random(seed)
    inventory = GPUs(GPU(f"h{h:05d}", i, f"GPU-{h}-{i}", MODELS[h % 2]) for h in range(gpus // 8) for i in range(8))
    now = 100 * HOUR
    holders, holdings = {}, {}
    for g in inventory:  # one owner per ``per`` GPUs of a host
        owner = f"u{g.host}-{g.index // per}/"
        holders[g.uuid] = owner
        holdings.setdefault(owner, Holding(now - rng.uniform(0, 8 * HOUR), f"user{rng.randrange(users)}", "gpu"))
    history = History(("gpu", f"user{rng.randrange(users)}", rng.expovariate(1 / (2 * HOUR))) for _ in range(2000))
    return now, inventory, holders, holdings, history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ahead", type=int, default=8)
    parser.add_argument("--per", type=int, default=1, choices=(1, 2, 4, 8), help="GPUs per holder")
    parser.add_argument("--backfill", default="off", choices=("off", "first-fit", "nearest-host"),
                        help="the queue's backfill rule the estimate follows (gpu_queue_backfill)")
    args = parser.parse_args()
    for gpus in (1000, 10000):
        now, inventory, holders, holdings, history = case(gpus, 1000, gpus, args.per)
        for models in (("any",), ("a100",)):
            ahead = [Ask(f"w{i}/", 1, f"w{i}", "gpu", models=models) for i in range(args.ahead)]
            ask = Ask("me/", 1, "me", "gpu", models=models)
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                est = for_gpus(ask, now, inventory, holders, holdings, ahead, history, backfill=args.backfill)
                times.append(time.perf_counter() - started)
            print(f"{gpus:>6} GPUs held by {gpus // args.per:>5}, {args.ahead} ahead, {args.backfill}, "
                  f"models {models[0]:>4}: "
                  f"median {1000 * statistics.median(times):7.1f} ms, worst {1000 * max(times):7.1f} ms"
                  f"  ({est.when(now)})")


if __name__ == "__main__":
    main()
