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
- the Prometheus metrics: its own collector, served at ``/hub/metrics`` (JupyterHub serves
  prometheus' default registry there) while it is the process's newest hub state;
- what a layer above keeps for this hub beside the ledger, each in its own typed object found by
  its class (:meth:`HubState.cache`): a backend's caches (``backends/<name>/caches.py``: cluster
  capacity readers, gpu-local's fences), the overview's live readings, the notebook GPU jobs'
  manager. This module knows none of those classes.

The hub application owns it: :func:`hub_state` keeps each hub's states in a registry keyed by
the JupyterHub app (``settings["app"]`` of the hub's handlers, ``user.settings["app"]`` of its
spawners), so spawners and handlers of one hub share one state and two hubs in one process
(tests) never do. A spawner made outside a hub (no app: a test, a script) is owned by its
traitlets ``Config`` object instead. The hub's GPU settings (``c.GPUSpawnerMixin.gpu_inventory``
and friends, or the same traits set on the spawner class's own section) are read the way
traitlets reads them for the spawners themselves. Nothing here imports a spawner backend, the
jobs or a hub handler, not even for type checking: each layer keeps its own things here by class.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from traitlets import Bool, Dict, Float, TraitError, Unicode, validate
from traitlets.config import Config, Configurable

from .gpu import GPU
from .health_nvml import GPUHealth
from .inventory import CachedInventory, NVMLInventory, StaticInventory, gpus_from_config
from .ledger import Ledger, cluster_resource
from .metrics import HubMetrics
from .outofservice import OutOfService
from .queue import GPUQueue
from .reconcile import Flights
from .static_gpus import SharedGPUs, StaticGPUList, gpus_json, share_static_gpus
from .usage import UsageRecorder

log = logging.getLogger("gpuspawner")

T = TypeVar("T")

__all__ = ["GPUHubSettings", "HubState", "hub_state", "hub_state_of_app",
           "stop_serving_hub_metrics"]




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
        GPUs are on another host, e.g. a remote Docker engine: gpu-docker logs a warning
        for ``"nvml"`` with an engine that is not a ``unix://`` socket). Read where the hub
        places the GPUs (gpu-local, gpu-local-simple, gpu-docker) and by the admin overview;
        gpu-swarm reads its nodes' generic resources instead, gpu-kube its nodes and pods,
        gpu-slurm ``sinfo``. Any other value is refused at hub start.
        """,
    ).tag(config=True)

    static_gpus = StaticGPUList(
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
        prints them). GPUs without ``links`` count as unknown, placed by count only.
        Each ``uuid`` once, each ``index`` once per host; an entry with another key or a bad
        value is refused at hub start, naming the entry's number.""",
    ).tag(config=True)

    gpu_inventory_ttl = Float(
        5.0, help="""Seconds a reading of the GPUs is reused before they are read again: the hub's
        inventory (NVML, the static list, gpu-swarm's nodes) and the cluster's own terms where the
        cluster places (gpu-kube's nodes and pods, gpu-slurm's ``sinfo``/``squeue``). ``0``: read them
        for every use. At least 0."""
    ).tag(config=True)

    simulated_gpus = Bool(
        False,
        help="""Say that the GPUs NVML reports are simulated (the stand-in NVML library, as the runnable
        default uses on a host without GPUs): the spawn form and the admin overview say so. Only read
        with ``gpu_inventory = "nvml"``; it changes nothing else.""",
    ).tag(config=True)

    gpu_hub_id = Unicode(
        "jupyterhub",
        help="""
        This hub's name on what its servers and notebook GPU jobs run in: the label
        ``org.gpuspawner.hub`` on gpu-docker containers and gpu-swarm services; the
        variable ``GPUSPAWNER_HUB`` in gpu-local server processes and in the notebook
        jobs of gpu-local, gpu-docker and gpu-kube, and the names of gpu-local's device
        cgroups, systemd scopes and start records; gpu-slurm jobs' name
        (``jupyterhub-ID-user-server``) and ``--comment`` (``jupyterhub:ID ...``). After
        a restart the hub adopts (or stops, or cancels) only what carries its own id, so
        two hubs may share one Docker engine, host or Slurm cluster if their ids differ.
        gpu-kube's servers do not carry it: their pods are KubeSpawner's, found by name
        in the hub's namespace. Letters, digits, ``.``, ``_`` and ``-``.
        """,
    ).tag(config=True)

    @validate("gpu_hub_id")
    def _check_hub_id(self, proposal):
        value = proposal["value"]
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise TraitError(f"gpu_hub_id must be letters, digits, '.', '_' or '-' (it names labels, cgroup "
                             f"folders and Slurm job comments), not {value!r}")
        return value

    gpu_job_time_limit = Float(
        24 * 3600.0,
        help="""
        The longest a notebook GPU job may run, in seconds (default 24 hours), counted from
        when it starts running (not while it waits for GPUs or in Slurm's queue): a job past
        its time limit is stopped, marked ``timed_out`` and its GPUs freed. A job may ask
        for less (``time_limit`` in its request), never more (HTTP 400 naming
        ``time_limit``). On gpu-slurm it is also the job's ``--time``, or the profile's
        ``slurm`` ``time`` where that is shorter. A finite number of seconds above 0; any
        other value is refused at hub start.
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
        value = proposal["value"]
        if not (isinstance(value, SharedGPUs) and value.checked):  # the configured list: checked once, for
            try:                                                      # every spawner that shares it
                gpus_from_config(value)
            except ValueError as e:
                raise TraitError(f"static_gpus: {e}") from e
            if isinstance(value, SharedGPUs):
                value.checked = True
        return value

    @validate("gpu_job_time_limit")
    def _check_job_time_limit(self, proposal):
        if not 0 < proposal["value"] < float("inf"):
            raise TraitError(f"gpu_job_time_limit must be a finite number of seconds > 0, not {proposal['value']}")
        return proposal["value"]

    @validate("gpu_inventory_ttl")
    def _check_ttl(self, proposal):
        if not proposal["value"] >= 0:
            raise TraitError(f"gpu_inventory_ttl must be >= 0 seconds, not {proposal['value']}")
        return proposal["value"]

    def _load_config(self, cfg: Config, section_names: list[str] | None = None, traits: dict | None = None) -> None:
        share_static_gpus(cfg, section_names or self.section_names())  # before traitlets copies it in
        super()._load_config(cfg, section_names=section_names, traits=traits)

    def state_key(self) -> tuple[str, bool, str, str | None]:
        """What makes two settings objects describe the same GPUs (``static_gpus``: one string, hashed once)."""
        static = gpus_json(self.static_gpus) if self.gpu_inventory == "static" else None
        return (self.gpu_inventory, self.simulated_gpus, self.gpu_hub_id, static)

    gpu_booking_hours_per_week = Float(
        40.0,
        help="""GPU-hours one user (or one group) may book for windows in one week (Monday to Sunday,
        UTC): a booking of 2 GPUs for 3 hours counts 6, a weekly repeating one counts in each of
        its weeks. Administrators are not held to it. At least 0.""",
    ).tag(config=True)

    gpu_booking_max_ahead = Float(30 * 24 * 3600.0, help="""How far ahead, in seconds, a booking's first window
        may start (default 30 days). Administrators are not held to it. At least 0.""").tag(config=True)

    gpu_booking_max_window = Float(12 * 3600.0, help="""The longest one booked window may last, in seconds (default
        12 hours). Administrators are not held to it (a weekly window lasts at most a week). Above 0.""",
                                   ).tag(config=True)

    gpu_booking_grace = Float(
        15 * 60.0,
        help="""Seconds a booked window waits, after it starts, for one of its users to hold GPUs of
        its model; then the window is released (its GPUs go back to everyone; the booking is
        recorded as ``released`` with the time, and a weekly booking's later windows still hold).
        Above 0.""",
    ).tag(config=True)

    @validate("gpu_booking_hours_per_week", "gpu_booking_max_ahead", "gpu_booking_max_window", "gpu_booking_grace")
    def _check_booking_limits(self, proposal):
        value, name = proposal["value"], proposal["trait"].name
        least = 0 if name in ("gpu_booking_hours_per_week", "gpu_booking_max_ahead") else 1
        if not least <= value < float("inf"):
            raise TraitError(f"{name} must be a finite number {'>= 0' if not least else '> 0'}, not {value}")
        return value


def settings_for(config: Config, spawner_class: type | None, kind: type[T] = GPUHubSettings) -> T:
    """The GPU settings (``kind``: a parent of the spawners) ``spawner_class`` gets from ``config``, read by traitlets.

    A settings object whose config sections are the spawner class's own, so that
    ``c.GPUSpawnerMixin.x``, ``c.GPUDockerSpawner.x`` and ``c.Spawner.x`` apply
    with the same priorities as for the spawners. The spawner's other options are
    not settings, so traitlets' "not recognized" warnings are silenced here.
    """
    sections = spawner_class.section_names() if isinstance(spawner_class, type) and issubclass(
        spawner_class, Configurable) else kind.section_names()

    class _AsSpawner(kind):
        @classmethod
        def section_names(cls) -> list[str]:
            return sections

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _AsSpawner(config=config)


class HubState:
    """Everything one hub's spawners and handlers share (see the module docstring)."""

    hub_id: str
    inventory_source: str
    inventory: CachedInventory
    ledger: Ledger
    queue: GPUQueue
    out_of_service: OutOfService
    job_counts: Callable[[], dict[str, int]]
    usage: UsageRecorder
    metrics: HubMetrics
    found: dict[str, tuple[GPU, ...]]
    flights: Flights
    reconcile_locks: dict[str, asyncio.Lock]
    reconcile_interval: float

    def __init__(self, settings: GPUHubSettings) -> None:
        self.hub_id = settings.gpu_hub_id
        if settings.gpu_inventory == "static":
            source: Any = StaticInventory(list(settings.static_gpus))
        else:
            source = NVMLInventory(simulated=settings.simulated_gpus)
        self.inventory_source = settings.gpu_inventory
        self.health = GPUHealth(settings, lambda: self.queue.wake())  # broken GPUs out of placement
        self.inventory = CachedInventory(self.health.watch(source), ttl=settings.gpu_inventory_ttl)
        self.ledger = Ledger()
        self.queue = GPUQueue()
        #: GPUs held because what last held them is not over (processes that would not die)
        self.out_of_service = OutOfService(self.ledger, self.queue.wake)
        #: notebook GPU jobs per state, for the metrics: set by the jobs' manager when the hub makes it
        self.job_counts = dict
        #: usage accounting: every hold and release of the ledger, in the hub's database
        self.usage = UsageRecorder(self.gpu_info)
        self.ledger.observe(self.usage.observe)
        #: this hub's own metrics collector (served while this is the newest hub state)
        self.metrics = HubMetrics(self.inventory, self.ledger, self.queue.__len__, self.usage.gpu_seconds,
                                  lambda: self.job_counts(), self.health.cluster.nodes)
        #: owner -> GPU records the runtime reported (container labels, process environments)
        self.found = {}
        #: what the layers above keep for this hub, by class (see :meth:`cache`)
        self._caches: dict[type, Any] = {}
        self._once: dict[Hashable, asyncio.Future] = {}
        #: owners whose start or stop (or notebook job) is in flight: reconciliation leaves them alone
        self.flights = Flights()
        #: one reconciliation at a time, per spawner class name
        self.reconcile_locks = {}
        #: seconds between reconciliations with the cluster (0: only at start)
        self.reconcile_interval = settings.gpu_reconcile_interval
        self._every: dict[Hashable, Callable[[], Awaitable[None]]] = {}
        self._timers: dict[Hashable, asyncio.TimerHandle | asyncio.Future] = {}

    def cache(self, kind: type[T], make: Callable[[], T] | None = None) -> T:
        """This hub's one ``kind`` object: what a backend or the hub layer keeps beside the ledger.

        Made by ``make()`` (or ``kind()``) on first use, then always the same object; keyed by
        the class, so each layer names its own typed caches (e.g. ``state.cache(KubeCaches)``)
        and this module needs to know none of them.
        """
        found = self._caches.get(kind)
        if found is None:
            found = self._caches[kind] = (make or kind)()
        return found

    def cached(self, kind: type[T]) -> T | None:
        """This hub's ``kind`` object if :meth:`cache` made one, else None (nothing is made)."""
        return self._caches.get(kind)

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

    def close(self) -> None:
        """Stop serving this state's metrics, stop its timers and retrying out-of-service GPUs."""
        _SERVED.stop(self)
        self.out_of_service.close()
        self.health.close()
        timers, self._timers = self._timers, {}
        for timer in timers.values():
            timer.cancel()


class _Served:
    """Which hub state's metrics ``/hub/metrics`` serves: the newest one's (one hub per process in production).

    JupyterHub serves prometheus' default registry; a second hub in the process (tests) takes
    the place of the first there, so that the names and labels never appear twice.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: HubState | None = None

    def serve(self, state: HubState) -> None:
        with self.lock:
            if self.state is not None:
                self.state.metrics.unregister()
            state.metrics.register()
            self.state = state

    def stop(self, state: HubState | None = None) -> None:
        """Stop serving ``state``'s metrics (any state's, without one)."""
        with self.lock:
            if self.state is not None and (state is None or self.state is state):
                self.state.metrics.unregister()
                self.state = None


_SERVED = _Served()


class _HubStates:
    """The registry of hub states: per owner (a JupyterHub app, or a ``Config`` outside a hub), per settings key.

    An owner is found by identity and held weakly: a hub gone takes its states with it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()  # spawners, handlers and threads may ask at once
        self.owners: list[tuple[weakref.ref, dict[tuple, HubState]]] = []

    def of(self, owner: object) -> dict[tuple, HubState]:
        """The states ``owner`` holds (call with ``lock`` held)."""
        self.owners = [(ref, states) for ref, states in self.owners if ref() is not None]
        for ref, states in self.owners:
            if ref() is owner:
                return states
        states: dict[tuple, HubState] = {}
        self.owners.append((weakref.ref(owner), states))
        return states


_STATES = _HubStates()
_APP_STATE = "gpuspawner_hub_state"  # the tornado settings' entry where hub_state_of_app keeps what it found


def hub_state(config: Config, spawner_class: type | None = None,
              settings: GPUHubSettings | None = None, *, app: object | None = None) -> HubState:
    """The hub state of the hub ``app`` (created on first use, then always the same).

    Without ``app`` (a spawner made outside a hub) the owner is ``config`` itself.
    ``settings`` are the caller's own resolved GPU settings (a spawner passes
    itself); otherwise they are read from ``config`` for ``spawner_class``. The
    newest state's metrics are the ones served at ``/hub/metrics``.
    """
    if settings is None:
        settings = settings_for(config, spawner_class)
    key = settings.state_key()
    with _STATES.lock:
        states = _STATES.of(app if app is not None else config)
        state = states.get(key)
        if state is None:
            state = states[key] = HubState(settings)
        else:
            return state
    _SERVED.serve(state)
    return state


def hub_state_of_app(tornado_settings: dict) -> HubState:
    """The hub state of the hub whose tornado ``settings`` these are (what a hub handler holds).

    Found once per hub and kept in its settings: finding it reads the GPU settings from the
    configuration, which takes a quarter of a second for every request with 10,000 ``static_gpus``.
    """
    state = tornado_settings.get(_APP_STATE)
    if state is None:
        state = tornado_settings[_APP_STATE] = hub_state(
            tornado_settings["config"], tornado_settings.get("spawner_class"), app=tornado_settings.get("app"))
    return state


def stop_serving_hub_metrics() -> None:
    """Stop serving any hub state's metrics in this process (tests, between their hubs)."""
    _SERVED.stop()
