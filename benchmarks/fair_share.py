"""How long one look at the fair-share order takes (``GPUQueue.reorder`` under ``gpu_queue_order = "fair-share"``).

    scripts/bench fair_share [WAITING] [HOLDERS] [HISTORY_ROWS]

A hub's queue looks at each user's recent use (the ended holdings, decayed, plus what each holds now
from the ledger) at most once a second (``gpuspawner.queue.REORDER_EVERY``), however many waiting
requests look at the order meanwhile. Prints the time of one look for WAITING requests (default 1000,
of 700 users), HOLDERS servers holding a GPU each (default 2000) and HISTORY_ROWS ended holdings
(default 20000, the usage rows the hub reads), and the machine's load average.
"""

from __future__ import annotations

import os
import sys
import time

from gpuspawner.fairshare import RecentUse, held_now, use_now
from gpuspawner.gpu import GPU
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest
from gpuspawner.queue import GPUQueue


def main(waiting: int = 1000, holders: int = 2000, rows: int = 20000) -> None:
    inventory = tuple(GPU(f"h{i // 8}", i % 8, f"GPU-{i}", "NVIDIA A100-SXM4-80GB") for i in range(holders))
    ledger = Ledger()
    for i in range(holders):
        ledger.reserve(inventory, GPURequest(f"user{i}/", 1))
    recent = RecentUse(7 * 86400.0)
    for i in range(rows):
        recent.add(f"user{i % 500}", 1, "a100-sxm4-80gb", i * 60.0, i * 60.0 + 3600)
    models = {g.uuid: g.model for g in inventory}
    clock = [0.0]
    queue = GPUQueue(clock=lambda: clock[0])
    queue.fair_share = use_now(lambda: recent, recent.half_life, lambda: held_now(
        ledger.allocations(), ledger.since, lambda owner: owner.split("/")[0], models.__getitem__, time.time()),
        time.time)
    for i in range(waiting):
        queue.join(f"w{i}/", f"user{i % 700}", 1)
    looks = 50
    started = time.perf_counter()
    for _ in range(looks):
        clock[0] += 1.0  # a second on: the order is looked at again
        queue.reorder()
    took = (time.perf_counter() - started) / looks
    print(f"one look at the fair-share order: {1000 * took:.2f} ms ({waiting} waiting, {holders} holders, "
          f"{rows} ended holdings); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
