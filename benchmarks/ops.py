"""Cost of quotas and the queue around placement, and of the admin overview's build.

Prints figures, with ratios against a baseline measured in the same run:

- reserve: plain ``Ledger.reserve`` vs reserve with the quota check under the lock
  (1,000 GPUs on 125 hosts, 500 owners of 50 users);
- queue: ordering work per wake-up (``GPUQueue.ahead``) with 10, 100 and 1,000 waiters;
- overview: ``overview.build`` for 1,000 GPUs.

    scripts/bench ops
"""

from __future__ import annotations

import time

from gpuspawner.gpu import GPU, GPUs
from gpuspawner.hub.live import GPUNumbers
from gpuspawner.hub.overview import Holder, build
from gpuspawner.inventory import InventoryReading
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest
from gpuspawner.queue import GPUQueue
from gpuspawner.quota import Quota, check


def inventory(n: int = 1000) -> GPUs:
    names = ["NVIDIA A100-SXM4-80GB", "Tesla T4"]
    return GPUs(GPU(f"node{i // 8:03d}", i % 8, f"GPU-{i:05d}", names[(i // 8) % 2]) for i in range(n))


def timed(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def bench_reserve(gpus) -> tuple[float, float]:
    def run(with_quota: bool) -> None:
        ledger = Ledger()
        for n in range(500):
            request = GPURequest(f"user{n % 50}/s{n}", 2)
            quota = Quota(f"user{n % 50}", per_user=1000, groups={"g": 10_000},
                          members={"g": frozenset(f"user{k}" for k in range(25))})
            admit = (lambda held, q=quota, r=request: check(q, 2, held, r.owner)) if with_quota else None
            ledger.reserve(gpus, request, admit=admit)
    return timed(lambda: run(False), 3), timed(lambda: run(True), 3)


def bench_queue(gpus, waiters: int) -> float:
    queue = GPUQueue()
    for n in range(waiters):
        queue.join(f"user{n}/", f"user{n}", 1, ("a100",) if n % 2 else ())
    last = queue.waiters()[-1]
    return timed(lambda: queue.ahead(last.models, gpus, before=last), 20)


def bench_overview(gpus) -> float:
    allocations = {f"user{n}/": (gpus[n].uuid,) for n in range(0, len(gpus), 2)}
    holders = {o: Holder(o, o[:-1], "", time.time(), "running", f"/user/{o}") for o in allocations}
    live = {g.uuid: GPUNumbers(50, 2**30, 2**34, time.time(), "monitor") for g in gpus}
    reading = InventoryReading(gpus)
    return timed(lambda: build(reading, allocations, holders, live, {}, [], time.time()), 20)


def main() -> None:
    gpus = inventory()
    plain, quota = bench_reserve(gpus)
    print(f"reserve 500 requests on 1,000 GPUs: plain {plain * 1000:.1f} ms, with quotas {quota * 1000:.1f} ms "
          f"(x{quota / plain:.2f})")
    base = bench_queue(gpus, 10)
    for n in (10, 100, 1000):
        t = bench_queue(gpus, n)
        print(f"queue order check with {n:>4} waiters: {t * 1000:.2f} ms per wake-up (x{t / base:.1f} vs 10)")
    print(f"overview build for 1,000 GPUs: {bench_overview(gpus) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
