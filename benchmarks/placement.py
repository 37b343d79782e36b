"""How long GPU placement takes, and how well it connects: ``scripts/bench placement``.

Prints figures only; it asserts nothing about timing. Inventories look like
real clusters: hosts of 8 GPUs with the topology of the stand-in's example
layouts (H100 on NVSwitch boxes, A100 on hybrid cube-mesh boxes, T4 and L4 in
2-socket PCIe boxes: ``tests/fakenvml/layouts.py``), a few unhealthy GPUs and
a good share already held. Measurements:

1. one placement decision (:func:`gpuspawner.placement.place` on a
   :class:`~gpuspawner.placement.PlacementIndex`, as the ledger keeps one) at
   10, 1,000 and 10,000 GPUs (1,250 hosts of 8), over a mix of requests,
   median and p99; the same from scratch (index and free state built in the
   call); the refusal path (building the explanation) at 10,000 GPUs;
2. 1,000 queued requests placed one after another through a
   :class:`gpuspawner.ledger.Ledger` on 10,000 GPUs, total and per request;
3. a replayed arrival stream (requests of 1, 2, 4 and 8 GPUs arriving and
   leaving) on 200 hosts, placed by first fit, by count-only best fit (the
   rule before topology) and by gpuspawner's placement: the share of 2-, 4-
   and 8-GPU requests that got NVLink-connected GPUs, and how many were refused.
"""

from __future__ import annotations

import gc
import os
import platform
import random
import statistics
import time

from fakenvml.layouts import links as layout_links
from gpuspawner.gpu import GPU, GPUs, model_rank
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest, PlacementError, PlacementIndex, place, set_class_of
from gpuspawner.topology import CLASS_NAMES, NVLINK_CLASSES

GPUS_PER_HOST = 8
MODELS = [  # (name, share of hosts, layout)
    ("NVIDIA A100-SXM4-80GB", 0.40, "cube-mesh-8"),
    ("NVIDIA H100 80GB HBM3", 0.20, "nvswitch-8"),
    ("Tesla T4", 0.25, "pcie-2socket-8"),
    ("NVIDIA L4", 0.15, "pcie-2socket-8"),
]
LINKS = {layout: [tuple(sorted(words.items())) for words in layout_links(layout)] for _, _, layout in MODELS}
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
    gpus: list[GPU] = []
    host = 0
    while len(gpus) < n:
        name, _, layout = rng.choices(MODELS, [share for _, share, _ in MODELS])[0]
        size = min(GPUS_PER_HOST, n - len(gpus))
        for index in range(size):
            healthy = rng.random() > 0.01
            gpus.append(
                GPU(
                    f"node{host:05d}",
                    index,
                    f"GPU-{host:05d}-{index}",
                    name,
                    healthy=healthy,
                    reason=None if healthy else "GPU is lost",
                    links=tuple((p, w) for p, w in LINKS[layout][index] if p < size),
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


def time_decisions(n: int, repeats: int, rng: random.Random, scratch: bool = False) -> tuple[list[int], int]:
    """Nanoseconds per :func:`place` call, and how many calls were refused.

    ``scratch``: the call gets a plain list and builds the index and free state
    itself; otherwise it gets a :class:`PlacementIndex` built beforehand.
    """
    gpus = inventory(n, rng)
    held = held_share(gpus, rng)
    source = gpus if scratch else PlacementIndex(gpus)
    samples: list[int] = []
    refused = 0
    gc.collect()
    for request in requests(repeats, rng):
        start = time.perf_counter_ns()
        try:
            place(source, held, request)
        except PlacementError:
            refused += 1
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return samples, refused


def time_refusals(n: int, repeats: int, rng: random.Random) -> list[int]:
    """Nanoseconds per refused :func:`place` call (8 GPUs asked, 95% held)."""
    gpus = PlacementIndex(inventory(n, rng))
    held = held_share(list(gpus), rng, share=0.95)
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
    """Total nanoseconds for ``k`` reserves in a row, placed and refused counts.

    The inventory is one tuple, as a hub's cached inventory reading is, so the
    ledger builds its placement state once (included in the total).
    """
    gpus = GPUs(inventory(n, rng))
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


# ------------------------------------------------------- replayed arrivals --

STREAM_HOSTS = 200
STREAM_ARRIVALS = 6_000
STREAM_SIZES = [(1, 0.45), (2, 0.25), (4, 0.18), (8, 0.12)]


def free_groups(gpus: list[GPU], held: set[str], models: tuple[str, ...]) -> dict[tuple[str, str], list[GPU]]:
    groups: dict[tuple[str, str], list[GPU]] = {}
    for g in gpus:
        if g.healthy and g.uuid not in held and model_rank(models, g.model) is not None:
            groups.setdefault((g.host, g.model), []).append(g)
    return groups


def first_fit(gpus: list[GPU], held: set[str], count: int, models: tuple[str, ...]) -> tuple[GPU, ...] | None:
    """The first (host, model) in host order with room; its lowest free indexes."""
    groups = free_groups(gpus, held, models)
    for key in sorted(groups):
        if len(groups[key]) >= count:
            return tuple(sorted(groups[key], key=lambda g: g.index)[:count])
    return None


def count_best_fit(gpus: list[GPU], held: set[str], count: int, models: tuple[str, ...]) -> tuple[GPU, ...] | None:
    """The rule before topology: the (host, model) with the fewest free that fits; lowest indexes."""
    groups = free_groups(gpus, held, models)
    fits = [(len(v), k) for k, v in groups.items() if len(v) >= count]
    if not fits:
        return None
    return tuple(sorted(groups[min(fits)[1]], key=lambda g: g.index)[:count])


def arrivals(rng: random.Random) -> list[tuple[float, int, float]]:
    """(arrival time, GPUs, duration): Poisson arrivals sized to keep the cluster about 85% busy."""
    mean_gpus = sum(c * w for c, w in STREAM_SIZES)
    capacity = STREAM_HOSTS * GPUS_PER_HOST
    mean_duration = 100.0
    rate = 0.85 * capacity / (mean_gpus * mean_duration)
    t, out = 0.0, []
    sizes, weights = zip(*STREAM_SIZES, strict=True)
    for _ in range(STREAM_ARRIVALS):
        t += rng.expovariate(rate)
        out.append((t, rng.choices(sizes, weights)[0], rng.expovariate(1 / mean_duration)))
    return out


#: The two request mixes replayed: every request for any model; or multi-GPU requests for the
#: SXM models (A100, H100) and single GPUs for any.
MIXES = {"any model": lambda count: (), "multi-GPU on a100/h100": lambda count: ("a100", "h100") if count > 1 else ()}


def replay(
    gpus: list[GPU], stream: list[tuple[float, int, float]], policy: str, mix: str
) -> dict[int, list[int]]:
    """Per size: [requests, placed, on NVLink-connected GPUs]."""
    import heapq

    ledger = Ledger()
    inventory_tuple = tuple(gpus)
    held: set[str] = set()
    leaving: list[tuple[float, str]] = []
    stats = {size: [0, 0, 0] for size, _ in STREAM_SIZES}
    for n, (t, count, duration) in enumerate(stream):
        while leaving and leaving[0][0] <= t:
            _, owner = heapq.heappop(leaving)
            held -= set(ledger.release(owner))
        owner = f"job{n}"
        stats[count][0] += 1
        models = MIXES[mix](count)
        if policy == "topology":
            try:
                got = ledger.reserve(inventory_tuple, GPURequest(owner, count, models))
            except PlacementError:
                continue
        else:
            got = (first_fit if policy == "first fit" else count_best_fit)(gpus, held, count, models)
            if got is None:
                continue
            ledger.adopt(owner, [g.uuid for g in got])
        held |= {g.uuid for g in got}
        heapq.heappush(leaving, (t + duration, owner))
        stats[count][1] += 1
        stats[count][2] += CLASS_NAMES.index(set_class_of(got)) in NVLINK_CLASSES
    return stats


def ms(ns: float) -> str:
    return f"{ns / 1e6:9.3f} ms"


def main() -> None:
    rng = random.Random(20240601)
    print(f"gpuspawner placement benchmark  (Python {platform.python_version()}, {platform.machine()})")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print("hosts of 8 GPUs with topology, 4 models, ~1% unhealthy, ~50% held; mixed requests of 1-8 GPUs\n")
    print(f"{'GPUs':>7} {'calls':>6} {'refused':>8} {'median':>12} {'p99':>12} {'max':>12}")
    for n, repeats in SIZES:
        samples, refused = time_decisions(n, repeats, rng)
        print(
            f"{n:>7,} {repeats:>6} {refused:>8} {ms(statistics.median(samples)):>12} "
            f"{ms(percentile(samples, 0.99)):>12} {ms(samples[-1]):>12}"
        )
    samples, refused = time_decisions(10_000, 30, rng, scratch=True)
    print(
        f"{10_000:>7,} {30:>6} {refused:>8} {ms(statistics.median(samples)):>12} "
        f"{ms(percentile(samples, 0.99)):>12} {ms(samples[-1]):>12}   (from scratch: index and state built per call)"
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

    hosts = inventory(STREAM_HOSTS * GPUS_PER_HOST, random.Random(7))
    stream = arrivals(random.Random(11))
    print(
        f"\nReplayed arrivals: {STREAM_ARRIVALS:,} requests (1/2/4/8 GPUs: "
        f"{'/'.join(f'{w:.0%}' for _, w in STREAM_SIZES)}), ~85% load, {STREAM_HOSTS} hosts of 8"
    )
    for mix in MIXES:
        print(f"\n  {mix}")
        print(f"{'policy':>16} " + " ".join(f"{f'{c} GPUs: NVLink':>15} {'refused':>8}" for c in (2, 4, 8))
              + f" {'1 GPU refused':>14}")
        for policy in ("first fit", "count best fit", "topology"):
            stats = replay(hosts, stream, policy, mix)
            cells = []
            for c in (2, 4, 8):
                asked, placed, nvlink = stats[c]
                cells.append(f"{nvlink / placed if placed else 0:>15.1%} {asked - placed:>8}")
            print(f"{policy:>16} " + " ".join(cells) + f" {stats[1][0] - stats[1][1]:>14}")


if __name__ == "__main__":
    main()
