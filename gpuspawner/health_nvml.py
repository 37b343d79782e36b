"""Reading GPU health from NVML, in a thread of its own (:class:`NVMLHealthWatcher`), and one hub's
GPU health put together (:class:`GPUHealth`: the tracker, the inventory that shows it, the watcher).

Two ways, as NVIDIA's device plugin and DCGM do:

- **events**: one NVML event set with every GPU registered for critical XIDs and double-bit ECC
  errors (``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``, ``nvmlEventSetWait_v2``): an XID
  reaches the :class:`~gpuspawner.health.HealthTracker` as soon as the driver reports it;
- **checks**: every ``interval`` seconds each GPU's volatile uncorrected ECC count
  (``nvmlDeviceGetTotalEccErrors``), its row remapping (``nvmlDeviceGetRemappedRows``: pending or
  failed) and whether it answers at all (``GPU is lost``). A driver without events (or a GPU that
  does not support them) is checked only so.

Every call goes through :func:`gpuspawner.nvml.query`, so nothing here raises for NVML's sake.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from traitlets.config import Configurable

from . import nvml
from .health import WORDS, HealthInventory, HealthTracker, health_settings
from .inventory import InventorySource, NVMLInventory

log = logging.getLogger("gpuspawner.health")

_LOST = nvml.LOST
_WAIT_MS = 1000  # the longest one event wait, so that stopping is quick


def _const(name: str, default: int) -> int:
    return getattr(nvml.pynvml, name, default) if nvml.pynvml is not None else default


XID_EVENT = _const("nvmlEventTypeXidCriticalError", 0x8)
ECC_EVENT = _const("nvmlEventTypeDoubleBitEccError", 0x2)


def conditions(handle: Any, ecc_before: int | None) -> tuple[tuple[str, ...], int | None]:
    """What keeps one GPU out of service now, and its uncorrected ECC count (None: not readable).

    ``ecc_before``: the count at the last check (None at the first: any error since the driver
    loaded counts).
    """
    found: list[str] = []
    ecc = nvml.query("nvmlDeviceGetTotalEccErrors", handle, _const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                     _const("NVML_VOLATILE_ECC", 0))
    count = ecc.value if ecc.ok else None
    if ecc.reason == _LOST:
        return (WORDS["lost"],), ecc_before
    if count is not None and count > (ecc_before or 0):
        found.append(WORDS["ecc"].format(count=count))
    rows = nvml.query("nvmlDeviceGetRemappedRows", handle)
    if rows.reason == _LOST:
        return (WORDS["lost"],), count
    if rows.ok:
        _corr, _unc, pending, failure = rows.value
        if failure:
            found.append(WORDS["remap_failed"])
        elif pending:
            found.append(WORDS["remap_pending"])
    return tuple(found), count


class NVMLHealthWatcher:
    """Watches this host's GPUs through NVML and tells ``tracker``; ``start()`` / ``stop()``."""

    def __init__(self, tracker: HealthTracker, interval: float = 5.0) -> None:
        self.tracker = tracker
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._uuids: dict[int, str] = {}  # NVML index -> UUID, as last seen (a lost GPU has none)
        self._ecc: dict[str, int | None] = {}
        self._events: Any = None  # the NVML event set, or None (no events: checks only)
        self._registered: set[str] = set()
        self.checks = 0  # how many checks ran (tests wait on it)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpuspawner-health", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._events is not None:
            nvml.query("nvmlEventSetFree", self._events)
            self._events = None

    def _run(self) -> None:
        due = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= due:
                try:
                    self.check()
                except Exception:  # never let the thread die: the next check may do better
                    log.exception("checking GPU health failed")
                due = now + self.interval
            left_ms = max(1, min(_WAIT_MS, int((due - time.monotonic()) * 1000)))
            if self._events is not None and self._registered:
                self._wait(left_ms)
            else:
                self._stop.wait(left_ms / 1000)

    def check(self) -> None:
        """One check of every GPU (and registration of new ones for events)."""
        listing = nvml.devices()
        if listing.reason is not None:
            return
        for device in listing.devices:
            uuid = device.uuid.value if device.uuid.ok else self._uuids.get(device.index)
            if uuid is None:
                continue
            if not device.uuid.ok:  # no handle or no UUID
                if device.uuid.reason == _LOST:
                    self.tracker.observe(uuid, (WORDS["lost"],))
                continue
            self._uuids[device.index] = uuid
            found, self._ecc[uuid] = conditions(device.handle.value, self._ecc.get(uuid))
            self.tracker.observe(uuid, found)
            if uuid not in self._registered:
                self._register(uuid, device.handle.value)
        self.tracker.return_cleared()
        self.checks += 1

    def _register(self, uuid: str, handle: Any) -> None:
        if self._events is None:
            created = nvml.query("nvmlEventSetCreate")
            if not created.ok:
                self._registered.add(uuid)  # no events on this driver: checks only
                return
            self._events = created.value
        supported = nvml.query("nvmlDeviceGetSupportedEventTypes", handle)
        mask = (supported.value or 0) & (XID_EVENT | ECC_EVENT)
        if mask:
            done = nvml.query("nvmlDeviceRegisterEvents", handle, mask, self._events)
            if not done.ok:
                log.info("GPU %s: no health events (%s); checked every %g s", uuid, done.reason, self.interval)
        self._registered.add(uuid)

    def _wait(self, ms: int) -> None:
        got = nvml.query("nvmlEventSetWait_v2", self._events, ms)
        if not got.ok:
            if got.reason != nvml.TIMEOUT:
                self._stop.wait(ms / 1000)  # an error that is not a timeout: do not spin
            return
        data = got.value
        uuid = nvml.query("nvmlDeviceGetUUID", data.device)
        if not uuid.ok:
            return  # the GPU went away meanwhile: the next check says so
        if data.eventType & XID_EVENT:
            self.tracker.xid(uuid.value, int(data.eventData))
        elif data.eventType & ECC_EVENT:
            count = nvml.query("nvmlDeviceGetTotalEccErrors", data.device,
                               _const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), _const("NVML_VOLATILE_ECC", 0))
            self._ecc[uuid.value] = count.value if count.ok else self._ecc.get(uuid.value)
            self.tracker.failed(uuid.value, WORDS["ecc"].format(count=count.value if count.ok else "some"))


class GPUHealth:
    """One hub's GPU health: its tracker, the inventory that shows it, and (NVML hosts) the watcher.

    ``wake``: told when a GPU comes back (the queue). :meth:`start` (on the hub's event loop, once
    the hub is up) watches NVML where the inventory reads it.
    """

    def __init__(self, settings: Configurable, wake: Callable[[], None] = lambda: None) -> None:
        found = health_settings(settings)
        self.tracker = HealthTracker(found.gpu_health_ignored_xids, found.gpu_health_auto_return)
        self.interval = found.gpu_health_poll_interval
        self._wake = wake
        self.watcher = None
        self.source: InventorySource | None = None

    def watch(self, source: InventorySource) -> HealthInventory:
        """``source``, its readings marked with what is out of service."""
        self.source = source
        return HealthInventory(source, self.tracker)

    def start(self, loop, refresh: Callable[[], None]) -> None:
        """Watch NVML (an NVML inventory) and call ``refresh`` on ``loop`` after every change."""
        def changed(went_out, came_back) -> None:
            loop.call_soon_threadsafe(refresh)
            if came_back:
                loop.call_soon_threadsafe(self._wake)

        if changed not in self.tracker.listeners and not self.tracker.listeners:
            self.tracker.listeners.append(changed)
        if self.watcher is None and isinstance(self.source, NVMLInventory):
            self.watcher = NVMLHealthWatcher(self.tracker, self.interval)
            self.watcher.start()

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
