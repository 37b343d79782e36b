"""How long GPU placement takes: ``python benchmarks/placement.py``.

Prints figures only; it asserts nothing about timing. Inventories look like
real clusters: hosts of 8 GPUs, a few models, a few unhealthy GPUs and a good
share already held. Two measurements:

1. one placement decision (:func:`gpuspawner.placement.place`) at 10, 1,000
   and 10,000 GPUs, over a mix of requests, median and p99;
   plus the refusal path (building the explanation) at 10,000 GPUs;
2. 1,000 queued requests placed one after another through a
   :class:`gpuspawner.ledger.Ledger` on 10,000 GPUs, total and per request.
"""

from __future__ import annotations

import gc
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuspawner.gpu import GPU  # noqa: E402
from gpuspawner.ledger import Ledger  # noqa: E402
from gpuspawner.placement import GPURequest, PlacementError, place  # noqa: E402

GPUS_PER_HOST = 8
MODELS = [  # (name, share of hosts)
    ("NVIDIA A100-SXM4-80GB", 0.40),
    ("NVIDIA H100 80GB HBM3", 0.20),
    ("Tesla T4", 0.25),
    ("NVIDIA L4", 0.15),
]
REQUEST_MIX = [  # (count, models)
    (1, ()),
    (1, ("t4",)),
    (2, ("a100",)),
    (1, ("l4", "t4")),
    (4, ("h100", "a100")),
    (8, ("a100",)),
    (2, ()),
]
SIZES = [(10, 5000), (1_000, 2000), (10_000, 300)]  # (GPUs, repeats)
QUEUED = 1_000


def inventory(n: int, rng: random.Random) -> list[GPU]:
    """``n`` GPUs on hosts of 8, one model per host, about 1% unhealthy."""
    names = [name for name, _ in MODELS]
    weights = [share for _, share in MODELS]
    gpus: list[GPU] = []
    host = 0
    while len(gpus) < n:
        name = rng.choices(names, weights)[0]
        for index in range(min(GPUS_PER_HOST, n - len(gpus))):
            healthy = rng.random() > 0.01
            gpus.append(
                GPU(
                    f"node{host:05d}",
                    index,
                    f"GPU-{host:05d}-{index}",
                    name,
                    healthy=healthy,
                    reason=None if healthy else "GPU is lost",
                )
            )
        host += 1
    rng.shuffle(gpus)
    return gpus


def held_share(gpus: list[GPU], rng: random.Random, share: float = 0.5) -> frozenset[str]:
    """About ``share`` of the GPUs already given out."""
    return frozenset(g.uuid for g in gpus if rng.random() < share)


def requests(k: int, rng: random.Random) -> list[GPURequest]:
    """``k`` requests drawn from the realistic mix."""
    return [
        GPURequest(f"user{i}", count, models)
        for i, (count, models) in enumerate(rng.choices(REQUEST_MIX, k=k))
    ]


def percentile(sorted_ns: list[int], q: float) -> int:
    """The ``q``-quantile (0..1) of already sorted samples, nearest rank."""
    rank = max(0, min(len(sorted_ns) - 1, round(q * len(sorted_ns)) - 1))
    return sorted_ns[rank]


def time_decisions(n: int, repeats: int, rng: random.Random) -> tuple[list[int], int]:
    """Nanoseconds per :func:`place` call, and how many calls were refused."""
    gpus = inventory(n, rng)
    held = held_share(gpus, rng)
    samples: list[int] = []
    refused = 0
    gc.collect()
    for request in requests(repeats, rng):
        start = time.perf_counter_ns()
        try:
            place(gpus, held, request)
        except PlacementError:
            refused += 1
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return samples, refused


def time_refusals(n: int, repeats: int, rng: random.Random) -> list[int]:
    """Nanoseconds per refused :func:`place` call (8 GPUs asked, 95% held)."""
    gpus = inventory(n, rng)
    held = held_share(gpus, rng, share=0.95)
    request = GPURequest("late", GPUS_PER_HOST, ("a100",))
    samples: list[int] = []
    gc.collect()
    for _ in range(repeats):
        start = time.perf_counter_ns()
        try:
            place(gpus, held, request)
        except PlacementError as error:
            str(error)
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return samples


def time_queue(n: int, k: int, rng: random.Random) -> tuple[int, int, int]:
    """Total nanoseconds for ``k`` reserves in a row, placed and refused counts."""
    gpus = inventory(n, rng)
    ledger = Ledger()
    queue = requests(k, rng)
    placed = refused = 0
    gc.collect()
    start = time.perf_counter_ns()
    for request in queue:
        try:
            ledger.reserve(gpus, request)
            placed += 1
        except PlacementError:
            refused += 1
    return time.perf_counter_ns() - start, placed, refused


def ms(ns: float) -> str:
    return f"{ns / 1e6:9.3f} ms"


def main() -> None:
    rng = random.Random(20240601)
    print(f"gpuspawner placement benchmark  (Python {platform.python_version()}, {platform.machine()})")
    print("hosts of 8 GPUs, 4 models, ~1% unhealthy, ~50% held; mixed requests of 1-8 GPUs\n")
    print(f"{'GPUs':>7} {'calls':>6} {'refused':>8} {'median':>12} {'p99':>12} {'max':>12}")
    for n, repeats in SIZES:
        samples, refused = time_decisions(n, repeats, rng)
        print(
            f"{n:>7,} {repeats:>6} {refused:>8} {ms(statistics.median(samples)):>12} "
            f"{ms(percentile(samples, 0.99)):>12} {ms(samples[-1]):>12}"
        )
    samples = time_refusals(10_000, 100, rng)
    print(
        f"{10_000:>7,} {100:>6} {'all':>8} {ms(statistics.median(samples)):>12} "
        f"{ms(percentile(samples, 0.99)):>12} {ms(samples[-1]):>12}   (refusal path: 8 x A100, 95% held)"
    )
    total, placed, refused = time_queue(10_000, QUEUED, rng)
    print(f"\nLedger: {QUEUED:,} queued requests, one after another, on 10,000 GPUs (empty at start)")
    print(f"  placed {placed}, refused {refused}")
    print(f"  total {ms(total).strip()}, per request {ms(total / QUEUED).strip()}")


if __name__ == "__main__":
    main()
