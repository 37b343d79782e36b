"""Prometheus metrics of the hub's GPUs, in prometheus_client's default registry.

JupyterHub serves that registry at ``/hub/metrics`` (a token with the
``read:metrics`` scope, or ``c.JupyterHub.authenticate_prometheus = False``).

- ``gpuspawner_gpus{model,host,state}``: GPUs per model and host; ``state`` is
  ``total``, ``allocated`` or ``free`` (free: healthy and not held);
- ``gpuspawner_spawn_refusals_total{reason}``: refused spawns, by the
  refusal's code (``none_free``, ``quota_user``, ``queue_timeout``, ...);
- ``gpuspawner_queue_length``: spawns waiting for a GPU;
- ``gpuspawner_placement_seconds{outcome}``: from asking for GPUs to getting
  them (queue wait included) or being refused.

Collecting never does I/O: it uses the newest inventory reading the hub has.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from prometheus_client import REGISTRY, Counter as PromCounter, Histogram
from prometheus_client.core import GaugeMetricFamily

from ..inventory import CachedInventory
from ..ledger import Ledger

REFUSALS = PromCounter(
    "gpuspawner_spawn_refusals", "GPU spawns refused, by reason (PlacementError code)", ["reason"]
)
PLACEMENT_SECONDS = Histogram(
    "gpuspawner_placement_seconds",
    "Seconds from asking for GPUs to getting them (queue wait included) or being refused",
    ["outcome"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600),
)


class _GPUCollector:
    """GPUs total/allocated/free per model and host, and the queue length."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: dict[int, tuple[CachedInventory, Ledger]] = {}
        self._queue_length: Callable[[], int] = lambda: 0

    def watch(self, inventory: CachedInventory, ledger: Ledger) -> None:
        with self._lock:
            self._sources[id(inventory)] = (inventory, ledger)

    def watch_queue(self, length: Callable[[], int]) -> None:
        self._queue_length = length

    def collect(self):
        gpus = GaugeMetricFamily("gpuspawner_gpus", "GPUs per model and host", labels=["model", "host", "state"])
        counts: Counter[tuple[str, str, str]] = Counter()
        with self._lock:
            sources = list(self._sources.values())
        for inventory, ledger in sources:
            reading = inventory.last_reading()
            if reading is None:
                continue
            held = ledger.held()
            for gpu in reading.gpus:
                counts[(gpu.model, gpu.host, "total")] += 1
                taken = gpu.uuid in held
                counts[(gpu.model, gpu.host, "allocated")] += taken
                counts[(gpu.model, gpu.host, "free")] += gpu.healthy and not taken
        for labels, value in sorted(counts.items()):
            gpus.add_metric(list(labels), value)
        yield gpus
        queue = GaugeMetricFamily("gpuspawner_queue_length", "Spawns waiting in the hub's queue for a free GPU")
        queue.add_metric([], len_or_zero(self._queue_length))
        yield queue


def len_or_zero(length: Callable[[], int]) -> int:
    try:
        return int(length())
    except Exception:
        return 0


COLLECTOR = _GPUCollector()
REGISTRY.register(COLLECTOR)


def refused(code: str, seconds: float) -> None:
    REFUSALS.labels(reason=code).inc()
    PLACEMENT_SECONDS.labels(outcome="refused").observe(seconds)


def placed(seconds: float) -> None:
    PLACEMENT_SECONDS.labels(outcome="placed").observe(seconds)
