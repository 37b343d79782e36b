"""The one safe way gpuspawner talks to NVML.

Every NVML call goes through :func:`query`, which never raises: it returns a
:class:`Reading` holding either a value or a reason a person can read
("NVIDIA driver is not loaded", "not supported by this GPU"). The library is
initialised lazily, once per process (a forked child initialises again), and
never at import time, so a machine without a driver imports this module fine.
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
}


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

    def ensure(self) -> str | None:
        """Initialise NVML in this process if needed; return why it failed, or None."""
        with self.lock:
            if self.pid == os.getpid():
                return self.reason
            self.pid = os.getpid()
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
