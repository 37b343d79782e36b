"""The one safe way gpuspawner talks to NVML.

Every NVML call goes through :func:`query`, which never raises: it returns a
:class:`Reading` holding either a value or a reason a person can read
("NVIDIA driver is not loaded", "not supported by this GPU"). The library is
initialised lazily, once per process (a forked child initialises again), and
never at import time, so a machine without a driver imports this module fine.

:func:`devices` is the one place that lists the host's GPUs (index, handle,
UUID, name; :func:`mig_devices` the same for a GPU's MIG devices): the hub's
inventory, the monitor and the admin overview's live numbers all read it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

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
