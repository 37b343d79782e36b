"""The stand-in libnvidia-ml.so.1, seen through the real nvidia-ml-py bindings.

The library is built once per session; every scenario runs pynvml in a fresh
process (LD_LIBRARY_PATH is only read at process start) and reports what a user
of NVML would see as JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import devcgroup
import fakenvml

# What pynvml looks up (nvml.h maps unversioned names to these).
REQUIRED_SYMBOLS = """
nvmlInit_v2 nvmlInitWithFlags nvmlShutdown nvmlErrorString nvmlSystemGetDriverVersion
nvmlSystemGetNVMLVersion nvmlSystemGetCudaDriverVersion nvmlSystemGetCudaDriverVersion_v2
nvmlDeviceGetCount_v2 nvmlDeviceGetHandleByIndex_v2 nvmlDeviceGetHandleByUUID nvmlDeviceGetIndex
nvmlDeviceGetUUID nvmlDeviceGetName nvmlDeviceGetSerial nvmlDeviceGetPciInfo_v3 nvmlDeviceGetPciInfoExt
nvmlDeviceGetMemoryInfo nvmlDeviceGetMemoryInfo_v2 nvmlDeviceGetCudaComputeCapability
nvmlDeviceGetUtilizationRates nvmlDeviceGetTemperature nvmlDeviceGetTemperatureV nvmlDeviceGetPowerUsage
nvmlDeviceGetEnforcedPowerLimit nvmlDeviceGetPowerManagementLimit nvmlDeviceGetClockInfo
nvmlDeviceGetMaxClockInfo nvmlDeviceGetFanSpeed nvmlDeviceGetMigMode nvmlDeviceGetMaxMigDeviceCount
nvmlDeviceGetMigDeviceHandleByIndex nvmlDeviceIsMigDeviceHandle nvmlDeviceGetDeviceHandleFromMigDeviceHandle
nvmlDeviceGetGpuInstanceId nvmlDeviceGetComputeInstanceId nvmlDeviceGetComputeRunningProcesses_v3
nvmlDeviceGetGraphicsRunningProcesses_v3 nvmlDeviceGetBrand nvmlDeviceGetArchitecture
nvmlDeviceGetEncoderUtilization nvmlDeviceGetDecoderUtilization nvmlDeviceGetProcessUtilization
nvmlDeviceGetMaxPcieLinkGeneration nvmlDeviceGetMaxPcieLinkWidth nvmlDeviceGetCurrPcieLinkGeneration
nvmlDeviceGetCurrPcieLinkWidth nvmlDeviceGetPcieThroughput nvmlDeviceGetNvLinkVersion nvmlDeviceGetFieldValues
nvmlDeviceGetBAR1MemoryInfo nvmlDeviceGetPersistenceMode nvmlDeviceGetDisplayMode nvmlDeviceGetDisplayActive
nvmlDeviceGetPerformanceState nvmlDeviceGetComputeMode nvmlDeviceGetDriverModel_v2 nvmlDeviceGetTotalEccErrors
""".split()

PRELUDE = r'''
import ctypes, json, os, sys, threading
import pynvml as N

def err(fn, *args, **kw):
    """fn's result, or the class name of the NVMLError it raised."""
    try:
        return fn(*args, **kw)
    except N.NVMLError as e:
        return type(e).__name__

def raw(name, *args):
    """Return code of the C function itself."""
    return N._nvmlGetFunctionPointer(name)(*args)

def config():
    with open(os.environ["FAKENVML_CONFIG"]) as f:
        return json.load(f)

def write(cfg):
    path = os.environ["FAKENVML_CONFIG"]
    with open(path + ".tmp", "w") as f:
        json.dump(cfg, f)
    os.replace(path + ".tmp", path)

def mem(m):
    return {k: getattr(m, k) for k in ("total", "free", "used")}
'''


def two_gpus() -> list[dict]:
    a100 = fakenvml.make_device(
        0,
        memory_used=3 * 2**30,
        memory_reserved=2**29,
        utilization_gpu=12,
        utilization_memory=3,
        temperature=35,
        temperature_max=41,
        processes=[{"pid": 1234, "used_memory": 2**30}, {"pid": 99, "used_memory": None}],
    )
    t4 = fakenvml.make_device(1, "Tesla T4", power_usage=None, faults={"nvmlDeviceGetClockInfo": "NO_PERMISSION"})
    return [a100, t4]


@pytest.fixture(scope="session")
def libdir(request, tmp_path_factory) -> Path:
    try:  # the session's shared build, where tests/conftest.py provides one
        return request.getfixturevalue("fakenvml_libdir")
    except pytest.FixtureLookupError:
        return fakenvml.build(tmp_path_factory.mktemp("fakenvml-lib"))


@pytest.fixture
def nvml(libdir, tmp_path):
    """Run a pynvml snippet (which sets ``out``) against a device file; return ``out``."""

    def scenario(code, config=None, *, counts=None, container=False, libdir_on_path=True, **variables):
        config_path = tmp_path / "gpus.json"
        if config is not None:
            fakenvml.write_config(config_path, config)
        env = {k: v for k, v in os.environ.items() if k not in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}
        env.update(fakenvml.env(libdir, config_path if config is not None else None, counts, container))
        if not libdir_on_path:
            env["LD_LIBRARY_PATH"] = ":".join(
                p for p in env["LD_LIBRARY_PATH"].split(":") if Path(p).resolve() != Path(libdir).resolve()
            )
        env.update({k: v for k, v in variables.items() if v is not None})
        script = PRELUDE + textwrap.dedent(code) + "\nprint('@@' + json.dumps(out))\n"
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.rsplit("@@", 1)[1])

    return scenario


def nvml_header() -> Path:
    spec = importlib.util.find_spec("nvidia")
    found = [h for root in spec.submodule_search_locations for h in Path(root).glob("*/include/nvml.h")]
    return sorted(found)[-1]


# ----------------------------------------------------------------- library --


def test_exports_what_pynvml_looks_up(libdir):
    # Looked up with dlsym, as pynvml does, in a child: loading the stand-in into
    # this process would change what in-process pynvml users find.
    code = (
        "import ctypes, json, sys; lib = ctypes.CDLL(sys.argv[1]);"
        "print(json.dumps([n for n in sys.argv[2:] if not hasattr(lib, n)]))"
    )
    names = [*REQUIRED_SYMBOLS, "fk_config_parse", "fk_count"]
    proc = subprocess.run([sys.executable, "-c", code, str(libdir / fakenvml.LIBRARY_NAME), *names],
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout) == ["fk_config_parse", "fk_count"]  # internals stay hidden
    assert b"libnvidia-ml.so.1\0" in (libdir / fakenvml.LIBRARY_NAME).read_bytes()  # the SONAME


def test_build_is_skipped_when_up_to_date(libdir):
    lib = libdir / fakenvml.LIBRARY_NAME
    before = lib.stat().st_mtime_ns
    assert fakenvml.build(libdir) == libdir
    assert lib.stat().st_mtime_ns == before


def test_make_device_is_deterministic_and_realistic():
    a = fakenvml.make_device(0)
    assert a == fakenvml.make_device(0)
    assert a["uuid"] != fakenvml.make_device(1)["uuid"]
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", a["uuid"])
    assert (a["memory_total"], a["compute_capability"], a["mig_mode"]) == (80 * 2**30, [8, 0], 0)
    t4 = fakenvml.make_device(1, "Tesla T4", temperature=50)
    assert (t4["compute_capability"], t4["temperature"], "mig_mode" in t4) == ([7, 5], 50, False)
    mig = fakenvml.make_mig_device(a, 0)
    assert mig["uuid"].startswith("MIG-") and mig["memory_total"] == 10200547328


def test_read_counts_of_missing_file_is_empty(tmp_path):
    assert fakenvml.read_counts(tmp_path / "nothing") == {}


# ------------------------------------------------------------------ values --


def test_values_come_from_the_device_file(nvml):
    devices = two_gpus()
    out = nvml(
        """
        N.nvmlInit()
        out = {"driver": N.nvmlSystemGetDriverVersion(), "cuda": N.nvmlSystemGetCudaDriverVersion(),
               "cuda2": N.nvmlSystemGetCudaDriverVersion_v2(), "nvml": N.nvmlSystemGetNVMLVersion(),
               "count": N.nvmlDeviceGetCount(), "devices": []}
        for i in range(out["count"]):
            h = N.nvmlDeviceGetHandleByIndex(i)
            pci = N.nvmlDeviceGetPciInfo(h)
            util = err(N.nvmlDeviceGetUtilizationRates, h)
            v2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
            out["devices"].append({
                "index": N.nvmlDeviceGetIndex(h), "uuid": N.nvmlDeviceGetUUID(h), "name": N.nvmlDeviceGetName(h),
                "serial": N.nvmlDeviceGetSerial(h),
                "bus_id": pci.busId if isinstance(pci.busId, str) else pci.busId.decode(), "bus": pci.bus,
                "pci_device_id": pci.pciDeviceId,
                "by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(h))),
                "memory": mem(N.nvmlDeviceGetMemoryInfo(h)),
                "memory_v2": [v2.total, v2.reserved, v2.used, v2.free],
                "cc": list(N.nvmlDeviceGetCudaComputeCapability(h)),
                "util": util if isinstance(util, str) else [util.gpu, util.memory],
                "temp": err(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU),
                "temp_v": err(N.nvmlDeviceGetTemperatureV, h, N.NVML_TEMPERATURE_GPU),
                "temp_max": err(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU_MAX),
                "power": err(N.nvmlDeviceGetPowerUsage, h),
                "limit": N.nvmlDeviceGetPowerManagementLimit(h), "enforced": N.nvmlDeviceGetEnforcedPowerLimit(h),
                "clock_sm": err(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM),
                "max_clocks": [N.nvmlDeviceGetMaxClockInfo(h, c) for c in range(4)],
                "fan": err(N.nvmlDeviceGetFanSpeed, h),
                "mig": err(N.nvmlDeviceGetMigMode, h),
                "brand": N.nvmlDeviceGetBrand(h), "arch": N.nvmlDeviceGetArchitecture(h),
                "graphics": N.nvmlDeviceGetGraphicsRunningProcesses(h),
                "procs": [[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetComputeRunningProcesses(h)],
            })
        N.nvmlShutdown()
        """,
        {"driver_version": "535.161.08", "cuda_driver_version": 12020, "nvml_version": "12.535.161.08",
         "devices": devices},
    )
    a100, t4 = devices
    assert (out["driver"], out["cuda"], out["cuda2"], out["nvml"], out["count"]) == (
        "535.161.08", 12020, 12020, "12.535.161.08", 2)
    a, t = out["devices"]
    assert (a["index"], a["uuid"], a["name"], a["serial"], a["by_uuid"]) == (
        0, a100["uuid"], "NVIDIA A100-SXM4-80GB", a100["serial"], 0)
    assert a["bus_id"] == a100["pci_bus_id"] and a["bus"] == 0x07 and a["pci_device_id"] == 0x20B210DE
    # v1 "used" includes reserved memory; v2 reports it apart.
    used = a100["memory_used"] + a100["memory_reserved"]
    assert a["memory"] == {"total": 80 * 2**30, "used": used, "free": 80 * 2**30 - used}
    assert a["memory_v2"] == [80 * 2**30, 2**29, 3 * 2**30, 80 * 2**30 - used]
    assert (a["cc"], a["util"], a["temp"], a["temp_v"], a["temp_max"]) == ([8, 0], [12, 3], 35, 35, 41)
    assert (a["power"], a["limit"], a["enforced"], a["clock_sm"]) == (61000, 400000, 400000, 1410)
    assert a["max_clocks"] == [1410, 1410, 1593, 1290]
    assert (a["fan"], a["mig"], a["brand"], a["arch"]) == ("NVMLError_NotSupported", [0, 0], 14, 7)
    assert a["graphics"] == [] and a["procs"] == [[1234, 2**30], [99, None]]
    assert (t["index"], t["uuid"], t["name"], t["cc"], t["arch"]) == (1, t4["uuid"], "Tesla T4", [7, 5], 6)
    assert t["memory"]["total"] == 15 * 2**30 and t["procs"] == []
    # null/missing values and a T4's lack of MIG read as NOT_SUPPORTED; a configured fault wins.
    assert (t["power"], t["mig"], t["temp_max"]) == ("NVMLError_NotSupported",) * 3
    assert t["clock_sm"] == "NVMLError_NoPermission"


def test_mig_devices_answer_for_themselves(nvml):
    parent = fakenvml.make_device(0, mig_mode=1, utilization_gpu=50)
    parent["mig_devices"] = [
        fakenvml.make_mig_device(parent, 0, memory_used=2**30, processes=[{"pid": 11, "used_memory": 2**30}]),
        fakenvml.make_mig_device(parent, 1, "3g.40gb", gpu_instance_id=2),
    ]
    disabled = fakenvml.make_device(1, mig_mode=0)
    disabled["mig_devices"] = [fakenvml.make_mig_device(disabled, 0)]  # exist only once MIG is enabled
    out = nvml(
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        n = N.nvmlDeviceGetMaxMigDeviceCount(h)
        migs = []
        for i in range(n):
            m = err(N.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            if isinstance(m, str):
                migs.append(m)
                continue
            parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
            migs.append({"uuid": N.nvmlDeviceGetUUID(m), "name": N.nvmlDeviceGetName(m),
                         "index": N.nvmlDeviceGetIndex(m), "memory": mem(N.nvmlDeviceGetMemoryInfo(m)),
                         "is_mig": N.nvmlDeviceIsMigDeviceHandle(m).value,
                         "gi": N.nvmlDeviceGetGpuInstanceId(m), "ci": N.nvmlDeviceGetComputeInstanceId(m),
                         "parent": N.nvmlDeviceGetUUID(parent),
                         "by_uuid": N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(m))),
                         "procs": [[p.pid, p.gpuInstanceId] for p in N.nvmlDeviceGetComputeRunningProcesses(m)],
                         "util": err(N.nvmlDeviceGetUtilizationRates, m)})
        d = N.nvmlDeviceGetHandleByIndex(1)
        out = {"mode": N.nvmlDeviceGetMigMode(h), "max": n, "migs": migs,
               "parent_is_mig": N.nvmlDeviceIsMigDeviceHandle(h).value,
               "parent_gi": err(N.nvmlDeviceGetGpuInstanceId, h),
               "parent_util": err(N.nvmlDeviceGetUtilizationRates, h),
               "parent_procs": [[p.pid, p.gpuInstanceId, p.computeInstanceId]
                                for p in N.nvmlDeviceGetComputeRunningProcesses(h)],
               "disabled_max": N.nvmlDeviceGetMaxMigDeviceCount(d),
               "disabled_by_index": [err(N.nvmlDeviceGetMigDeviceHandleByIndex, d, i) for i in (0, 6, 100)],
               "enabled_past_max": err(N.nvmlDeviceGetMigDeviceHandleByIndex, h, 7),
               "disabled_mig_uuid": err(N.nvmlDeviceGetHandleByUUID, config()["devices"][1]["mig_devices"][0]["uuid"])}
        """,
        {"devices": [parent, disabled]},
    )
    m0, m1 = parent["mig_devices"]
    assert out["mode"] == [1, 1] and out["max"] == 7
    assert out["migs"][2:] == ["NVMLError_NotFound"] * 5
    first, second = out["migs"][:2]
    assert (first["uuid"], first["name"], first["index"], first["is_mig"]) == (
        m0["uuid"], "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 0, 1)
    assert first["memory"] == {"total": 10200547328, "used": 2**30, "free": 10200547328 - 2**30}
    assert (first["gi"], first["ci"], first["parent"], first["by_uuid"]) == (1, 0, parent["uuid"], first["name"])
    assert first["procs"] == [[11, 1]] and first["util"] == "NVMLError_NotSupported"
    assert (second["uuid"], second["gi"], second["memory"]["total"]) == (m1["uuid"], 2, 38912 * 2**20)
    assert (out["parent_is_mig"], out["parent_gi"], out["parent_util"]) == (
        0, "NVMLError_InvalidArgument", "NVMLError_NotSupported")
    assert out["parent_procs"] == [[11, 1, 0]]
    assert out["disabled_max"] == 0 and out["disabled_mig_uuid"] == "NVMLError_NotFound"
    # MIG disabled: no MIG device at any index (driver 580, recorded); enabled: past the maximum is invalid
    assert out["disabled_by_index"] == ["NVMLError_NotFound"] * 3
    assert out["enabled_past_max"] == "NVMLError_InvalidArgument"


def test_what_monitoring_tools_read(nvml):
    """Encoder/decoder and per-process utilisation, PCIe, NVLink fields, modes, ECC, BAR1 (tools.c)."""
    a100 = fakenvml.make_device(0, encoder_utilization=7, decoder_utilization=9, performance_state=2,
                                processes=[{"pid": 11, "used_memory": 2**30, "sm_util": 40, "mem_util": 12},
                                           {"pid": 12, "used_memory": 2**29}],
                                graphics_processes=[{"pid": 11, "used_memory": 2**30, "sm_util": 40}],
                                ecc_errors={"corrected": 3, "uncorrected": 1})
    a100["pcie"].update(tx_kbps=1500, rx_kbps=2500)
    a100["nvlink"].update(tx_kibps=2**20, rx_kibps=2**19)
    t4 = fakenvml.make_device(1, "Tesla T4", encoder_utilization=None, ecc_errors=None, pcie=None)
    h100 = fakenvml.make_device(2, "NVIDIA H100 80GB HBM3", decoder_utilization=4)
    out = nvml(
        """
        N.nvmlInit()
        a, t = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
        h = N.nvmlDeviceGetHandleByIndex(2)
        speeds = [getattr(N, f"NVML_FI_DEV_NVLINK_SPEED_MBPS_L{i}") for i in range(12)]
        def fields(h, ids):
            return [[v.nvmlReturn, v.value.uiVal if v.valueType == N.NVML_VALUE_TYPE_UNSIGNED_INT else v.value.ullVal]
                    for v in N.nvmlDeviceGetFieldValues(h, ids)]
        def counters(h):
            return [v.value.ullVal for v in N.nvmlDeviceGetFieldValues(
                h, [(N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0), (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 11)])]
        import time
        before = counters(a); time.sleep(0.2); after = counters(a)
        out = {
            "enc": N.nvmlDeviceGetEncoderUtilization(a), "dec": N.nvmlDeviceGetDecoderUtilization(a),
            "t4_enc": err(N.nvmlDeviceGetEncoderUtilization, t),
            "h100_codec": [N.nvmlDeviceGetEncoderUtilization(h), N.nvmlDeviceGetDecoderUtilization(h)],
            "procs": sorted([s.pid, s.smUtil, s.memUtil, s.encUtil] for s in N.nvmlDeviceGetProcessUtilization(a, 0)),
            "procs_later": err(N.nvmlDeviceGetProcessUtilization, a, 2**62),
            "t4_procs": err(N.nvmlDeviceGetProcessUtilization, t, 0),
            "pcie": [N.nvmlDeviceGetMaxPcieLinkGeneration(a), N.nvmlDeviceGetMaxPcieLinkWidth(a),
                     N.nvmlDeviceGetCurrPcieLinkGeneration(a), N.nvmlDeviceGetCurrPcieLinkWidth(a),
                     N.nvmlDeviceGetPcieThroughput(a, N.NVML_PCIE_UTIL_TX_BYTES),
                     N.nvmlDeviceGetPcieThroughput(a, N.NVML_PCIE_UTIL_RX_BYTES)],
            "pcie_bad_counter": err(N.nvmlDeviceGetPcieThroughput, a, 7),
            "t4_pcie": err(N.nvmlDeviceGetMaxPcieLinkGeneration, t),
            "nvlink_version": [N.nvmlDeviceGetNvLinkVersion(a, 0), err(N.nvmlDeviceGetNvLinkVersion, a, 12),
                               err(N.nvmlDeviceGetNvLinkVersion, t, 0)],
            "count": fields(a, [N.NVML_FI_DEV_NVLINK_LINK_COUNT, N.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON]),
            "speeds": fields(a, speeds),
            "t4_fields": fields(t, [N.NVML_FI_DEV_NVLINK_LINK_COUNT, (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)]),
            "odd_fields": fields(a, [N.NVML_FI_DEV_ECC_CURRENT, 100000, (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 12),
                                     N.NVML_FI_DEV_MEMORY_TEMP]),
            "t4_ecc_mode": fields(t, [N.NVML_FI_DEV_ECC_CURRENT]),
            "counter_growth": [y - x for x, y in zip(before, after)],
            "modes": [N.nvmlDeviceGetPersistenceMode(a), N.nvmlDeviceGetDisplayMode(a), N.nvmlDeviceGetDisplayActive(a),
                      N.nvmlDeviceGetPerformanceState(a), N.nvmlDeviceGetComputeMode(a),
                      err(N.nvmlDeviceGetCurrentDriverModel, a)],
            "ecc": [N.nvmlDeviceGetTotalEccErrors(a, N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC),
                    N.nvmlDeviceGetTotalEccErrors(a, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC),
                    err(N.nvmlDeviceGetTotalEccErrors, t, 0, 0), err(N.nvmlDeviceGetTotalEccErrors, a, 5, 0)],
            "bar1": [[b.bar1Total, b.bar1Used, b.bar1Free] for b in (N.nvmlDeviceGetBAR1MemoryInfo(a),)],
        }
        """,
        {"devices": [a100, t4, h100]},
    )
    assert out["enc"] == [7, 167000] and out["dec"] == [9, 167000] and out["t4_enc"] == "NVMLError_NotSupported"
    assert out["h100_codec"] == [[0, 100000], [4, 100000]]  # an H100's sampling period (driver 580, recorded)
    assert out["procs"] == [[11, 40, 12, 0]]  # a compute+graphics process is one sample; 12 has none
    assert out["procs_later"] == "NVMLError_NotFound" and out["t4_procs"] == "NVMLError_NotFound"
    assert out["pcie"] == [4, 16, 4, 16, 1500, 2500]
    assert out["pcie_bad_counter"] == "NVMLError_InvalidArgument" and out["t4_pcie"] == "NVMLError_NotSupported"
    assert out["nvlink_version"] == [4, "NVMLError_InvalidArgument", "NVMLError_NotSupported"]  # 4: NVLink 3.0
    assert out["count"] == [[0, 12], [0, 25781]]
    assert out["speeds"] == [[0, 25781]] * 12
    not_supported, invalid = 3, 2  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT
    assert [r for r, _ in out["t4_fields"]] == [not_supported, not_supported]
    # ECC mode 1 where ECC is there (an H100 on driver 580 answers so); unknown ids invalid; others unmodelled
    assert out["odd_fields"] == [[0, 1], [invalid, 0], [invalid, 0], [not_supported, 0]]
    assert [r for r, _ in out["t4_ecc_mode"]] == [not_supported]
    tx_growth, rx_growth = out["counter_growth"]  # KiB at 1 GiB/s and 512 MiB/s over >= 0.2 s
    assert tx_growth >= 0.2 * 2**20 and rx_growth >= 0.2 * 2**19 and tx_growth > rx_growth
    assert out["modes"] == [1, 0, 0, 2, 0, "NVMLError_NotSupported"]  # driver model: Windows only
    assert out["ecc"] == [3, 1, "NVMLError_NotSupported", "NVMLError_InvalidArgument"]
    assert out["bar1"] == [[128 * 2**30, 2 * 2**20, 128 * 2**30 - 2 * 2**20]]


def test_tools_queries_on_mig_devices(nvml):
    parent = fakenvml.make_device(0, mig_mode=1)
    busy = [{"pid": 5, "used_memory": 1, "sm_util": 3}]
    parent["mig_devices"] = [fakenvml.make_mig_device(parent, 0, processes=busy)]
    out = nvml(
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        out = {"parent": [err(N.nvmlDeviceGetEncoderUtilization, h), err(N.nvmlDeviceGetProcessUtilization, h, 0)],
               "mig": [err(N.nvmlDeviceGetEncoderUtilization, m), err(N.nvmlDeviceGetProcessUtilization, m, 0),
                       err(N.nvmlDeviceGetPcieThroughput, m, 0), err(N.nvmlDeviceGetPerformanceState, m),
                       N.nvmlDeviceGetFieldValues(m, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].nvmlReturn,
                       N.nvmlDeviceGetBAR1MemoryInfo(m).bar1Total]}
        """,
        {"devices": [parent]},
    )
    assert out["parent"] == ["NVMLError_NotSupported"] * 2  # nvml.h: not on MIG-enabled GPUs
    assert out["mig"] == ["NVMLError_NotSupported"] * 4 + [3, 128 * 2**30]


# ------------------------------------------------------------------ errors --


def test_calls_before_init_and_reference_counting(nvml):
    out = nvml(
        """
        out = {"before": err(N.nvmlDeviceGetCount)}  # pynvml has not even loaded the library yet
        N._LoadNvmlLibrary()
        v = ctypes.c_int()
        out["system_before_init"] = [raw("nvmlSystemGetNVMLVersion", ctypes.create_string_buffer(80), 80),
                                     raw("nvmlSystemGetDriverVersion", ctypes.create_string_buffer(80), 80),
                                     raw("nvmlSystemGetCudaDriverVersion", ctypes.byref(v)),
                                     raw("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(v))]
        N.nvmlInit(); N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        c = ctypes.c_uint()
        out["raw_before_shutdown"] = raw("nvmlDeviceGetCount_v2", ctypes.byref(c))
        N.nvmlShutdown()
        out["after_one_shutdown"] = N.nvmlDeviceGetCount()
        N.nvmlShutdown()
        out["raw_after"] = raw("nvmlDeviceGetCount_v2", ctypes.byref(c))
        out["name_after"] = err(N.nvmlDeviceGetName, h)
        out["driver_after"] = err(N.nvmlSystemGetDriverVersion)
        out["extra_shutdown"] = err(N.nvmlShutdown)
        """,
        {"devices": [fakenvml.make_device(0)]},
    )
    # Before init only the NVML version answers (driver 580, recorded): the CUDA version needs init too.
    assert out.pop("system_before_init") == [0, 1, 1, 1]
    assert out == {"before": "NVMLError_Uninitialized", "raw_before_shutdown": 0, "after_one_shutdown": 1,
                   "raw_after": 1, "name_after": "NVMLError_Uninitialized",
                   "driver_after": "NVMLError_Uninitialized", "extra_shutdown": "NVMLError_Uninitialized"}


def test_argument_errors_match_nvml(nvml):
    out = nvml(
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        buf = ctypes.create_string_buffer(96)
        count = ctypes.c_uint(0)
        infos = (N.c_nvmlProcessInfo_v3_t * 8)()
        bad_mem = N.c_nvmlMemory_v2_t(); bad_mem.version = 1
        bad_temp = N.c_nvmlTemperature_v1_t(); bad_temp.version = 1
        out = {
            "bad_index": err(N.nvmlDeviceGetHandleByIndex, 2),
            "unknown_uuid": err(N.nvmlDeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000"),
            "null_out": raw("nvmlDeviceGetCount_v2", None),
            "null_name": raw("nvmlDeviceGetName", h, None, 96),
            "null_handle": raw("nvmlDeviceGetName", None, buf, 96),
            "short_name": raw("nvmlDeviceGetName", h, buf, 4),
            "short_driver": raw("nvmlSystemGetDriverVersion", buf, 3),
            "bad_version": raw("nvmlDeviceGetMemoryInfo_v2", h, ctypes.byref(bad_mem)),
            "bad_temp_version": raw("nvmlDeviceGetTemperatureV", h, ctypes.byref(bad_temp)),
            "bad_clock": err(N.nvmlDeviceGetClockInfo, h, 17),
            "bad_max_clock": err(N.nvmlDeviceGetMaxClockInfo, h, 17),
            "procs_size": [raw("nvmlDeviceGetComputeRunningProcesses_v3", h, ctypes.byref(count), None), count.value],
        }
        count.value = 1
        rc = raw("nvmlDeviceGetComputeRunningProcesses_v3", h, ctypes.byref(count), infos)
        out["procs_small"] = [rc, count.value]
        count.value = 8
        out["procs_ok"] = [raw("nvmlDeviceGetComputeRunningProcesses_v3", h, ctypes.byref(count), infos),
                           count.value, infos[2].pid, infos[2].gpuInstanceId]
        out["strings"] = {str(c): N.nvmlErrorString(c) for c in (0, 1, 3, 9, 15, 999)}
        """,
        {"devices": [fakenvml.make_device(0, processes=[{"pid": p, "used_memory": 1} for p in (5, 6, 7)]),
                     fakenvml.make_device(1)]},
    )
    insufficient, invalid = 7, 2
    assert out["bad_index"] == "NVMLError_InvalidArgument" and out["unknown_uuid"] == "NVMLError_NotFound"
    assert (out["null_out"], out["null_name"], out["null_handle"]) == (invalid, invalid, invalid)
    assert (out["short_name"], out["short_driver"]) == (insufficient, insufficient)
    # As driver 580 answers (tests/fakenvml/recorded/h100.json): a wrong nvmlMemory_v2_t version is
    # FUNCTION_NOT_FOUND, a wrong nvmlTemperature_t version ARGUMENT_VERSION_MISMATCH; an unknown
    # clock type is NOT_SUPPORTED for the current clock, INVALID_ARGUMENT for the maximum.
    assert (out["bad_version"], out["bad_temp_version"]) == (13, 25)
    assert (out["bad_clock"], out["bad_max_clock"]) == ("NVMLError_NotSupported", "NVMLError_InvalidArgument")
    assert out["procs_size"] == [insufficient, 3] and out["procs_small"] == [insufficient, 3]
    assert out["procs_ok"] == [0, 3, 7, 0xFFFFFFFF]
    assert out["strings"] == {"0": "Success", "1": "Uninitialized", "3": "Not Supported",
                              "9": "Driver Not Loaded", "15": "GPU is lost", "999": "Unknown Error"}


def test_faults_raise_the_matching_exceptions(nvml):
    lost = fakenvml.make_device(1, faults={"*": "GPU_IS_LOST"})
    out = nvml(
        """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        out = {"count": N.nvmlDeviceGetCount(),
               "driver": err(N.nvmlSystemGetDriverVersion),
               "power": err(N.nvmlDeviceGetPowerUsage, h),
               "name": N.nvmlDeviceGetName(h),
               "lost_by_index": err(N.nvmlDeviceGetHandleByIndex, 1),
               "lost_by_uuid": err(N.nvmlDeviceGetHandleByUUID, config()["devices"][1]["uuid"])}
        cfg = config()
        cfg["faults"] = {"nvmlInit": "DRIVER_NOT_LOADED"}
        write(cfg)
        out["init"] = err(N.nvmlInit)
        cfg["faults"] = {"nvmlShutdown": "UNKNOWN"}
        write(cfg)
        out["shutdown"] = err(N.nvmlShutdown)
        """,
        {"faults": {"nvmlSystemGetDriverVersion": "NO_PERMISSION"},
         "devices": [fakenvml.make_device(0, faults={"nvmlDeviceGetPowerUsage": "NOT_SUPPORTED"}), lost]},
    )
    assert out == {"count": 2, "driver": "NVMLError_NoPermission", "power": "NVMLError_NotSupported",
                   "name": "NVIDIA A100-SXM4-80GB", "lost_by_index": "NVMLError_GpuIsLost",
                   "lost_by_uuid": "NVMLError_GpuIsLost", "init": "NVMLError_DriverNotLoaded",
                   "shutdown": "NVMLError_Unknown"}


def test_every_nvml_error_name_can_be_injected(nvml):
    header = nvml_header().read_text()
    codes = {m[1]: int(m[2]) for m in re.finditer(r"NVML_ERROR_([A-Z0-9_]+)\s*=\s*(\d+)", header)}
    assert len(codes) > 25
    out = nvml(
        """
        N.nvmlInit()
        cfg, out = config(), {}
        for name in json.loads(os.environ["ERROR_NAMES"]):
            cfg["faults"] = {"nvmlSystemGetDriverVersion": name}
            write(cfg)  # picked up on the next call
            out[name] = N._nvmlGetFunctionPointer("nvmlSystemGetDriverVersion")(
                ctypes.create_string_buffer(80), 80)
        """,
        {"devices": [fakenvml.make_device(0)]},
        ERROR_NAMES=json.dumps(sorted(codes)),
    )
    assert out == codes


def test_no_driver_no_gpus_and_no_library(nvml):
    no_config = nvml("out = err(N.nvmlInit)")
    assert no_config == "NVMLError_DriverNotLoaded"
    missing_file = nvml("out = err(N.nvmlInit)", FAKENVML_CONFIG="/nonexistent/gpus.json")
    assert missing_file == "NVMLError_DriverNotLoaded"
    # The driver is there but sees no GPU: init fails unless told not to.
    no_gpus = nvml(
        """
        out = [err(N.nvmlInit)]
        N.nvmlInitWithFlags(N.NVML_INIT_FLAG_NO_GPUS)
        out.append(N.nvmlDeviceGetCount())
        """,
        {"devices": []},
    )
    assert no_gpus == ["NVMLError_GpuNotFound", 0]
    no_library = nvml("out = err(N.nvmlInit)", {"devices": [fakenvml.make_device(0)]}, libdir_on_path=False)
    if no_library != "NVMLError_LibraryNotFound":
        pytest.skip("a real libnvidia-ml.so.1 is installed on this machine")


# -------------------------------------------------------------- visibility --

HOST = [fakenvml.make_device(i) for i in range(3)]
HOST.append(fakenvml.make_device(3, mig_mode=1))
HOST[3]["mig_devices"] = [fakenvml.make_mig_device(HOST[3], i) for i in range(2)]
LIST_LINES = """
N.nvmlInit()
out = []
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    n = N.nvmlDeviceGetMaxMigDeviceCount(h)
    migs = [N.nvmlDeviceGetMigDeviceHandleByIndex(h, j) for j in range(n)
            if not isinstance(err(N.nvmlDeviceGetMigDeviceHandleByIndex, h, j), str)]
    out.append([N.nvmlDeviceGetIndex(h), N.nvmlDeviceGetUUID(h), [N.nvmlDeviceGetUUID(m) for m in migs]])
"""


def seen(*host_indexes, migs=None):
    """Expected listing: visible host devices renumbered 0..k-1 in host order."""
    rows = []
    for new, i in enumerate(host_indexes):
        mig_uuids = [m["uuid"] for m in HOST[i].get("mig_devices", [])]
        rows.append([new, HOST[i]["uuid"], migs if (migs is not None and i == 3) else mig_uuids])
    return rows


@pytest.mark.parametrize(
    "variables, expected",
    [
        ({"NVIDIA_VISIBLE_DEVICES": "2,0"}, seen(0, 2)),
        ({"NVIDIA_VISIBLE_DEVICES": HOST[1]["uuid"]}, seen(1)),
        ({"NVIDIA_VISIBLE_DEVICES": HOST[3]["mig_devices"][1]["uuid"]},
         seen(3, migs=[HOST[3]["mig_devices"][1]["uuid"]])),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, seen(0, 1, 2, 3)),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": ""}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}, seen(1)),
        ({"CUDA_VISIBLE_DEVICES": "3,1"}, seen(1, 3)),
        ({}, []),
    ],
    ids=["indexes", "gpu-uuid", "mig-uuid", "all", "none", "void", "empty", "nvidia-first", "cuda-fallback", "unset"],
)
def test_container_sees_only_mounted_devices(nvml, variables, expected):
    assert nvml(LIST_LINES, {"devices": HOST}, container=True, **variables) == expected


def test_host_sees_every_gpu_whatever_cuda_visible_devices(nvml):
    assert nvml(LIST_LINES, {"devices": HOST}, CUDA_VISIBLE_DEVICES="1") == seen(0, 1, 2, 3)
    # "container": true in the file works like FAKENVML_CONTAINER=1.
    assert nvml(LIST_LINES, {"container": True, "devices": HOST}, NVIDIA_VISIBLE_DEVICES="3") == seen(3)


# ------------------------------------------------------------ device nodes --

# Handles for every counted GPU, by index, UUID and PCI bus id (and a MIG device
# by its UUID); where FENCE_PROCS names a cgroup's cgroup.procs the process
# joins that cgroup halfway, after nvmlInit, as a fence set up later would.
NODE_HANDLES = """
def handles():
    cfg = config()
    got = {"count": N.nvmlDeviceGetCount()}
    got["index"] = [err(lambda i: N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(i)), i)
                    for i in range(got["count"])]
    got["uuid"] = [err(lambda u: N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(u)), d["uuid"])
                   for d in cfg["devices"]]
    got["pci"] = [err(lambda b: N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(b)), d["pci_bus_id"])
                  for d in cfg["devices"]]
    got["mig"] = [err(lambda u: N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByUUID(u)), m["uuid"])
                  for d in cfg["devices"] for m in d.get("mig_devices", [])]
    return got

N.nvmlInit()
out = [handles()]
if os.environ.get("FENCE_PROCS"):
    with open(os.environ["FENCE_PROCS"], "w") as f:
        f.write(str(os.getpid()))
    out.append(handles())
"""


def gpus_with_nodes(nodes: list[Path]) -> list[dict]:
    devices = [fakenvml.make_device(i, device_node=str(node)) for i, node in enumerate(nodes)]
    devices[1].update(mig_mode=1, mig_devices=[fakenvml.make_mig_device(devices[1], 0)])
    return devices


def test_gpus_name_their_device_node(nvml, tmp_path):
    # A node that opens (any file will do) gives handles as before; a node that
    # is not there makes its GPU NOT_FOUND, still counted.
    present = tmp_path / "nvidia0"
    present.write_bytes(b"")
    devices = gpus_with_nodes([present, tmp_path / "nvidia1"])
    [out] = nvml(NODE_HANDLES, {"devices": devices})
    uuid0 = devices[0]["uuid"]
    assert out == {"count": 2, "index": [uuid0, "NVMLError_NotFound"], "uuid": [0, "NVMLError_NotFound"],
                   "pci": [0, "NVMLError_NotFound"], "mig": ["NVMLError_NotFound"]}


def test_a_device_cgroup_makes_a_gpu_no_permission(nvml, tmp_path):
    with devcgroup.group("fakenvml") as fence:
        devcgroup.deny(fence, [1])
        devices = gpus_with_nodes(devcgroup.gpu_nodes(tmp_path / "dev", [0, 1]))
        before, fenced = nvml(NODE_HANDLES, {"devices": devices}, FENCE_PROCS=str(fence / "cgroup.procs"))
    uuids = [d["uuid"] for d in devices]
    mig_name = f"{devices[1]['name']} MIG 1g.10gb"
    # Outside the cgroup both mknod'ed nodes open (ENXIO: no driver, which is not a refusal).
    assert before == {"count": 2, "index": uuids, "uuid": [0, 1], "pci": [0, 1], "mig": [mig_name]}
    # Inside it GPU 1 is still counted, but the kernel refuses its node: no handle, by any key.
    denied = "NVMLError_NoPermission"
    assert fenced == {"count": 2, "index": [uuids[0], denied], "uuid": [0, denied], "pci": [0, denied],
                      "mig": [denied]}


# --------------------------------------------------------- reload, counts --


def test_live_reload_keeps_handles(nvml):
    out = nvml(
        """
        N.nvmlInit()
        h1 = N.nvmlDeviceGetHandleByIndex(1)
        cfg = config()
        out = [N.nvmlDeviceGetUtilizationRates(h1).gpu]
        cfg["devices"][1]["utilization_gpu"] = 97
        cfg["devices"][1]["memory_used"] = 2**30
        write(cfg)
        out += [N.nvmlDeviceGetUtilizationRates(h1).gpu, N.nvmlDeviceGetMemoryInfo(h1).used]
        with open(os.environ["FAKENVML_CONFIG"], "w") as f:
            f.write("{ broken")  # a bad file keeps the last good state
        out.append(N.nvmlDeviceGetUtilizationRates(h1).gpu)
        cfg["devices"] = cfg["devices"][:1]
        write(cfg)
        out += [N.nvmlDeviceGetCount(), err(N.nvmlDeviceGetName, h1)]
        """,
        {"devices": [fakenvml.make_device(0), fakenvml.make_device(1, utilization_gpu=5)]},
    )
    assert out == [5, 97, 2**30, 97, 1, "NVMLError_GpuIsLost"]


def test_call_counts_are_shared_between_processes(nvml, tmp_path):
    counts = tmp_path / "counts.bin"
    code = """
        N.nvmlInit()
        def work():
            for _ in range(250):
                N.nvmlDeviceGetCount()
        threads = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        out = N.nvmlDeviceGetCount()
        """
    config = {"devices": [fakenvml.make_device(0)]}
    nvml(code, config, counts=counts)
    first = fakenvml.read_counts(counts)
    assert first["nvmlInitWithFlags"] == 1 and first["nvmlDeviceGetCount_v2"] == 1001
    nvml(code, config, counts=counts)
    second = fakenvml.read_counts(counts)
    assert second["nvmlInitWithFlags"] == 2 and second["nvmlDeviceGetCount_v2"] == 2002
    assert "nvmlDeviceGetName" not in second
