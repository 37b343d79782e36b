"""The one safe way gpuspawner talks to NVML.

Every NVML call goes through :func:`query`, which never raises: it returns a
:class:`Reading` holding either a value or a reason a person can read
("NVIDIA driver is not loaded", "not supported by this GPU"). The library is
initialised lazily, once per process (a forked child initialises again), and
never at import time, so a machine without a driver imports this module fine.

:func:`devices` is the one place that lists the host's GPUs (index, handle,
UUID, name; :func:`mig_devices` the same for a GPU's MIG devices): the hub's
inventory, the monitor and the admin overview's live numbers all read it.
:func:`topology` reads how those GPUs are connected (for placement and the
monitor's link matrix).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from .topology import NVML_LEVEL_WORDS

try:  # nvidia-ml-py is a dependency, but a broken install must not crash the hub
    import pynvml
except ImportError:  # pragma: no cover - exercised only on broken installs
    pynvml = None


class Reading(NamedTuple):
    """A value read from NVML, or None and the reason it could not be read."""

    value: Any
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


# Plain words for the NVML errors a person is likely to meet.
_REASONS = {
    "NVMLError_LibraryNotFound": "NVIDIA driver library (libnvidia-ml.so.1) not found",
    "NVMLError_DriverNotLoaded": "NVIDIA driver is not loaded",
    "NVMLError_GpuIsLost": "GPU is lost (fell off the bus or stopped responding)",
    "NVMLError_NotSupported": "not supported by this GPU or driver",
    "NVMLError_NoPermission": "no permission to read this from the driver",
    "NVMLError_FunctionNotFound": "not available in this driver version",
    "NVMLError_Uninitialized": "NVML is not initialised",
    "NVMLError_LibRmVersionMismatch": "driver library and kernel module versions differ; reboot or reload the driver",
    "NVMLError_ResetRequired": "GPU needs a reset",
    "NVMLError_Timeout": "the driver timed out",
    "NVMLError_NotFound": "not found",
    "NVMLError_ArgumentVersionMismatch": "this driver does not know the version of the call",
}


#: A GPU NVML counts but whose handle it refuses with NO_PERMISSION: this process may not
#: open the GPU's device node. nvml.h says nvmlDeviceGetCount_v2 counts such GPUs and
#: nvmlDeviceGetHandleByIndex_v2 answers NO_PERMISSION for them; a device cgroup (gpu-local's
#: fence, Slurm's ConstrainDevices) makes other users' GPUs so.
DENIED = "this process may not open this GPU (its device node is fenced off)"
NOT_SUPPORTED = _REASONS["NVMLError_NotSupported"]
LOST = _REASONS["NVMLError_GpuIsLost"]
TIMEOUT = _REASONS["NVMLError_Timeout"]


def reason_for(error: BaseException) -> str:
    """A short sentence describing an NVML error."""
    name = type(error).__name__
    if name in _REASONS:
        return _REASONS[name]
    return f"NVML error: {error}"


class _Session:
    """Per-process NVML initialisation state."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.reason: str | None = None
        self.memory_v1_only = False  # this process's NVML lacks nvmlDeviceGetMemoryInfo_v2

    def ensure(self) -> str | None:
        """Initialise NVML in this process if needed; return why it failed, or None."""
        with self.lock:
            if self.pid == os.getpid():
                return self.reason
            self.pid = os.getpid()
            self.memory_v1_only = False
            if pynvml is None:
                self.reason = "the nvidia-ml-py package is not installed"
                return self.reason
            try:
                pynvml.nvmlInit()
                self.reason = None
            except pynvml.NVMLError as e:
                self.reason = reason_for(e)
            except OSError as e:  # a broken library file
                self.reason = f"NVIDIA driver library could not be loaded: {e}"
            return self.reason

    def reset(self) -> None:
        """Forget the state so the next call initialises again (tests, driver reloads)."""
        with self.lock:
            if self.pid == os.getpid() and self.reason is None and pynvml is not None:
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass
            self.pid = None
            self.reason = None
            self.memory_v1_only = False


_session = _Session()


def init_reason() -> str | None:
    """None when NVML works in this process, otherwise why not."""
    return _session.ensure()


def reset() -> None:
    """Shut NVML down in this process; the next query initialises it again."""
    _session.reset()


def query(func: Callable[..., Any] | str, *args: Any) -> Reading:
    """Call one NVML function; turn every failure into a reason.

    ``func`` is a pynvml function or its name (``"nvmlDeviceGetName"``).
    Bytes results are decoded to text.
    """
    reason = _session.ensure()
    if reason is not None:
        return Reading(None, reason)
    if isinstance(func, str):
        func = getattr(pynvml, func, None)
        if func is None:
            return Reading(None, "not available in this nvidia-ml-py version")
    try:
        value = func(*args)
    except pynvml.NVMLError as e:
        return Reading(None, reason_for(e))
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return Reading(value)


class Memory(NamedTuple):
    """A device's memory in bytes, as nvidia-smi reports it.

    ``used`` is what processes allocated; ``reserved`` what the driver keeps
    for itself (firmware, page tables). None: the driver has only the v1 call,
    whose ``used`` includes the reserved memory.
    """

    total: int
    used: int
    free: int
    reserved: int | None


MEMORY_V1_ONLY = ("not reported by this driver: it has only the v1 memory call, "
                  "whose used memory includes the memory the driver reserves")


def _memory_v2(handle: Any) -> Any:
    return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)


def memory_info(handle: Any) -> Reading:
    """A device's (or MIG device's) :class:`Memory`, read as nvidia-smi, nvitop and gpustat read it.

    Uses ``nvmlDeviceGetMemoryInfo_v2`` (``used`` excludes reserved memory; drivers
    >= 510). Where the driver or nvidia-ml-py lacks it, falls back to the v1 call
    (``reserved`` is then None, ``used`` includes it: see :data:`MEMORY_V1_ONLY`).
    """
    if pynvml is not None and hasattr(pynvml, "nvmlMemory_v2") and not _session.memory_v1_only:
        v2 = query(_memory_v2, handle)
        if v2.ok:
            m = v2.value
            return Reading(Memory(m.total, m.used, m.free, m.reserved))
        if v2.reason not in (_REASONS["NVMLError_FunctionNotFound"], _REASONS["NVMLError_ArgumentVersionMismatch"]):
            return v2
        _session.memory_v1_only = True
    v1 = query("nvmlDeviceGetMemoryInfo", handle)
    if not v1.ok:
        return v1
    return Reading(Memory(v1.value.total, v1.value.used, v1.value.free, None))


class Device(NamedTuple):
    """One GPU (or MIG device) as NVML lists it.

    ``index`` is its NVML index (for a MIG device: its slot on the parent GPU).
    Without a handle, ``uuid`` and ``name`` carry the handle's reason.
    """

    index: int
    handle: Reading
    uuid: Reading
    name: Reading


class Devices(NamedTuple):
    """Every GPU NVML lists on this host, or why they could not be listed."""

    devices: tuple[Device, ...] = ()
    reason: str | None = None  # NVML could not start, or could not count the GPUs
    started: bool = True  # False: NVML itself could not start (no library, no driver)
    driver_version: str | None = None  # "550.54.15"
    cuda_driver_version: int | None = None  # 12040 means CUDA 12.4


def _device(index: int, handle: Reading) -> Device:
    if handle.reason == _REASONS["NVMLError_NoPermission"]:
        handle = Reading(None, DENIED)
    if not handle.ok:
        missing = Reading(None, handle.reason)
        return Device(index, handle, missing, missing)
    return Device(index, handle, query("nvmlDeviceGetUUID", handle.value), query("nvmlDeviceGetName", handle.value))


def devices() -> Devices:
    """List this host's GPUs in NVML order: the one place gpuspawner enumerates them.

    Never raises: a GPU whose handle cannot be read is still listed, with the
    reason in its readings, so callers decide whether to skip or show it.
    """
    reason = init_reason()
    if reason is not None:
        return Devices(reason=reason, started=False)
    count = query("nvmlDeviceGetCount")
    if not count.ok:
        return Devices(reason=count.reason or "unknown NVML error")
    driver = query("nvmlSystemGetDriverVersion").value
    cuda = query("nvmlSystemGetCudaDriverVersion").value
    listed = tuple(_device(index, query("nvmlDeviceGetHandleByIndex", index)) for index in range(count.value))
    return Devices(listed, None, True, driver, cuda)


def mig_devices(parent: Any) -> tuple[Device, ...]:
    """The MIG devices of a GPU in MIG mode (by its handle), empty slots left out."""
    slots = query("nvmlDeviceGetMaxMigDeviceCount", parent)
    found = []
    for slot in range(slots.value or 0):
        handle = query("nvmlDeviceGetMigDeviceHandleByIndex", parent, slot)
        if handle.ok:  # NOT_FOUND: an empty slot
            found.append(_device(slot, handle))
    return tuple(found)


# ---------------------------------------------------------------- topology --

#: CPU and NUMA-node bitmask words read (64 each): up to 1024 CPUs.
_MASK_WORDS = 16
_NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS; a link past the GPU's count is INVALID_ARGUMENT


class Topology(NamedTuple):
    """Where one GPU sits: see :mod:`gpuspawner.topology` for the words.

    ``links``: (peer NVML index, level word) for every other GPU listed;
    ``nvlink``: NVLink links per peer index (active links to a GPU, or, through
    NVSwitches, the links both GPUs have to switches); ``cpus``/``numa_node``:
    the GPU's NUMA-local CPUs and node (None: NVML does not say).
    """

    pci_bus_id: str | None
    numa_node: int | None
    cpus: tuple[int, ...] | None
    links: tuple[tuple[int, str], ...]
    nvlink: tuple[tuple[int, int], ...] = ()
    active_links: tuple[int, ...] = ()  # the GPU's active NVLink links (for their throughput counters)


def _bits(words: Any) -> tuple[int, ...]:
    return tuple(64 * w + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1)


def _nvlink_ends(handle: Any) -> tuple[dict[str, int], int, tuple[int, ...]]:
    """Bus id of each GPU at the end of an active link -> links; links to NVSwitches; the active links."""
    peers: dict[str, int] = {}
    switches = 0
    active: list[int] = []
    for link in range(_NVLINK_MAX_LINKS):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
        except pynvml.NVMLError_InvalidArgument:
            break  # past the GPU's last link
        active.append(link)
        kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switches += 1
        elif kind == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
            bus = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
            bus = (bus.decode() if isinstance(bus, bytes) else bus).upper()
            peers[bus] = peers.get(bus, 0) + 1
    return peers, switches, tuple(active)


def topology(listing: Devices) -> dict[int, Topology]:
    """How the GPUs of ``listing`` (from :func:`devices`) are connected, by NVML index.

    Never raises: what NVML cannot say is left unknown (None, or no entry for a
    pair). GPUs without a handle are left out. About 40 NVML calls per GPU:
    read it once per host and keep it (the inventory does).
    """
    handles = {d.index: d.handle.value for d in listing.devices if d.handle.ok}
    bus: dict[int, str | None] = {}
    ends: dict[int, tuple[dict[str, int], int, tuple[int, ...]]] = {}
    numa: dict[int, int | None] = {}
    cpus: dict[int, tuple[int, ...] | None] = {}
    for index, h in handles.items():
        pci = query("nvmlDeviceGetPciInfo", h)
        busid = pci.value.busId if pci.ok else None
        bus[index] = (busid.decode() if isinstance(busid, bytes) else busid or "").upper() or None
        nv = query(_nvlink_ends, h)
        ends[index] = nv.value if nv.ok else ({}, 0, ())
        scope = getattr(pynvml, "NVML_AFFINITY_SCOPE_NODE", 0)
        nodes = query("nvmlDeviceGetMemoryAffinity", h, 1, scope)
        node_bits = _bits(nodes.value) if nodes.ok else ()
        numa[index] = node_bits[0] if len(node_bits) == 1 else None  # several: the platform does not say
        affinity = query("nvmlDeviceGetCpuAffinity", h, _MASK_WORDS)
        cpus[index] = _bits(affinity.value) if affinity.ok and any(affinity.value) else None
    by_bus = {b: i for i, b in bus.items() if b}
    result: dict[int, Topology] = {}
    for index, h in handles.items():
        peers, switches, active = ends[index]
        nvlink: dict[int, int] = {by_bus[b]: n for b, n in peers.items() if b in by_bus}
        links: list[tuple[int, str]] = []
        for other, oh in handles.items():
            if other == index:
                continue
            if switches and ends[other][1]:
                nvlink[other] = nvlink.get(other, 0) + min(switches, ends[other][1])
            if nvlink.get(other):
                links.append((other, f"NV{nvlink[other]}"))
                continue
            level = query("nvmlDeviceGetTopologyCommonAncestor", h, oh)
            word = NVML_LEVEL_WORDS.get(level.value) if level.ok else None
            if word:
                links.append((other, word))
        result[index] = Topology(
            bus[index], numa[index], cpus[index], tuple(links), tuple(sorted(nvlink.items())), active
        )
    return result


def _nvlink_data(handle: Any, links: tuple[int, ...]) -> tuple[int, int]:
    fields = [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link) for link in links]
    fields += [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) for link in links]
    values = pynvml.nvmlDeviceGetFieldValues(handle, fields)
    failed = [v.nvmlReturn for v in values if v.nvmlReturn != pynvml.NVML_SUCCESS]
    if failed:
        raise pynvml.NVMLError(failed[0])
    n = len(links)
    return sum(v.value.ullVal for v in values[:n]), sum(v.value.ullVal for v in values[n:])


def nvlink_data(handle: Any, links: tuple[int, ...]) -> Reading:
    """(sent, received) KiB over ``links`` since the driver started counting (NVLink data counters)."""
    if not links:
        return Reading(None, NOT_SUPPORTED)
    return query(_nvlink_data, handle, links)
