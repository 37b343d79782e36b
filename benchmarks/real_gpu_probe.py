"""What gpuspawner reads through NVML on this host, as JSON: the real driver, or the stand-in as one H100.

Run it on a GPU host to record how the real driver answers; run it with ``--standin`` to get the
same record from the stand-in ``libnvidia-ml.so.1`` (tests/fakenvml). tests/fakenvml/recorded/
keeps real recordings and tests/unit/test_fakenvml_fidelity.py holds the stand-in to them::

    scripts/bench real_gpu_probe --out h100.json                # the real driver (GPU 0 under load)
    scripts/bench real_gpu_probe --standin --like tests/fakenvml/recorded/h100.json \
        --out standin.json                                              # the stand-in as that host, same code
    scripts/bench real_gpu_probe --sections nvml,gpuspawner     # only some sections

It needs gpuspawner's own dependencies for NVML (nvidia-ml-py), PyTorch for the load on a real
GPU, and jupyter_server, ipykernel and prometheus-client for the ``server`` section; on a GPU
machine that lacks some, install their wheels with ``pip install --no-deps --target DIR`` and put
DIR on PYTHONPATH (the H100 recording was made so: Python 3.12, the wheels of the project's
versions). With ``scripts/bench real_gpu_probe``, gpuspawner and the tests' helpers (fakenvml,
jupyter_server_proc) are importable (the project's .venv, the helpers on its path); with another
Python, run it from the repository root with ``PYTHONPATH=.:tests:tests/integration:DIR``. A
section whose needs are missing records its ImportError; the others still run.

Sections (a section that fails records its error and the others still run; the file is
rewritten after each one, so a run cut short keeps what it had):

- ``meta``: when and where, the versions (driver, NVML, CUDA, nvidia-ml-py, PyTorch), nvidia-smi's view;
- ``nvml``: every NVML function the stand-in exports, called through nvidia-ml-py on GPU 0 with the
  arguments gpuspawner and the monitoring tools use: the value (ctypes structures as dicts) or the
  NVMLError's class name, and the call's time; ``nvml_errors``: the argument errors, the calls before
  ``nvmlInit`` and the reference counting that the stand-in's tests claim (in a fresh process);
  ``nvml_extra``: a few functions the stand-in does not export, for reference;
- ``cuda_visible_devices`` (real driver only): for each CUDA_VISIBLE_DEVICES value, the GPUs CUDA
  itself enumerates (libcuda, a fresh process each) beside the monitor's decision
  (``gpuspawner.monitor.visibility``);
- ``gpuspawner``: ``nvml.devices()``, the NVML inventory, ``nvml.topology()``, the monitor's reading
  of a server given GPU 0 by UUID (as gpu-local gives it), and the time of sampler rounds;
- ``load``: a worker started as gpu-local starts a server (CUDA_VISIBLE_DEVICES and
  NVIDIA_VISIBLE_DEVICES = GPU 0's UUID) — on a real GPU PyTorch allocating ``--load-gib`` GiB and
  multiplying bf16 matrices; under the stand-in a sleeping process the device file lists — and the
  monitor's samples meanwhile, its processes attributed to a "kernel" (this probe, the worker's parent);
- ``server``: a real jupyter_server with the monitor, a notebook kernel running the same load, then
  ``api/gpus``, two ``api/gpus/stream`` events and ``api/gpus/metrics`` (needs jupyter_server and
  ipykernel in this Python).

Nothing is asserted here: the probe records. It changes no GPU setting (no clocks, modes or MIG).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SECTIONS = ("meta", "nvml", "cuda_visible_devices", "gpuspawner", "load", "server")
STANDIN_NAME = "NVIDIA H100 80GB HBM3"
PROBE_VERSION = 2
GiB = 2**30

# ---------------------------------------------------------------- values --


def plain(value: Any, depth: int = 0) -> Any:
    """A pynvml value as JSON: ctypes structures and nvidia-ml-py's objects as dicts, arrays as lists."""
    if depth > 8:
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, ctypes.Array)):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        return {name: plain(getattr(value, name), depth + 1) for name, *_ in value._fields_}
    if isinstance(value, ctypes._SimpleCData):
        return plain(value.value, depth + 1)
    if isinstance(value, ctypes._Pointer) or type(value).__name__.startswith("LP_"):
        return "<pointer>"
    if hasattr(value, "__dict__"):
        return {k: plain(v, depth + 1) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def field_values(values: Any) -> list[dict]:
    """nvmlDeviceGetFieldValues' answers with the value read by its type."""
    import pynvml as N

    by_type = {N.NVML_VALUE_TYPE_DOUBLE: "dVal", N.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
               N.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
               N.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal"}
    out = []
    for v in values:
        member = by_type.get(v.valueType)
        out.append({"fieldId": v.fieldId, "scopeId": v.scopeId, "nvmlReturn": v.nvmlReturn,
                    "valueType": v.valueType,
                    "value": getattr(v.value, member) if member and v.nvmlReturn == N.NVML_SUCCESS else None})
    return out


def timed(fn, *args, **kw) -> dict:
    """{"value": ..., "us": ...} or {"error": "NVMLError_...", "us": ...}."""
    import pynvml as N

    started = time.perf_counter()
    try:
        value = fn(*args, **kw)
    except N.NVMLError as e:
        return {"error": type(e).__name__, "us": round((time.perf_counter() - started) * 1e6, 1)}
    except Exception as e:  # nvidia-ml-py's own refusals (a library version mismatch, a missing symbol)
        return {"error": f"{type(e).__name__}: {e}", "us": round((time.perf_counter() - started) * 1e6, 1)}
    us = round((time.perf_counter() - started) * 1e6, 1)
    return {"value": plain(value), "py": type(value).__name__, "us": us}


# ------------------------------------------------------------------ meta --


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _nspid(pid: int | str = "self") -> list[int] | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(p) for p in line.split()[1:]]
    except OSError:
        return None
    return None


def section_meta(backend: str) -> dict:
    import pynvml

    out: dict[str, Any] = {
        "backend": backend,
        "probe_version": PROBE_VERSION,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "nvidia_ml_py": _version("nvidia-ml-py"),
        "pynvml_file": pynvml.__file__,
        "torch": _version("torch"),
        "jupyter_server": _version("jupyter_server"),
        "pid": os.getpid(),
        "nspid": _nspid(),
        "container_hints": [p for p in ("/.dockerenv", "/run/.containerenv") if os.path.exists(p)],
    }
    smi = shutil.which("nvidia-smi")
    if smi and backend == "real":
        query = ("name,uuid,pci.bus_id,driver_version,memory.total,memory.used,memory.reserved,utilization.gpu,"
                 "temperature.gpu,power.draw,enforced.power.limit,clocks.sm,clocks.mem,clocks.max.sm,"
                 "clocks.max.mem,mig.mode.current,persistence_mode,pstate,compute_mode")
        proc = subprocess.run([smi, f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True,
                              timeout=60)
        out["nvidia_smi_query"] = (proc.stdout + proc.stderr).strip().splitlines()
        topo = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=60)
        out["nvidia_smi_topo"] = (topo.stdout + topo.stderr).rstrip().splitlines()
        smi_version = subprocess.run([smi, "--version"], capture_output=True, text=True, timeout=60)
        out["nvidia_smi_version"] = smi_version.stdout.strip().splitlines()
    return out


# ------------------------------------------------------------------ nvml --


def section_nvml(index: int = 0) -> dict:
    """Every function the stand-in exports, on GPU ``index``, as gpuspawner and the tools call it."""
    import pynvml as N

    N.nvmlInit()
    out: dict[str, Any] = {}

    def rec(label: str, fn, *args, **kw) -> dict:
        out[label] = timed(fn, *args, **kw)
        return out[label]

    rec("nvmlSystemGetDriverVersion", N.nvmlSystemGetDriverVersion)
    rec("nvmlSystemGetNVMLVersion", N.nvmlSystemGetNVMLVersion)
    rec("nvmlSystemGetCudaDriverVersion", N.nvmlSystemGetCudaDriverVersion)
    rec("nvmlSystemGetCudaDriverVersion_v2", N.nvmlSystemGetCudaDriverVersion_v2)
    rec("nvmlDeviceGetCount", N.nvmlDeviceGetCount)
    h = N.nvmlDeviceGetHandleByIndex(index)
    uuid = N.nvmlDeviceGetUUID(h)
    bus = N.nvmlDeviceGetPciInfo(h).busId
    bus = bus.decode() if isinstance(bus, bytes) else bus
    rec("nvmlDeviceGetHandleByIndex", lambda: N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByIndex(index)))
    rec("nvmlDeviceGetHandleByUUID", lambda: N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(uuid)))
    rec("nvmlDeviceGetHandleByPciBusId", lambda: N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(bus)))
    for name in ("Index", "UUID", "Name", "Serial", "MinorNumber", "PciInfo", "Brand", "Architecture",
                 "CudaComputeCapability", "MemoryInfo", "BAR1MemoryInfo", "UtilizationRates", "PowerUsage",
                 "PowerManagementLimit", "EnforcedPowerLimit", "FanSpeed", "PerformanceState", "PersistenceMode",
                 "DisplayMode", "DisplayActive", "ComputeMode", "CurrentDriverModel", "EncoderUtilization",
                 "DecoderUtilization", "MaxPcieLinkGeneration", "MaxPcieLinkWidth", "CurrPcieLinkGeneration",
                 "CurrPcieLinkWidth", "ComputeRunningProcesses", "GraphicsRunningProcesses", "MigMode",
                 "MaxMigDeviceCount", "GpuInstanceId", "ComputeInstanceId", "DeviceHandleFromMigDeviceHandle",
                 "NumaNodeId"):
        rec(f"nvmlDeviceGet{name}", getattr(N, f"nvmlDeviceGet{name}"), h)
    rec("nvmlDeviceIsMigDeviceHandle", N.nvmlDeviceIsMigDeviceHandle, h)

    def pci_ext():
        info = N.nvmlPciInfoExt_v1_t()
        info.version = N.nvmlPciInfoExt_v1
        N.nvmlDeviceGetPciInfoExt(h, ctypes.byref(info))
        return info

    rec("nvmlDeviceGetPciInfoExt", pci_ext)
    rec("nvmlDeviceGetMemoryInfo_v2", N.nvmlDeviceGetMemoryInfo, h, version=N.nvmlMemory_v2)
    rec("nvmlDeviceGetTemperature(GPU)", N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU)
    rec("nvmlDeviceGetTemperatureV(GPU)", N.nvmlDeviceGetTemperatureV, h, N.NVML_TEMPERATURE_GPU)
    for clock in range(4):  # graphics, sm, memory, video
        rec(f"nvmlDeviceGetClockInfo({clock})", N.nvmlDeviceGetClockInfo, h, clock)
        rec(f"nvmlDeviceGetMaxClockInfo({clock})", N.nvmlDeviceGetMaxClockInfo, h, clock)
    rec("nvmlDeviceGetPcieThroughput(TX)", N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_TX_BYTES)
    rec("nvmlDeviceGetPcieThroughput(RX)", N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_RX_BYTES)
    rec("nvmlDeviceGetProcessUtilization(0)", N.nvmlDeviceGetProcessUtilization, h, 0)
    rec("nvmlDeviceGetTotalEccErrors(corrected,volatile)", N.nvmlDeviceGetTotalEccErrors, h,
        N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC)
    rec("nvmlDeviceGetTotalEccErrors(uncorrected,aggregate)", N.nvmlDeviceGetTotalEccErrors, h,
        N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC)
    rec("nvmlDeviceGetMigDeviceHandleByIndex(0)",
        lambda: N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)))
    # topology and affinity, as gpuspawner.nvml.topology reads them
    rec("nvmlDeviceGetTopologyCommonAncestor(self)", N.nvmlDeviceGetTopologyCommonAncestor, h, h)
    out["nvmlDeviceGetNvLinkState(0..39)"] = [timed(N.nvmlDeviceGetNvLinkState, h, link) for link in range(40)]
    rec("nvmlDeviceGetNvLinkVersion(0)", N.nvmlDeviceGetNvLinkVersion, h, 0)
    rec("nvmlDeviceGetNvLinkRemoteDeviceType(0)", N.nvmlDeviceGetNvLinkRemoteDeviceType, h, 0)
    rec("nvmlDeviceGetNvLinkRemotePciInfo(0)", N.nvmlDeviceGetNvLinkRemotePciInfo, h, 0)
    rec("nvmlDeviceGetNvLinkUtilizationCounter(0,0)", N.nvmlDeviceGetNvLinkUtilizationCounter, h, 0, 0)
    rec("nvmlDeviceGetCpuAffinity(16)", N.nvmlDeviceGetCpuAffinity, h, 16)
    rec("nvmlDeviceGetCpuAffinityWithinScope(16,node)", N.nvmlDeviceGetCpuAffinityWithinScope, h, 16,
        N.NVML_AFFINITY_SCOPE_NODE)
    rec("nvmlDeviceGetCpuAffinityWithinScope(16,socket)", N.nvmlDeviceGetCpuAffinityWithinScope, h, 16,
        N.NVML_AFFINITY_SCOPE_SOCKET)
    rec("nvmlDeviceGetMemoryAffinity(1,node)", N.nvmlDeviceGetMemoryAffinity, h, 1, N.NVML_AFFINITY_SCOPE_NODE)
    fields = [N.NVML_FI_DEV_NVLINK_LINK_COUNT, N.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON,
              *[getattr(N, f"NVML_FI_DEV_NVLINK_SPEED_MBPS_L{i}") for i in range(12)],
              (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0), (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),
              N.NVML_FI_DEV_ECC_CURRENT, 100000]
    rec("nvmlDeviceGetFieldValues", lambda: field_values(N.nvmlDeviceGetFieldValues(h, fields)))
    try:
        N.nvmlShutdown()
    except N.NVMLError:
        pass
    return out


# The argument errors, the calls before nvmlInit and the reference counting the stand-in's tests
# (tests/unit/test_fakenvml.py) claim, asked of this host's library in a fresh process.
ERRORS_SNIPPET = r'''
import ctypes, json
import pynvml as N

def err(fn, *args, **kw):
    try:
        return ["ok", fn(*args, **kw)]
    except N.NVMLError as e:
        return ["error", type(e).__name__]

def raw(name, *args):
    return N._nvmlGetFunctionPointer(name)(*args)

out = {"count_before_init": err(N.nvmlDeviceGetCount)}
N._LoadNvmlLibrary()
buf = ctypes.create_string_buffer(96)
out["nvml_version_before_init"] = raw("nvmlSystemGetNVMLVersion", buf, 96)
out["driver_version_before_init"] = raw("nvmlSystemGetDriverVersion", buf, 96)
out["cuda_version_before_init"] = raw("nvmlSystemGetCudaDriverVersion", ctypes.byref(ctypes.c_int()))
out["cuda_version_v2_before_init"] = raw("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(ctypes.c_int()))
N.nvmlInit(); N.nvmlInit()
n = N.nvmlDeviceGetCount()
h = N.nvmlDeviceGetHandleByIndex(0)
count = ctypes.c_uint(0)
bad_mem = N.c_nvmlMemory_v2_t(); bad_mem.version = 1
bad_temp = N.c_nvmlTemperature_v1_t(); bad_temp.version = 1
bad_pci = N.nvmlPciInfoExt_v1_t(); bad_pci.version = 1
out.update({
    "bad_index": err(N.nvmlDeviceGetHandleByIndex, n),
    "unknown_uuid": err(N.nvmlDeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000"),
    "malformed_uuid": err(N.nvmlDeviceGetHandleByUUID, "not-a-uuid"),
    "unknown_pci_bus_id": err(N.nvmlDeviceGetHandleByPciBusId, "00000000:FE:1F.0"),
    "null_out": raw("nvmlDeviceGetCount_v2", None),
    "null_name": raw("nvmlDeviceGetName", h, None, 96),
    "null_handle": raw("nvmlDeviceGetName", None, buf, 96),
    "short_name": raw("nvmlDeviceGetName", h, buf, 4),
    "short_driver": raw("nvmlSystemGetDriverVersion", buf, 3),
    "bad_version": raw("nvmlDeviceGetMemoryInfo_v2", h, ctypes.byref(bad_mem)),
    "bad_temperature_version": raw("nvmlDeviceGetTemperatureV", h, ctypes.byref(bad_temp)),
    "bad_pci_ext_version": raw("nvmlDeviceGetPciInfoExt", h, ctypes.byref(bad_pci)),
    "bad_clock": err(N.nvmlDeviceGetClockInfo, h, 17),
    "bad_clock_4": err(N.nvmlDeviceGetClockInfo, h, 4),
    "bad_max_clock": err(N.nvmlDeviceGetMaxClockInfo, h, 17),
    "bad_sensor": err(N.nvmlDeviceGetTemperature, h, 7),
    "bad_pcie_counter": err(N.nvmlDeviceGetPcieThroughput, h, 7),
    "bad_ecc_type": err(N.nvmlDeviceGetTotalEccErrors, h, 5, 0),
    "nvlink_version_link_12": err(N.nvmlDeviceGetNvLinkVersion, h, 12),
    "nvlink_version_link_18": err(N.nvmlDeviceGetNvLinkVersion, h, 18),
    "process_utilization_future": err(N.nvmlDeviceGetProcessUtilization, h, 2**62),
    "mig_handle_by_index": [err(lambda i: N.nvmlDeviceGetMigDeviceHandleByIndex(h, i) and "handle", i)
                            for i in (0, 6, 7, 100)],
    "affinity_zero_size": raw("nvmlDeviceGetCpuAffinity", h, 0, (ctypes.c_ulong * 1)()),
    "affinity_bad_scope": raw("nvmlDeviceGetCpuAffinityWithinScope", h, 1, (ctypes.c_ulong * 1)(), 7),
})
rc = raw("nvmlDeviceGetComputeRunningProcesses_v3", h, ctypes.byref(count), None)
out["procs_size"] = [rc, count.value]
out["strings"] = {str(c): N.nvmlErrorString(c) for c in (0, 1, 2, 3, 7, 9, 13, 15, 25, 999)}
c = ctypes.c_uint()
out["raw_before_shutdown"] = raw("nvmlDeviceGetCount_v2", ctypes.byref(c))
N.nvmlShutdown()
out["after_one_shutdown"] = err(N.nvmlDeviceGetCount)
N.nvmlShutdown()
out["raw_after"] = raw("nvmlDeviceGetCount_v2", ctypes.byref(c))
out["name_after"] = err(N.nvmlDeviceGetName, h)
out["driver_after"] = err(N.nvmlSystemGetDriverVersion)
out["extra_shutdown"] = err(N.nvmlShutdown)
print("@@" + json.dumps(out))
'''


def section_nvml_errors() -> dict:
    proc = subprocess.run([sys.executable, "-c", ERRORS_SNIPPET], capture_output=True, text=True, timeout=120)
    if "@@" not in proc.stdout:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-3000:]}"}
    return json.loads(proc.stdout.rsplit("@@", 1)[1])


def section_nvml_extra(index: int = 0) -> dict:
    """Functions the stand-in does not export, for reference (power, energy, throttling, remapping)."""
    import pynvml as N

    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(index)
    calls = {
        "nvmlDeviceGetTotalEnergyConsumption": (N.nvmlDeviceGetTotalEnergyConsumption, h),
        "nvmlDeviceGetTemperatureThreshold(slowdown)": (N.nvmlDeviceGetTemperatureThreshold, h,
                                                        N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "nvmlDeviceGetPowerManagementLimitConstraints": (N.nvmlDeviceGetPowerManagementLimitConstraints, h),
        "nvmlDeviceGetCurrentClocksEventReasons": (N.nvmlDeviceGetCurrentClocksEventReasons, h),
        "nvmlDeviceGetRemappedRows": (N.nvmlDeviceGetRemappedRows, h),
        "nvmlDeviceGetMPSComputeRunningProcesses": (N.nvmlDeviceGetMPSComputeRunningProcesses, h),
        "nvmlDeviceGetMemoryBusWidth": (N.nvmlDeviceGetMemoryBusWidth, h),
        "nvmlDeviceGetNumGpuCores": (N.nvmlDeviceGetNumGpuCores, h),
        "nvmlDeviceGetGspFirmwareMode": (N.nvmlDeviceGetGspFirmwareMode, h),
        "nvmlDeviceGetVirtualizationMode": (N.nvmlDeviceGetVirtualizationMode, h),
    }
    out = {}
    for label, (fn, *args) in calls.items():
        try:
            out[label] = timed(fn, *args)
        except AttributeError as e:
            out[label] = {"error": f"not in this nvidia-ml-py: {e}"}
    try:
        N.nvmlShutdown()
    except N.NVMLError:
        pass
    return out


# ------------------------------------------------------------------ CUDA --

CUDA_SNIPPET = r'''
import ctypes, json
out = {}
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    out["error"] = f"libcuda.so.1: {e}"
else:
    out["cuInit"] = cuda.cuInit(0)
    n = ctypes.c_int(0)
    if out["cuInit"] == 0:
        out["cuDeviceGetCount"] = cuda.cuDeviceGetCount(ctypes.byref(n))
    uuids = []
    for i in range(n.value):
        dev = ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), i)
        raw = (ctypes.c_ubyte * 16)()
        cuda.cuDeviceGetUuid_v2(raw, dev)
        x = bytes(raw).hex()
        uuids.append(f"GPU-{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}")
    out["uuids"] = uuids
print("@@" + json.dumps(out))
'''


def _cuda_values(uuids: list[str]) -> list[str | None]:
    n, u = len(uuids), uuids[0]
    zero = "GPU-00000000-0000-0000-0000-000000000000"
    return [None, "", "0", str(n), f"0,{n}", f"{n},0", u, u[:12], "GPU-" + u[4:].upper(), u[4:], zero, f"{zero},0",
            f"0,{zero}", "none", "void", "all", " 0", "0 ", "-1", "0,0", f"{u},{u}", f"{u},0",
            "MIG-00000000-0000-0000-0000-000000000000", "0:0", "abc", f"0,abc,{n - 1}"]


def section_cuda_visible_devices(uuids: list[str], names: list[str]) -> list[dict]:
    """Per CUDA_VISIBLE_DEVICES value: the GPUs libcuda enumerates, and the monitor's decision."""
    from gpuspawner.monitor.visibility import Device, Visibility

    def one(value: str | None) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
        if value is not None:
            env["CUDA_VISIBLE_DEVICES"] = value
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        proc = subprocess.run([sys.executable, "-c", CUDA_SNIPPET], env=env, capture_output=True, text=True,
                              timeout=120)
        cuda = json.loads(proc.stdout.rsplit("@@", 1)[1]) if "@@" in proc.stdout else {"error": proc.stderr[-2000:]}
        visibility = Visibility.from_env({**({"CUDA_VISIBLE_DEVICES": value} if value is not None else {}),
                                          "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        decisions = visibility.decide([Device(i, u, (), False, names[i]) for i, u in enumerate(uuids)])
        monitor = [{"visible": d.visible, "cuda_index": d.cuda_index, "cuda_reason": d.cuda_reason}
                   for d in decisions]
        cuda_uuids = cuda.get("uuids", [])
        agrees = all((d["cuda_index"] if d["visible"] else None)
                     == (cuda_uuids.index(u) if u in cuda_uuids else None) for d, u in zip(monitor, uuids, strict=True))
        return {"value": value, "cuda": cuda, "monitor": monitor, "agrees": agrees}

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, _cuda_values(uuids)))


# ------------------------------------------------------------ gpuspawner --


def _devices_json(listing) -> dict:
    return {
        "reason": listing.reason, "started": listing.started, "driver_version": listing.driver_version,
        "cuda_driver_version": listing.cuda_driver_version,
        "devices": [{"index": d.index, "handle_ok": d.handle.ok, "handle_reason": d.handle.reason,
                     "uuid": list(d.uuid), "name": list(d.name)} for d in listing.devices],
    }


def server_env(uuid: str) -> dict[str, str]:
    """What gpu-local gives a server with this one GPU (gpuspawner.backends.local.spawner)."""
    from gpuspawner.gpu import nvidia_visible_devices

    return {"CUDA_VISIBLE_DEVICES": uuid, "NVIDIA_VISIBLE_DEVICES": nvidia_visible_devices([uuid])}


def section_gpuspawner(rounds: int) -> dict:
    from gpuspawner import nvml
    from gpuspawner.inventory import NVMLInventory
    from gpuspawner.monitor.reading import read_sample, read_static
    from gpuspawner.monitor.sampler import Sampler
    from gpuspawner.monitor.visibility import Visibility

    out: dict[str, Any] = {}
    started = time.perf_counter()
    listing = nvml.devices()
    out["devices_ms"] = round((time.perf_counter() - started) * 1e3, 3)
    out["devices"] = _devices_json(listing)
    started = time.perf_counter()
    topology = nvml.topology(listing)
    out["topology_ms"] = round((time.perf_counter() - started) * 1e3, 3)
    out["topology"] = {str(i): t._asdict() for i, t in topology.items()}
    started = time.perf_counter()
    reading = NVMLInventory(host="probe-host").read()
    out["inventory_ms"] = round((time.perf_counter() - started) * 1e3, 3)
    out["inventory"] = {"gpus": [g.to_dict() for g in reading.gpus], "problems": list(reading.problems)}
    out["memory_info"] = [list(nvml.memory_info(d.handle.value)) for d in listing.devices if d.handle.ok]
    # the hub's host view (no restriction) and a server's view (GPU 0 by UUID, as gpu-local sets it)
    everything = read_static(Visibility.from_env({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}))
    out["static_all"] = {"status": everything.status, "detail": everything.detail,
                         "gpus": [g.index for g in everything.gpus]}
    uuid0 = listing.devices[0].uuid.value
    env = server_env(uuid0)
    out["server_env"] = env
    visibility = Visibility.from_env(env)
    started = time.perf_counter()
    static = read_static(visibility)
    out["read_static_ms"] = round((time.perf_counter() - started) * 1e3, 3)
    out["sample"] = read_sample(static)
    sampler = Sampler(visibility, interval=1.0)
    sampler.sample_once()  # reads the static facts
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        sampler.sample_once()
        times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    out["sampler_round_ms"] = _spread(times)  # as a server's sampler reads (PCIe reads side by side)
    sequential = []
    for _ in range(max(1, rounds // 5)):
        started = time.perf_counter()
        read_sample(static)  # every call in turn, as before the sampler read PCIe side by side
        sequential.append((time.perf_counter() - started) * 1e3)
    out["sequential_round_ms"] = _spread(sequential)
    out["sampler_sample"] = sampler.history()[-1]
    sampler.stop()
    return out


def _spread(times_ms: list[float]) -> dict:
    times = sorted(times_ms)
    return {"rounds": len(times), "median": round(statistics.median(times), 3),
            "p90": round(times[int(0.9 * (len(times) - 1))], 3), "min": round(times[0], 3),
            "max": round(times[-1], 3)}


# ------------------------------------------------------------------ load --

TORCH_WORKER = r'''
import json, os, sys, threading, time
import torch
gib, seconds = float(sys.argv[1]), float(sys.argv[2])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
started = time.time()
hold = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
hold.fill_(1)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
torch.cuda.synchronize()
props = torch.cuda.get_device_properties(0)
print("@@" + json.dumps({
    "pid": os.getpid(), "ppid": os.getppid(), "nspid": [int(p) for line in open("/proc/self/status")
                                                         if line.startswith("NSpid:") for p in line.split()[1:]],
    "torch": torch.__version__, "cuda": torch.version.cuda, "device_count": torch.cuda.device_count(),
    "name": props.name, "uuid": str(getattr(props, "uuid", "")), "total_memory": props.total_memory,
    "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
    "mem_get_info": list(torch.cuda.mem_get_info()), "startup_s": round(time.time() - started, 3),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES")}), flush=True)
n, end = 0, time.time() + seconds
while not stop.is_set() and time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
print("@@" + json.dumps({"matmuls": n, "tflops": round(n * 2 * 8192**3 / (time.time() - started) / 1e12, 1)}),
      flush=True)
'''

SLEEP_WORKER = r'''
import json, os, sys
print("@@" + json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "torch": None}), flush=True)
sys.stdin.read()
print("@@" + json.dumps({"matmuls": 0}), flush=True)
'''


def _standin_busy(pids_memory: dict[int, int], utilization: int) -> None:
    """Under the stand-in: list these processes on GPU 0 of the device file, memory and utilisation to match."""
    import fakenvml

    path = os.environ["FAKENVML_CONFIG"]
    with open(path) as f:
        config = json.load(f)
    device = config["devices"][0]
    device["processes"] = [{"pid": pid, "used_memory": used} for pid, used in pids_memory.items()]
    device["memory_used"] = sum(pids_memory.values())
    device["utilization_gpu"] = device["utilization_memory"] = utilization
    fakenvml.write_config(path, config)


def section_load(backend: str, gib: float, seconds: float) -> dict:
    import pynvml as N

    from gpuspawner import nvml
    from gpuspawner.monitor.kernels import Attributor, Kernel
    from gpuspawner.monitor.sampler import Sampler
    from gpuspawner.monitor.visibility import Visibility

    listing = nvml.devices()
    uuid0 = listing.devices[0].uuid.value
    handle = listing.devices[0].handle.value
    env = {**os.environ, **server_env(uuid0)}
    script = TORCH_WORKER if backend == "real" else SLEEP_WORKER
    out: dict[str, Any] = {"env": server_env(uuid0), "gib": gib}
    started = time.perf_counter()
    worker = subprocess.Popen([sys.executable, "-c", script, str(gib), str(seconds + 120)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = worker.stdout.readline()
        if not line.startswith("@@"):
            worker.kill()
            return {**out, "error": f"worker failed: {line}{worker.stderr.read()[-3000:]}"}
        info = json.loads(line[2:])
        out["worker"] = info
        out["worker_ready_s"] = round(time.perf_counter() - started, 3)
        pid = info["pid"]
        if backend == "standin":
            _standin_busy({pid: int(gib * GiB) + 512 * 2**20}, 100)
        attributor = Attributor()
        attributor.table = {os.getpid(): Kernel("probe-kernel", "python3", "probe.ipynb", os.getpid())}
        sampler = Sampler(Visibility.from_env(server_env(uuid0)), interval=1.0, attribute=attributor)
        samples, raw = [], []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tick = time.monotonic()
            samples.append(sampler.sample_once())
            raw.append({
                "compute": timed(N.nvmlDeviceGetComputeRunningProcesses, handle),
                "graphics": timed(N.nvmlDeviceGetGraphicsRunningProcesses, handle),
                "process_utilization": timed(N.nvmlDeviceGetProcessUtilization, handle, 0),
                "utilization": timed(N.nvmlDeviceGetUtilizationRates, handle),
                "memory_v1": timed(N.nvmlDeviceGetMemoryInfo, handle),
                "memory_v2": timed(N.nvmlDeviceGetMemoryInfo, handle, version=N.nvmlMemory_v2),
            })
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        sampler.stop()
        out["samples"] = samples
        out["raw"] = raw
        smi = shutil.which("nvidia-smi")
        if smi and backend == "real":  # what a user compares the monitor with
            apps = subprocess.run([smi, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,nounits"],
                                  capture_output=True, text=True, timeout=60)
            gpu = subprocess.run([smi, "--query-gpu=uuid,memory.used,memory.reserved,memory.total,utilization.gpu,"
                                  "utilization.memory,power.draw,clocks.sm", "--format=csv,nounits"],
                                 capture_output=True, text=True, timeout=60)
            out["nvidia_smi"] = {"apps": (apps.stdout + apps.stderr).strip().splitlines(),
                                 "gpu": (gpu.stdout + gpu.stderr).strip().splitlines()}
        out["attribution_direct"] = list(_table(pid)(pid))
        out["nvml_pids"] = sorted({p["pid"] for s in samples for g in s["gpus"] for p in g["processes"]})
    finally:
        try:
            worker.stdin.close()
        except OSError:
            pass
        try:
            tail = worker.stdout.read()
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            tail = ""
        out["worker_end"] = [json.loads(x[2:]) for x in tail.splitlines() if x.startswith("@@")]
        out["worker_stderr"] = worker.stderr.read()[-2000:]
    if backend == "standin":
        _standin_busy({}, 0)
    # the process is gone: how soon NVML stops listing it
    gone_started = time.monotonic()
    while time.monotonic() - gone_started < 20:
        procs = nvml.query("nvmlDeviceGetComputeRunningProcesses", handle)
        if procs.ok and not any(p.pid == out.get("worker", {}).get("pid") for p in procs.value):
            break
        time.sleep(0.1)
    out["unlisted_after_exit_s"] = round(time.monotonic() - gone_started, 3)
    after = Sampler(Visibility.from_env(server_env(uuid0)), interval=1.0)
    out["after"] = after.sample_once()
    after.stop()
    return out


def _table(pid: int):
    from gpuspawner.monitor.kernels import Attributor, Kernel

    attributor = Attributor()
    attributor.table = {pid: Kernel("direct", "python3", "direct.ipynb", pid)}
    return attributor


# ---------------------------------------------------------------- server --

KERNEL_TORCH = r'''
import json, os, threading, time
import torch
_probe_stop = threading.Event()
_probe_hold = torch.empty(int(GIB * 2**30), dtype=torch.uint8, device="cuda"); _probe_hold.fill_(1)
_probe_a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); _probe_b = torch.randn_like(_probe_a)
def _probe_spin():
    end = time.time() + SECONDS
    while not _probe_stop.is_set() and time.time() < end:
        for _ in range(20):
            _probe_a @ _probe_b
        torch.cuda.synchronize()
threading.Thread(target=_probe_spin, daemon=True).start()
print("@@" + json.dumps({"pid": os.getpid(), "device_count": torch.cuda.device_count(),
                         "uuid": str(getattr(torch.cuda.get_device_properties(0), "uuid", "")),
                         "reserved": torch.cuda.memory_reserved(),
                         "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}))
'''

KERNEL_PLAIN = r'''
import json, os, threading
_probe_stop = threading.Event()
print("@@" + json.dumps({"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}))
'''


def _metric_families(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {"type": family.type,
                            "labels": sorted({k for s in family.samples for k in s.labels}),
                            "samples": [[s.labels, s.value] for s in family.samples]}
    return out


def section_server(backend: str, gib: float, seconds: float) -> dict:
    import requests

    from gpuspawner import nvml
    from jupyter_server_proc import JupyterServer, SSEClient, run_in_kernel

    uuid0 = nvml.devices().devices[0].uuid.value
    workdir = Path(tempfile.mkdtemp(prefix="gpuspawner-probe-"))
    env = {**server_env(uuid0),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out: dict[str, Any] = {"env": env}
    # The monitor alone, enabled as the package's jupyter-config file enables it, in the server's
    # private config directory (gpuspawner may not be installed in this Python).
    (workdir / "server" / "jupyter-config").mkdir(parents=True)
    (workdir / "server" / "jupyter-config" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"gpuspawner.monitor": True}}}))
    server = JupyterServer(workdir / "server", env, ["--GPUMonitor.interval=0.5", "--GPUMonitor.static_refresh=5"])
    started = time.perf_counter()
    server.start(timeout=120)
    out["server_start_s"] = round(time.perf_counter() - started, 3)
    try:
        r = requests.post(server.url + "api/sessions", headers=server.auth, timeout=120,
                          json={"path": "probe.ipynb", "name": "probe.ipynb", "type": "notebook",
                                "kernel": {"name": "python3"}})
        r.raise_for_status()
        session = r.json()
        kernel_id = session["kernel"]["id"]
        code = (KERNEL_TORCH.replace("GIB", repr(gib)).replace("SECONDS", repr(seconds + 120))
                if backend == "real" else KERNEL_PLAIN)
        printed = run_in_kernel(server, kernel_id, code, timeout=180)
        info = json.loads(printed.rsplit("@@", 1)[1])
        out["kernel"] = {"id": kernel_id, **info}
        if backend == "standin":
            _standin_busy({info["pid"]: int(gib * GiB) + 512 * 2**20}, 100)

        def attributed(sample: dict) -> bool:
            return any((p.get("kernel") or {}).get("id") == kernel_id
                       for g in sample.get("gpus", []) for p in g.get("processes", []))

        try:
            sample = server.wait_for(attributed, timeout=60, what="the kernel's process attributed to it")
        except AssertionError as e:  # recorded, and the rest still read: this is what a user would see
            out["attribution_error"] = str(e)[:300]
            sample = server.gpus()
        out["api_gpus"] = sample
        client = SSEClient(server)
        try:
            client.wait_for(lambda s: True, timeout=30)
            client.wait_for(lambda s: s["time"] > client.samples[0]["time"], timeout=30)
            out["stream"] = {"status": client.status_code, "content_type": client.content_type,
                             "events": [e for e, _ in client.events[:3]], "samples": client.samples[:2]}
        finally:
            client.close()
        metrics = server.get("api/gpus/metrics")
        out["metrics"] = {"status": metrics.status_code, "content_type": metrics.headers.get("Content-Type"),
                          "families": _metric_families(metrics.text)}
        out["unauthenticated"] = requests.get(server.url + "api/gpus", timeout=30).status_code
        run_in_kernel(server, kernel_id, "_probe_stop.set()", timeout=60)
        requests.delete(server.url + f"api/sessions/{session['id']}", headers=server.auth, timeout=60)
        if backend == "standin":
            _standin_busy({}, 0)
    finally:
        server.stop()
        out["server_log_tail"] = server.log_text()[-4000:]
        shutil.rmtree(workdir, ignore_errors=True)
    return out


# ------------------------------------------------------------------ main --


def standin_config(like: str | None) -> dict:
    """The stand-in's device file: the host of recording ``like`` (fakenvml.recorded_host), else one
    H100 as fakenvml.make_device describes it."""
    import fakenvml

    if like:
        with open(like) as f:
            return fakenvml.recorded_host(json.load(f))
    return {"devices": [fakenvml.make_device(0, STANDIN_NAME)]}


def _reexec_on_standin(args: argparse.Namespace) -> None:
    """Run this probe again with the stand-in on LD_LIBRARY_PATH (read only at process start)."""
    import fakenvml

    libdir = Path(args.standin_lib) if args.standin_lib else fakenvml.build(ROOT / "build" / "fakenvml")
    state = Path(tempfile.mkdtemp(prefix="gpuspawner-probe-standin-"))
    config = state / "gpus.json"
    fakenvml.write_config(config, standin_config(args.like))
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    env.update(fakenvml.env(libdir, config))
    env["GPUSPAWNER_PROBE_STANDIN"] = "1"
    try:
        proc = subprocess.run([sys.executable, *sys.argv], env=env)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    sys.exit(proc.returncode)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the JSON here (rewritten after each section); default: stdout")
    parser.add_argument("--standin", action="store_true", help="read the stand-in NVML (one H100) instead")
    parser.add_argument("--standin-lib", help="directory of a built stand-in (default: build it in build/fakenvml)")
    parser.add_argument("--like", help="with --standin: configure the stand-in as the host of this recording "
                        "(e.g. tests/fakenvml/recorded/h100.json); default: one H100 from fakenvml.make_device")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--rounds", type=int, default=50, help="sampler rounds timed (default 50)")
    parser.add_argument("--load-gib", type=float, default=4.0, help="GiB the load allocates (default 4)")
    parser.add_argument("--load-seconds", type=float, default=8.0, help="seconds of samples under load (default 8)")
    args = parser.parse_args(argv)
    if args.standin and not os.environ.get("GPUSPAWNER_PROBE_STANDIN"):
        _reexec_on_standin(args)
    backend = "standin" if args.standin else "real"
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    result: dict[str, Any] = {}

    def save() -> None:
        text = json.dumps(result, indent=1, sort_keys=False, default=repr)
        if args.out:
            tmp = f"{args.out}.tmp"
            with open(tmp, "w") as f:
                f.write(text + "\n")
            os.replace(tmp, args.out)

    def run(name: str, fn, *fargs) -> None:
        started = time.perf_counter()
        print(f"probe: {name} ...", file=sys.stderr, flush=True)
        try:
            result[name] = fn(*fargs)
        except Exception:
            result[name] = {"error": traceback.format_exc()[-4000:]}
        print(f"probe: {name} done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        save()

    if "meta" in wanted:
        run("meta", section_meta, backend)
    if "nvml" in wanted:
        run("nvml", section_nvml)
        run("nvml_errors", section_nvml_errors)
        run("nvml_extra", section_nvml_extra)
    if "cuda_visible_devices" in wanted and backend == "real":
        from gpuspawner import nvml

        listing = nvml.devices()
        run("cuda_visible_devices", section_cuda_visible_devices, [d.uuid.value for d in listing.devices],
            [d.name.value for d in listing.devices])
    if "gpuspawner" in wanted:
        run("gpuspawner", section_gpuspawner, args.rounds)
    if "load" in wanted:
        run("load", section_load, backend, args.load_gib, args.load_seconds)
    if "server" in wanted:
        run("server", section_server, backend, args.load_gib, args.load_seconds)
    if not args.out:
        print(json.dumps(result, indent=1, default=repr))


if __name__ == "__main__":
    main()
