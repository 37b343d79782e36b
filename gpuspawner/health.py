"""GPU health: broken GPUs leave placement at once and come back when fixed and confirmed.

A GPU is *out of service* (unhealthy) from the moment the hub learns one of these:

- a critical XID (an NVML event; which XIDs count is :attr:`GPUHealthSettings.gpu_health_ignored_xids`),
- a double-bit (uncorrected) ECC error (an NVML event, or the volatile counter grew),
- row remapping pending (the GPU needs a reset) or failed,
- the GPU fell off the bus (NVML answers "GPU is lost"),
- an administrator took it out (``POST /hub/api/gpus/health/<uuid>`` with ``{"healthy": false}``).

:mod:`gpuspawner.health_nvml` reads NVML (events where the driver gives them, a check of every GPU
every ``gpu_health_poll_interval`` seconds); :class:`HealthTracker` keeps what is out of service,
since when and why; :class:`HealthInventory` marks those GPUs unhealthy in every inventory reading,
so placement, the form, refusals, ``/hub/gpus`` and the metrics all see it. A GPU comes back once its
condition has cleared (the GPU answers and nothing is pending) and an administrator confirms, or by
itself ``gpu_health_auto_return`` seconds after clearing where that is set.

This is not :mod:`gpuspawner.outofservice` (GPUs held because a stopped server's processes linger).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

from traitlets import Float, Int, List, TraitError, validate
from traitlets.config import Configurable

from .gpu import GPU
from .inventory import InventoryReading, InventorySource

log = logging.getLogger("gpuspawner.health")

__all__ = ["GPUHealthSettings", "HealthInventory", "HealthTracker", "Outage", "parse_health_body",
           "xid_reason", "DEFAULT_IGNORED_XIDS"]

#: XIDs NVIDIA's device plugin ignores (application errors, not the GPU's); any other XID is critical
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)

#: what the best-known XIDs mean (NVIDIA's XID catalogue), for the sentences people read
XID_WORDS = {
    48: "double-bit ECC error", 63: "ECC page retirement or row remapping", 64: "row remapping failed",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP timeout", 120: "GSP error",
}

#: the sentences of this part, in one place
WORDS = {
    "xid": "XID {xid} ({what})",
    "xid_plain": "XID {xid}",
    "ecc": "double-bit ECC error ({count} uncorrected since the driver loaded)",
    "remap_pending": "row remapping pending: the GPU needs a reset",
    "remap_failed": "row remapping failed: the GPU needs service",
    "lost": "GPU is lost (fell off the bus or stopped responding)",
    "admin": "taken out by an administrator: {reason}",
    "still": "GPU {uuid} is still unhealthy: {reason}. It can come back once that has cleared.",
    "not_out": "GPU {uuid} is not out of service.",
    "notice": ("The GPU this server uses ({name}, {uuid}) has failed: {reason}. Save your work now; "
               "what runs on it may fail or give wrong results. Stop this server and start it again "
               "to get a healthy GPU."),
}


def xid_reason(xid: int) -> str:
    """``"XID 79 (GPU has fallen off the bus)"``: why a GPU left for an XID."""
    what = XID_WORDS.get(xid)
    return WORDS["xid"].format(xid=xid, what=what) if what else WORDS["xid_plain"].format(xid=xid)


def _check_xids(value, name: str) -> list[int]:
    bad = [x for x in value if type(x) is not int or not 0 <= x < 2**32]
    if bad:
        raise TraitError(f"{name} must be XID numbers (whole numbers 0 to 4294967295), not {bad[0]!r}")
    return sorted(set(value))


class GPUHealthSettings(Configurable):
    """How the hub watches its GPUs' health (gpu-local, gpu-docker: GPUs the hub reads through NVML)."""

    gpu_health_ignored_xids = List(
        Int(), default_value=list(DEFAULT_IGNORED_XIDS),
        help="""XIDs (NVIDIA driver error numbers) that do not take a GPU out of service; any other
        critical XID does. The default is NVIDIA's device plugin's: 13 (graphics engine exception),
        31 (GPU memory page fault), 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video
        processor exception) and 109 (context switch timeout) are errors of one application, not of
        the GPU. Add to the list to ignore more, or empty it to count every XID.""",
    ).tag(config=True)

    gpu_health_poll_interval = Float(
        5.0,
        help="""Seconds between two checks of every GPU's health through NVML (ECC counters, row
        remapping, GPU lost). XIDs arrive as NVML events at once where the driver gives them;
        this check also catches what has no event. Above 0.""",
    ).tag(config=True)

    gpu_health_auto_return = Float(
        0.0,
        help="""Seconds after its condition has cleared that an unhealthy GPU comes back into
        service by itself. 0 (the default): never by itself; an administrator confirms it
        (the button on /hub/gpus, or ``POST /hub/api/gpus/health/<uuid>`` with
        ``{"healthy": true}``). A GPU an administrator took out never comes back by itself.""",
    ).tag(config=True)

    @validate("gpu_health_ignored_xids")
    def _check_ignored_xids(self, proposal):
        return _check_xids(proposal["value"], "gpu_health_ignored_xids")

    @validate("gpu_health_poll_interval", "gpu_health_auto_return")
    def _check_health_seconds(self, proposal):
        value, name = proposal["value"], proposal["trait"].name
        least_ok = value > 0 if name == "gpu_health_poll_interval" else value >= 0
        if not (least_ok and math.isfinite(value)):
            raise TraitError(f"{name} must be a finite number of seconds "
                             f"{'above 0' if name == 'gpu_health_poll_interval' else '>= 0'}, not {value}")
        return value


# ------------------------------------------------------------------ the REST body


#: the most characters of an administrator's reason
REASON_MAX = 200


def parse_health_body(body: bytes | str) -> tuple[bool, str | None]:
    """``POST /hub/api/gpus/health/<uuid>``'s body -> (healthy, reason); ValueError with a sentence.

    ``{"healthy": true}`` brings the GPU back (its condition must have cleared);
    ``{"healthy": false, "reason": "fan noise"}`` takes it out of service.
    """
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ValueError('The body must be JSON: {"healthy": true} or {"healthy": false, "reason": "..."}.') from None
    if not isinstance(data, dict):
        raise ValueError('The body must be a JSON object: {"healthy": true} or {"healthy": false, "reason": "..."}.')
    unknown = sorted(set(data) - {"healthy", "reason"})
    if unknown:
        raise ValueError(f"Unknown field {unknown[0]!r}: the body has \"healthy\" and, to take a GPU out, \"reason\".")
    healthy = data.get("healthy")
    if type(healthy) is not bool:
        raise ValueError('"healthy" must be true (bring the GPU back) or false (take it out of service).')
    reason = data.get("reason")
    if healthy:
        if reason is not None:
            raise ValueError('"reason" goes with {"healthy": false} only.')
        return True, None
    if not isinstance(reason, str) or not reason.strip() or len(reason) > REASON_MAX or not reason.isprintable():
        raise ValueError(f'Taking a GPU out needs a "reason": 1 to {REASON_MAX} printable characters.')
    return False, reason.strip()


# ------------------------------------------------------------------ what is out of service


@dataclass(frozen=True)
class Outage:
    """One GPU out of service: why, since when, and since when its condition has cleared."""

    uuid: str
    reason: str
    since: float  # time.time() when it went out
    cleared: float | None = None  # time.time() since when nothing keeps it out (None: still failing)
    manual: bool = False  # an administrator took it out

    def to_dict(self) -> dict:
        return {"uuid": self.uuid, "reason": self.reason, "since": self.since, "cleared": self.cleared,
                "manual": self.manual}


class HealthTracker:
    """The GPUs out of service for their health, thread-safe (NVML is read in a thread of its own).

    ``changed(went_out, came_back)`` is called (in the caller's thread) after each change.
    """

    def __init__(self, ignored_xids=DEFAULT_IGNORED_XIDS, auto_return: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.ignored = frozenset(ignored_xids)
        self.auto_return = auto_return
        self._clock = clock
        self._lock = threading.Lock()
        self._out: dict[str, Outage] = {}
        self.listeners: list[Callable[[tuple[Outage, ...], tuple[str, ...]], None]] = []

    def _tell(self, went_out: tuple[Outage, ...] = (), came_back: tuple[str, ...] = ()) -> None:
        if went_out or came_back:
            for listener in list(self.listeners):
                try:
                    listener(went_out, came_back)
                except Exception:  # one listener's failure must not stop health tracking
                    log.exception("GPU health listener failed")

    def outages(self) -> dict[str, Outage]:
        with self._lock:
            return dict(self._out)

    def get(self, uuid: str) -> Outage | None:
        with self._lock:
            return self._out.get(uuid)

    def counts(self, xid: int) -> bool:
        """Whether this XID takes a GPU out of service."""
        return xid not in self.ignored

    def xid(self, uuid: str, xid: int) -> Outage | None:
        """An XID event on ``uuid``: out of service unless the XID is ignored (None then)."""
        if not self.counts(xid):
            log.info("GPU %s: XID %s ignored (gpu_health_ignored_xids)", uuid, xid)
            return None
        return self.failed(uuid, xid_reason(xid))

    def failed(self, uuid: str, reason: str, manual: bool = False) -> Outage:
        """An event (XID, ECC error) or an administrator takes ``uuid`` out; an outage already there keeps its
        reason and since, and counts as failing again."""
        with self._lock:
            known = self._out.get(uuid)
            if known is not None:
                self._out[uuid] = replace(known, cleared=None, manual=known.manual or manual)
                return self._out[uuid]
            outage = self._out[uuid] = Outage(uuid, reason, self._clock(), None, manual)
        log.error("GPU %s is out of service: %s", uuid, reason)
        self._tell(went_out=(outage,))
        return outage

    def observe(self, uuid: str, conditions: tuple[str, ...]) -> None:
        """A check of ``uuid``: what keeps it out of service now (empty: nothing; it answers, nothing pending)."""
        if conditions:
            self.failed(uuid, conditions[0])
            return
        with self._lock:
            known = self._out.get(uuid)
            if known is not None and known.cleared is None and not known.manual:
                self._out[uuid] = replace(known, cleared=self._clock())

    def bring_back(self, uuid: str) -> Outage:
        """An administrator confirms ``uuid`` is fit again: KeyError if it is not out, ValueError (a
        sentence) while its condition has not cleared."""
        with self._lock:
            known = self._out.get(uuid)
            if known is None:
                raise KeyError(WORDS["not_out"].format(uuid=uuid))
            if known.cleared is None and not known.manual:
                raise ValueError(WORDS["still"].format(uuid=uuid, reason=known.reason))
            del self._out[uuid]
        log.warning("GPU %s is back in service (was: %s)", uuid, known.reason)
        self._tell(came_back=(uuid,))
        return known

    def return_cleared(self) -> tuple[str, ...]:
        """With ``auto_return``: bring back the GPUs whose condition cleared that long ago."""
        if self.auto_return <= 0:
            return ()
        now = self._clock()
        with self._lock:
            back = tuple(u for u, o in self._out.items()
                         if not o.manual and o.cleared is not None and now - o.cleared >= self.auto_return)
            for uuid in back:
                del self._out[uuid]
        for uuid in back:
            log.warning("GPU %s is back in service by itself (gpu_health_auto_return)", uuid)
        self._tell(came_back=back)
        return back

    def restore(self, outages: list[Outage]) -> None:
        """What a previous run of the hub had out of service (its saved state)."""
        with self._lock:
            for outage in outages:
                self._out.setdefault(outage.uuid, outage)


class HealthInventory:
    """An inventory source whose readings mark the GPUs out of service unhealthy.

    A GPU that fell off the bus may vanish from NVML's listing (no handle, no UUID): it is kept in
    the reading, unhealthy, as it was last seen, so that the form and ``/hub/gpus`` still count it.
    """

    def __init__(self, source: InventorySource, tracker: HealthTracker) -> None:
        self.source = source
        self.tracker = tracker
        self._seen: dict[str, GPU] = {}  # every GPU as last read (one NVML no longer names is kept)
        self._last: InventoryReading | None = None

    def read(self) -> InventoryReading:
        reading = self.source.read()
        if reading is not self._last:  # a static list answers the same reading every time: 10,000 GPUs
            self._last = reading
            self._seen.update((gpu.uuid, gpu) for gpu in reading.gpus)
        outages = self.tracker.outages()
        if not outages:
            return reading
        present = {g.uuid for g in reading.gpus}
        gpus = [_marked(g, outages.get(g.uuid)) for g in reading.gpus]
        gpus += [_marked(self._seen[u], o) for u, o in outages.items() if u not in present and u in self._seen]
        return InventoryReading(tuple(gpus), reading.problems, reading.simulated)

    def __getattr__(self, name):  # the source's own helpers (an NVML inventory's host, topology)
        return getattr(self.source, name)


def _marked(gpu: GPU, outage: Outage | None) -> GPU:
    return gpu if outage is None else replace(gpu, healthy=False, reason=outage.reason)


# ------------------------------------------------------------------ one hub's health watch


def health_settings(settings: Configurable) -> GPUHealthSettings:
    """The health settings of the hub whose GPU settings (a spawner, or the hub's settings object) these are,
    read from the same configuration sections (``c.GPUSpawnerMixin.gpu_health_*``, the spawner class's own)."""
    if isinstance(settings, GPUHealthSettings):
        return settings
    sections = type(settings).section_names()

    class _Same(GPUHealthSettings):
        @classmethod
        def section_names(cls) -> list[str]:
            return [*sections, "GPUHealthSettings"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the spawner's other options are not health settings
        return _Same(config=settings.config)
