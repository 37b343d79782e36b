"""The hub's one shared GPU state: :class:`HubState`.

JupyterHub runs every spawner of a hub, and every hub handler, in one process.
What they must agree on lives in one object per hub, created on first use and
found again by :func:`hub_state`:

- the ledger (who holds which GPU, under one lock) and the fair queue;
- the GPUs held out of service (what last held them is not over) and their retries;
- the cached GPU inventory (NVML on this host, or the configured list);
- reconciliation with the runtime (containers, processes, pods, Slurm jobs), run once per
  hub before anything is placed, what it learnt, and, where the cluster holds the truth, the
  timer that runs it again every ``gpu_reconcile_interval`` seconds and the record of which
  owners are in flight meanwhile (:class:`~gpuspawner.reconcile.Flights`);
- the Prometheus metrics, registered in JupyterHub's registry;
- the notebook GPU jobs' manager (made by the job API's first use);
- the admin overview's live readings and per-client caches (cluster capacity).

Spawners and hub handlers both reach it through :func:`hub_state` with the
hub's traitlets ``Config`` (which keeps it: one hub, one ``Config`` object) and spawner class, so the hub's GPU settings
(``c.GPUSpawnerMixin.gpu_inventory`` and friends, or the same traits set on the
spawner class's own section) are read the way traitlets reads them for the
spawners themselves. Nothing here imports a spawner backend or a hub handler.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import warnings
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from traitlets import Bool, Dict, Float, List, TraitError, Unicode, validate
from traitlets.config import Config, Configurable

from .gpu import GPU
from .inventory import CachedInventory, NVMLInventory, StaticInventory, gpus_from_config
from .ledger import Ledger, cluster_resource
from .metrics import HubMetrics, stop_serving
from .outofservice import OutOfService
from .queue import GPUQueue
from .reconcile import Flights
from .usage import UsageRecorder

log = logging.getLogger("gpuspawner")

__all__ = ["GPUHubSettings", "HubState", "hub_state", "stop_serving_hub_metrics"]


class GPUHubSettings(Configurable):
    """The settings one hub's GPU state is built from (a parent of every gpuspawner spawner).

    Configure them as ``c.GPUSpawnerMixin.<name>`` (or on the spawner class, e.g.
    ``c.GPUDockerSpawner.<name>``).
    """

    gpu_inventory = Unicode(
        "nvml",
        help="""
        Where the hub learns which GPUs exist: ``"nvml"`` (the GPUs of the host the
        hub runs on) or ``"static"`` (the list in ``static_gpus``, for a hub whose
        GPUs are on another host, e.g. a remote Docker engine).
        """,
    ).tag(config=True)

    static_gpus = List(
        Dict(),
        help="""GPUs for ``gpu_inventory = "static"``: dicts with ``uuid`` and ``name``
        (the NVML name, e.g. ``"NVIDIA A100-SXM4-80GB"``) and optionally ``host``
        (default ``"localhost"``), ``index`` (on its host; default: the next one),
        ``memory_total`` (bytes), ``compute_capability`` (e.g. ``[8, 0]``),
        ``driver_version``, ``cuda_driver_version`` (as NVML reports it, e.g. ``12040``),
        ``mig_mode`` (bool), ``minor_number`` (N of its device node ``/dev/nvidiaN``, for
        gpu-local's device fence), ``healthy`` (default ``True``; ``False`` keeps the GPU out
        of placement) and ``reason`` (why it is unhealthy, shown on the admin page).
        Topology, so that placement prefers connected GPUs and servers are pinned to
        the GPUs' CPUs on a host the hub cannot read through NVML: ``numa_node`` (the
        CPU-side NUMA node), ``cpus`` (its CPUs, ``"0-15,64-79"`` or a list) and
        ``links`` (``{other GPU's index: level}``, level ``"NV<n>"`` for n NVLink links,
        ``"PIX"``, ``"PXB"``, ``"PHB"``, ``"NODE"`` or ``"SYS"`` as ``nvidia-smi topo -m``
        prints them). GPUs without ``links`` count as unknown, placed by count only.""",
    ).tag(config=True)

    gpu_inventory_ttl = Float(
        5.0, help="Seconds an inventory reading is reused before the GPUs are read again."
    ).tag(config=True)

    simulated_gpus = Bool(
        False,
        help="Set when the GPUs come from the stand-in NVML library; the form says they are simulated.",
    ).tag(config=True)

    gpu_hub_id = Unicode(
        "jupyterhub",
        help="""
        This hub's name on what its servers run in: the label ``org.gpuspawner.hub`` on
        gpu-docker containers, the variable ``GPUSPAWNER_HUB`` in gpu-local server
        processes. After a restart the hub adopts (or stops) only what carries its own
        id, so two hubs may share one Docker engine or host if their ids differ.
        """,
    ).tag(config=True)

    gpu_job_time_limit = Float(
        24 * 3600.0,
        help="""
        The longest a notebook GPU job may run, in seconds (default 24 hours): a job past
        its time limit is stopped, marked ``timed_out`` and its GPUs freed. A job may ask
        for less (``time_limit`` in its request), never more.
        """,
    ).tag(config=True)

    gpu_reconcile_interval = Float(
        60.0,
        help="""
        Seconds between two reconciliations of the hub's GPU ledger with what the cluster
        runs, on the backends where the cluster holds the truth (gpu-slurm's jobs, gpu-kube's
        pods, gpu-docker's containers, gpu-swarm's services). The hub reconciles once at start
        (before it places anything) and then every this many seconds, on a timer of its own,
        never per request: an owner charged for GPUs whose workload is gone (ended, cancelled
        or deleted behind the hub's back) is released, a live workload of this hub is charged
        to its owner, and one no server or notebook job of the hub's database names is
        cancelled (gpu-slurm, ``slurm_cancel_orphans``) or adopted (the others); the hub's log
        says which. Starts and stops in flight are left alone. ``0`` reconciles only at start.
        At least 1 second otherwise (each pass lists the cluster's workloads).
        """,
    ).tag(config=True)

    @validate("gpu_reconcile_interval")
    def _check_reconcile_interval(self, proposal):
        value = proposal["value"]
        if value != 0 and not value >= 1:
            raise TraitError(f"gpu_reconcile_interval must be 0 (only at start) or at least 1 second, not {value}")
        return value

    @validate("gpu_inventory")
    def _check_inventory(self, proposal):
        if proposal["value"] not in ("nvml", "static"):
            raise TraitError(f"gpu_inventory must be 'nvml' or 'static', not {proposal['value']!r}")
        return proposal["value"]

    @validate("static_gpus")
    def _check_static_gpus(self, proposal):
        try:
            gpus_from_config(proposal["value"])
        except ValueError as e:
            raise TraitError(f"static_gpus: {e}") from e
        return proposal["value"]

    @validate("gpu_job_time_limit")
    def _check_job_time_limit(self, proposal):
        if proposal["value"] <= 0:
            raise TraitError(f"gpu_job_time_limit must be > 0 seconds, not {proposal['value']}")
        return proposal["value"]

    @validate("gpu_inventory_ttl")
    def _check_ttl(self, proposal):
        if proposal["value"] < 0:
            raise TraitError(f"gpu_inventory_ttl must be >= 0 seconds, not {proposal['value']}")
        return proposal["value"]

    def state_key(self) -> str:
        """What makes two settings objects describe the same GPUs."""
        return json.dumps(
            [self.gpu_inventory, self.static_gpus if self.gpu_inventory == "static" else None,
             self.simulated_gpus, self.gpu_hub_id],
            sort_keys=True,
        )


def settings_for(config: Config, spawner_class: type | None) -> GPUHubSettings:
    """The GPU settings ``spawner_class`` gets from ``config``, read by traitlets itself.

    A settings object whose config sections are the spawner class's own, so that
    ``c.GPUSpawnerMixin.x``, ``c.GPUDockerSpawner.x`` and ``c.Spawner.x`` apply
    with the same priorities as for the spawners. The spawner's other options are
    not settings, so traitlets' "not recognized" warnings are silenced here.
    """
    sections = spawner_class.section_names() if isinstance(spawner_class, type) and issubclass(
        spawner_class, Configurable) else GPUHubSettings.section_names()

    class _AsSpawner(GPUHubSettings):
        @classmethod
        def section_names(cls) -> list[str]:
            return sections

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _AsSpawner(config=config)


class HubState:
    """Everything one hub's spawners and handlers share (see the module docstring)."""

    def __init__(self, settings: GPUHubSettings) -> None:
        self.hub_id = settings.gpu_hub_id
        if settings.gpu_inventory == "static":
            source: Any = StaticInventory(list(settings.static_gpus))
        else:
            source = NVMLInventory(simulated=settings.simulated_gpus)
        self.inventory_source = settings.gpu_inventory
        self.inventory = CachedInventory(source, ttl=settings.gpu_inventory_ttl)
        self.ledger = Ledger()
        self.queue = GPUQueue()
        #: GPUs held because what last held them is not over (processes that would not die)
        self.out_of_service = OutOfService(self.ledger, self.queue.wake)
        #: the notebook GPU jobs' manager (gpuspawner.jobs.manager), made by the hub's job API on first use
        self.jobs: Any = None
        #: usage accounting: every hold and release of the ledger, in the hub's database
        self.usage = UsageRecorder(self.gpu_info)
        self.ledger.observe(self.usage.observe)
        self.metrics = HubMetrics(self.inventory, self.ledger, self.queue.__len__, self.usage.gpu_seconds,
                                  lambda: self.jobs.counts() if self.jobs is not None else {})
        #: owner -> GPU records the runtime reported (container labels, process environments)
        self.found: dict[str, tuple[GPU, ...]] = {}
        #: per-purpose caches a backend or handler keeps for this hub (e.g. cluster capacity)
        self.caches: dict[Hashable, Any] = {}
        self._once: dict[Hashable, asyncio.Future] = {}
        #: owners whose start or stop (or notebook job) is in flight: reconciliation leaves them alone
        self.flights = Flights()
        #: seconds between reconciliations with the cluster (0: only at start)
        self.reconcile_interval = settings.gpu_reconcile_interval
        self._every: dict[Hashable, Callable[[], Awaitable[None]]] = {}
        self._timers: dict[Hashable, asyncio.TimerHandle | asyncio.Future] = {}

    def gpu_info(self, uuid: str) -> dict:
        """What the usage records keep of one held GPU (a cluster token: its resource)."""
        resource = cluster_resource(uuid)
        if resource is not None:
            return {"uuid": uuid, "name": resource, "model": resource, "host": "", "index": None}
        reading = self.inventory.last_reading()
        for gpu in reading.gpus if reading is not None else ():
            if gpu.uuid == uuid:
                return {"uuid": uuid, "name": gpu.name, "model": gpu.model, "host": gpu.host, "index": gpu.index}
        found = self.found_gpu(uuid)
        if found is not None:
            return {"uuid": uuid, "name": found.name, "model": found.model, "host": found.host, "index": found.index}
        return {"uuid": uuid, "name": "", "model": "", "host": "", "index": None}

    def found_gpu(self, uuid: str) -> GPU | None:
        """The record of ``uuid`` the runtime reported (container labels, process environments)."""
        for gpus in self.found.values():
            for gpu in gpus:
                if gpu.uuid == uuid:
                    return gpu
        return None

    async def once(self, key: Hashable, run: Callable[[], Awaitable[None]]) -> None:
        """Run ``run`` once for this hub (a reconciliation); concurrent callers wait for it.

        A failed run is tried again by the next caller.
        """
        future = self._once.get(key)
        if future is None or (future.done() and (future.cancelled() or future.exception())):
            future = self._once[key] = asyncio.ensure_future(run())
        await asyncio.shield(future)

    def every(self, key: Hashable, interval: float, run: Callable[[], Awaitable[None]]) -> None:
        """Run ``run`` every ``interval`` seconds on the running event loop (the hub's), from now on.

        One timer per ``key``: calling again only replaces ``run`` (the next round calls the
        newest). Rounds never overlap: the next is timed from the end of the last. A round
        that raises is logged and the timer goes on. ``interval`` 0: no timer.
        """
        self._every[key] = run
        if key in self._timers or interval <= 0:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            round_ = self._timers[key] = asyncio.ensure_future(self._every[key]())
            round_.add_done_callback(landed)

        def landed(round_: asyncio.Future) -> None:
            if round_.cancelled() or self._timers.get(key) is not round_:
                return
            if round_.exception() is not None:
                log.error("gpuspawner: periodic %s failed", key, exc_info=round_.exception())
            self._timers[key] = loop.call_later(interval, fire)

        self._timers[key] = loop.call_later(interval, fire)

    def cache(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The object kept under ``key`` for this hub, made on first use."""
        if key not in self.caches:
            self.caches[key] = make()
        return self.caches[key]

    def close(self) -> None:
        """Stop serving this state's metrics, stop its timers and retrying out-of-service GPUs."""
        self.metrics.unregister()
        self.out_of_service.close()
        timers, self._timers = self._timers, {}
        for timer in timers.values():
            timer.cancel()


class _HubStates:
    """The hub states of one hub's ``Config`` (one per GPU settings key; one in practice).

    Kept on that ``Config`` object itself: every spawner and handler of a hub holds the
    same one, and a new hub (a new ``Config``) starts with none.
    """

    ATTRIBUTE = "_gpuspawner_hub_states"  # in the Config's __dict__, never one of its sections

    def __init__(self) -> None:
        self.lock = threading.Lock()  # spawners, handlers and threads may ask at once
        self.states: dict[str, HubState] = {}

    @classmethod
    def of(cls, config: Config) -> _HubStates:
        held = config.__dict__.get(cls.ATTRIBUTE)
        return held if held is not None else config.__dict__.setdefault(cls.ATTRIBUTE, cls())


def hub_state(config: Config, spawner_class: type | None = None,
              settings: GPUHubSettings | None = None) -> HubState:
    """The hub state for this hub's ``config`` (created on first use, then always the same).

    ``settings`` are the caller's own resolved GPU settings (a spawner passes
    itself); otherwise they are read from ``config`` for ``spawner_class``. The
    newest state's metrics are the ones served at ``/hub/metrics``.
    """
    if settings is None:
        settings = settings_for(config, spawner_class)
    held = _HubStates.of(config)
    key = settings.state_key()
    with held.lock:
        state = held.states.get(key)
        if state is None:
            state = held.states[key] = HubState(settings)
            state.metrics.register()
        return state


def stop_serving_hub_metrics() -> None:
    """Stop serving any hub state's metrics in this process (tests, between their hubs)."""
    stop_serving()
