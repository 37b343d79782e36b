"""Prometheus metrics of one hub's GPUs: a collector owned by the hub's :class:`~gpuspawner.state.HubState`.

JupyterHub serves prometheus_client's default registry at ``/hub/metrics`` (a
token with the ``read:metrics`` scope, or ``c.JupyterHub.authenticate_prometheus
= False``); each hub state owns one :class:`HubMetrics` and registers it there when
it is created, in place of an older hub state's in the same process (nothing is
registered on import).

- ``gpuspawner_gpus{model,host,state}``: GPUs per model and host; ``state`` is
  ``total`` (in service: healthy, held or not), ``free`` (in service, not held),
  ``unavailable`` (out of service) or ``allocated`` (held, whatever its health),
  counted as the form and refusals count them (:mod:`gpuspawner.availability`), of the
  hub's own inventory only;
- ``gpuspawner_gpu_healthy{gpu,host,model}``: 1 for each GPU in service, 0 for one out of
  service (``gpu`` is its UUID; see :mod:`gpuspawner.health`). Where the cluster places (gpu-kube,
  gpu-slurm) and names no device, the GPUs of its nodes as its nodes say (``host`` is the node;
  ``gpu`` is ``<node>/<model>/<n>``, those in service numbered first: :mod:`gpuspawner.health_cluster`);
- ``gpuspawner_cluster_gpus_held{resource}``: GPUs this hub's servers hold where
  the cluster places them (gpu-kube), per cluster resource (``nvidia.com/gpu``,
  ``nvidia.com/mig-1g.10gb``, ...);
- ``gpuspawner_spawn_refusals_total{reason}``: refused spawns, by the
  refusal's code (``none_free``, ``quota_user``, ``queue_timeout``, ...);
- ``gpuspawner_queue_length``: spawns waiting for a GPU;
- ``gpuspawner_placement_seconds{outcome}``: from asking for GPUs to getting
  them (queue wait included) or being refused;
- ``gpuspawner_gpu_seconds_total{user,state}``: GPU-seconds held by each user's
  servers and jobs that their utilisation samples show ``busy`` or ``idle``
  (the culler's threshold; see :mod:`gpuspawner.usage`), counted since the hub
  process started;
- ``gpuspawner_jobs{state}``: notebook GPU jobs per state (``queued``, ``starting``,
  ``running``, ``completed``, ``failed``, ``cancelled``, ``timed_out``);
- ``gpuspawner_budget_left{user}``: weighted GPU-hours left of each user's budget (the one with
  the least left), as the hub last computed it (a spawn, the form, the budgets API, the usage
  page); one series per user who has a budget and was looked at, none without budgets;
- ``gpuspawner_notifications_total{channel,event,outcome}``: notifications the hub's notifier
  (:mod:`gpuspawner.hub.notify`) sent (``outcome="sent"``) or gave up (``"failed"``), per
  channel (``email``, ``webhook``, ``jupyterlab``, ...) and event (``ready``, ``cull``, ...).

Collecting never does I/O: it uses the newest inventory reading the hub has.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import Counter as PromCounter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from .availability import by_model
from .gpu import GPU
from .health_cluster import numbered
from .inventory import CachedInventory
from .ledger import Ledger, cluster_holdings

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600)


class HubMetrics(Collector):
    """The hub's GPU metrics: live gauges from the ledger, inventory and queue, plus counters."""

    def __init__(self, inventory: CachedInventory, ledger: Ledger, queue_length: Callable[[], int],
                 gpu_seconds: Mapping[tuple[str, str], float] | None = None,
                 jobs: Callable[[], dict[str, int]] = dict, cluster_health: Callable[[], Iterable] = tuple) -> None:
        self._inventory = inventory
        self._cluster_health = cluster_health  # NodeHealth of the cluster's nodes (gpuspawner.health_cluster)
        self._gpu_seconds = gpu_seconds if gpu_seconds is not None else {}
        self._jobs = jobs
        self._ledger = ledger
        self._queue_length = queue_length
        # unregistered metric objects: this collector yields them
        self.refusals = PromCounter(
            "gpuspawner_spawn_refusals", "GPU spawns refused, by reason (PlacementError code)", ["reason"],
            registry=None,
        )
        self.placement_seconds = Histogram(
            "gpuspawner_placement_seconds",
            "Seconds from asking for GPUs to getting them (queue wait included) or being refused",
            ["outcome"], buckets=BUCKETS, registry=None,
        )
        self.notifications = PromCounter(
            "gpuspawner_notifications", "Notifications sent or failed, per channel and event",
            ["channel", "event", "outcome"], registry=None,
        )
        self._registry: CollectorRegistry | None = None
        #: user -> GPU-hours left of their budget (set by the hub's budget keeper, gpuspawner.backends.budgets)
        self.budget_left: Callable[[], Mapping[str, float]] = dict

    # ------------------------------------------------------------ recording

    def refused(self, code: str, seconds: float) -> None:
        self.refusals.labels(reason=code).inc()
        self.placement_seconds.labels(outcome="refused").observe(seconds)

    def placed(self, seconds: float) -> None:
        self.placement_seconds.labels(outcome="placed").observe(seconds)

    # ------------------------------------------------------------ serving

    def collect(self) -> Iterator[Metric]:
        gpus = GaugeMetricFamily("gpuspawner_gpus", "GPUs per model and host", labels=["model", "host", "state"])
        reading = self._inventory.last_reading()
        if reading is not None:
            held = self._ledger.held()
            per_host: dict[str, list[GPU]] = defaultdict(list)
            for gpu in reading.gpus:
                per_host[gpu.host].append(gpu)
            for host, host_gpus in sorted(per_host.items()):
                allocated = Counter(g.model for g in host_gpus if g.uuid in held)
                for slug, counts in by_model(host_gpus, held).items():
                    for state, value in (("total", counts.total), ("allocated", allocated[slug]),
                                         ("free", counts.free), ("unavailable", counts.unavailable)):
                        gpus.add_metric([slug, host, state], value)
        yield gpus
        healthy = GaugeMetricFamily("gpuspawner_gpu_healthy", "1: the GPU is in service; 0: out of service "
                                    "(unhealthy: XID, ECC error, row remapping, lost, or taken out)",
                                    labels=["gpu", "host", "model"])
        for gpu in reading.gpus if reading is not None else ():
            healthy.add_metric([gpu.uuid, gpu.host, gpu.model], 1 if gpu.healthy else 0)
        for gpu, host, model, value in numbered(self._cluster_health()):
            healthy.add_metric([gpu, host, model], value)
        yield healthy
        cluster = GaugeMetricFamily(
            "gpuspawner_cluster_gpus_held",
            "GPUs held by this hub's servers where the cluster places them, per resource", labels=["resource"],
        )
        held_in_cluster = cluster_holdings(k for keys in self._ledger.allocations().values() for k in keys)
        for resource, value in sorted(held_in_cluster.items()):
            cluster.add_metric([resource], value)
        yield cluster
        queue = GaugeMetricFamily("gpuspawner_queue_length", "Spawns waiting in the hub's queue for a free GPU")
        queue.add_metric([], self._queue_length())
        yield queue
        seconds = CounterMetricFamily(
            "gpuspawner_gpu_seconds", "GPU-seconds held, busy or idle by the utilisation samples, per user",
            labels=["user", "state"],
        )
        for (user, state), value in sorted(dict(self._gpu_seconds).items()):
            seconds.add_metric([user, state], value)
        yield seconds
        jobs = GaugeMetricFamily("gpuspawner_jobs", "Notebook GPU jobs per state", labels=["state"])
        for state, value in self._jobs().items():
            jobs.add_metric([state], value)
        yield jobs
        left = GaugeMetricFamily("gpuspawner_budget_left", "Weighted GPU-hours left of each user's budget",
                                 labels=["user"])
        for user, value in sorted(self.budget_left().items()):
            left.add_metric([user], value)
        yield left
        yield from self.refusals.collect()
        yield from self.placement_seconds.collect()
        yield from self.notifications.collect()

    def register(self, registry: CollectorRegistry = REGISTRY) -> None:
        """Serve these metrics from ``registry`` (JupyterHub's ``/hub/metrics`` serves the default one).

        Which hub state's metrics are served is the hub states' registry's choice
        (:mod:`gpuspawner.state`), never looked up in prometheus' registry.
        """
        if self._registry is None:
            registry.register(self)
            self._registry = registry

    def unregister(self) -> None:
        if self._registry is not None:
            self._registry.unregister(self)
            self._registry = None
