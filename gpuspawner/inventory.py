"""Where GPUs come from: NVML on this host, or a static list in configuration.

An inventory source has one job: ``read()`` returns an :class:`InventoryReading`
(the GPUs, healthy or not, and the problems met while reading). Reading may be
slow (NVML, an API), so the hub reads through :class:`CachedInventory`, which
runs the read in a worker thread and keeps the result for a few seconds.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from . import nvml
from .gpu import GPU, GPUs, gpu_from_record


@dataclass(frozen=True)
class InventoryReading:
    gpus: tuple[GPU, ...] = ()  # kept as a :class:`~gpuspawner.gpu.GPUs`, which holds what is derived from them
    problems: tuple[str, ...] = ()  # e.g. "NVML: NVIDIA driver is not loaded"
    simulated: bool = False

    def __post_init__(self) -> None:
        if type(self.gpus) is not GPUs:
            object.__setattr__(self, "gpus", GPUs(self.gpus))

    @functools.cached_property
    def healthy(self) -> GPUs:
        return GPUs(g for g in self.gpus if g.healthy)

    @functools.cached_property
    def models(self) -> frozenset[str]:
        """The model slugs of these GPUs, found at the first ask (10,000 GPUs: 3 ms each time otherwise)."""
        return frozenset(g.model for g in self.gpus)


class InventorySource(Protocol):
    def read(self) -> InventoryReading: ...


def _tuple_or_none(value):
    return tuple(value) if value is not None else None


@dataclass
class NVMLInventory:
    """The GPUs of the host this process runs on, read through NVML."""

    host: str = field(default_factory=socket.gethostname)
    simulated: bool = False
    # The host's topology (nvml.topology), read once per set of GPUs: (index, UUID) pairs -> topology.
    _topology: tuple[tuple, dict[int, nvml.Topology]] = field(default=((), {}), init=False, repr=False)

    def topology(self, listing: nvml.Devices) -> dict[int, nvml.Topology]:
        """The topology of ``listing``'s GPUs, read through NVML only when the GPUs changed."""
        key = tuple((d.index, d.uuid.value) for d in listing.devices)
        if key != self._topology[0]:
            self._topology = (key, nvml.topology(listing))
        return self._topology[1]

    def read(self) -> InventoryReading:
        listing = nvml.devices()
        if listing.reason is not None:
            return InventoryReading(problems=(f"NVML: {listing.reason}",), simulated=self.simulated)
        gpus, problems = [], []
        topology = self.topology(listing)
        for device in listing.devices:
            gpu, problem = self._read_device(device, listing, topology.get(device.index))
            if gpu is not None:
                gpus.append(gpu)
            if problem:
                problems.append(problem)
        return InventoryReading(tuple(gpus), tuple(problems), self.simulated)

    def _read_device(
        self, device: nvml.Device, listing: nvml.Devices, topology: nvml.Topology | None
    ) -> tuple[GPU | None, str | None]:
        index, name = device.index, device.name
        if not device.uuid.ok:
            # Without a handle or a UUID the GPU cannot be named, so not placed.
            return None, f"GPU {index} on {self.host}: {device.uuid.reason}"
        h = device.handle.value
        memory = nvml.query("nvmlDeviceGetMemoryInfo", h)
        cc = nvml.query("nvmlDeviceGetCudaComputeCapability", h)
        mig = nvml.query("nvmlDeviceGetMigMode", h)
        minor = nvml.query("nvmlDeviceGetMinorNumber", h)
        # A GPU that answers its UUID but fails basic reads is not fit to hand out.
        lost = [r.reason for r in (name, memory) if not r.ok and "lost" in (r.reason or "")]
        gpu = GPU(
            host=self.host,
            index=index,
            uuid=device.uuid.value,
            name=name.value or "Unknown GPU",
            memory_total=memory.value.total if memory.ok else None,
            compute_capability=_tuple_or_none(cc.value),
            driver_version=listing.driver_version,
            cuda_driver_version=listing.cuda_driver_version,
            mig_mode=bool(mig.value[0]) if mig.ok else None,
            minor_number=minor.value if minor.ok else None,
            numa_node=topology.numa_node if topology else None,
            cpus=topology.cpus if topology else None,
            links=topology.links if topology else (),
            healthy=not lost,
            reason=lost[0] if lost else None,
        )
        problem = f"GPU {index} on {self.host}: {gpu.reason}" if lost else None
        return gpu, problem


@dataclass
class StaticInventory:
    """GPUs declared in configuration, for a hub that cannot run NVML on the GPU host.

    Each entry is a dict with at least ``uuid`` and ``name``; ``host`` defaults
    to ``"localhost"`` and ``index`` to one more than the highest index on its host so far.
    The topology of a remote host may be described with ``numa_node``, ``cpus``
    (``"0-15"``) and ``links`` (``{other index: "NV4" | "PIX" | ... | "SYS"}``).
    """

    entries: Iterable[dict] = ()
    _reading: InventoryReading | None = field(default=None, init=False, repr=False, compare=False)

    def read(self) -> InventoryReading:
        """The configured GPUs: checked and made into records at the first read, then the same reading
        (configuration does not change while the hub runs; 10,000 entries take 0.15 s to check)."""
        if self._reading is None:
            self._reading = InventoryReading(tuple(gpus_from_config(self.entries)))
        return self._reading


_GPU_KEYS = set(GPU.__dataclass_fields__)


def gpus_from_config(entries: Iterable[dict]) -> list[GPU]:
    """Turn configuration dicts into GPU records; raise ValueError naming a bad entry."""
    gpus: list[GPU] = []
    per_host: dict[str, int] = {}
    seen: set[str] = set()
    used: set[tuple[str, int]] = set()
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"static GPU entry {n} must be a dict, not {type(entry).__name__}")
        unknown = set(entry) - _GPU_KEYS
        if unknown:
            raise ValueError(f"static GPU entry {n} has unknown keys: {', '.join(sorted(unknown))}")
        for key in ("uuid", "name"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ValueError(f"static GPU entry {n} needs a '{key}' string")
        if entry["uuid"] in seen:
            raise ValueError(f"static GPU entry {n} repeats uuid {entry['uuid']}")
        seen.add(entry["uuid"])
        host = entry.get("host", "localhost")
        if not isinstance(host, str) or not host:
            raise ValueError(f"static GPU entry {n}: 'host' must be a host name")
        index = entry.get("index", per_host.get(host, 0))
        if type(index) is not int or index < 0:
            raise ValueError(f"static GPU entry {n}: 'index' must be a whole number >= 0, not {index!r}")
        if (host, index) in used:
            raise ValueError(f"static GPU entry {n} repeats index {index} on host {host}")
        used.add((host, index))
        per_host[host] = max(per_host.get(host, 0), index + 1)
        try:
            gpus.append(gpu_from_record(dict(entry, host=host, index=index)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"static GPU entry {n}: {e}") from None
    return gpus


class CachedInventory:
    """Reads a source off the event loop and keeps the reading for ``ttl`` seconds.

    Concurrent callers share one read in flight.
    """

    def __init__(self, source: InventorySource, ttl: float = 5.0) -> None:
        self.source = source
        self.ttl = ttl
        self._reading: InventoryReading | None = None
        self._at = 0.0
        self._lock = threading.Lock()
        self._pending: asyncio.Future | None = None

    def read_now(self) -> InventoryReading:
        """A blocking, cached read (for threads and tests, never the event loop)."""
        with self._lock:
            if self._reading is None or time.monotonic() - self._at > self.ttl:
                self._reading = self.source.read()
                self._at = time.monotonic()
            return self._reading

    async def read(self) -> InventoryReading:
        if self._reading is not None and time.monotonic() - self._at <= self.ttl:
            return self._reading
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(asyncio.to_thread(self.read_now))
        return await asyncio.shield(self._pending)

    def last_reading(self) -> InventoryReading | None:
        """The newest reading, however old, without reading again (for metrics); None before the first."""
        return self._reading

    def expire(self) -> None:
        """Read again at the next ask; meanwhile :meth:`last_reading` keeps the last one (the metrics)."""
        self._at = float("-inf")

    def invalidate(self) -> None:
        with self._lock:
            self._reading = None
