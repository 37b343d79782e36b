"""Helpers for the stand-in ``libnvidia-ml.so.1`` ("GPUs without GPUs").

The library is C, built by ``build.sh`` against the official ``nvml.h``; the
real nvidia-ml-py bindings load it through the dynamic linker. It reads its
devices from the JSON file named by ``FAKENVML_CONFIG``; README.md beside
this file documents the format and the behaviours it reproduces.

Typical use in a test (``tests/`` is on pytest's ``pythonpath``, set in pyproject.toml)::

    import fakenvml

    libdir = fakenvml.build(tmp_path / "lib")
    fakenvml.write_config(tmp_path / "gpus.json", {"devices": [fakenvml.make_device(0)]})
    env = {**os.environ, **fakenvml.env(libdir, tmp_path / "gpus.json")}
    subprocess.run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], env=env, check=True)

``LD_LIBRARY_PATH`` is read by the dynamic linker when a process starts, so the
library is used by processes started with :func:`env`'s variables (or loaded
explicitly by path with ``ctypes.CDLL`` before pynvml loads it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "LIBRARY_NAME",
    "SOURCE_DIR",
    "build",
    "write_config",
    "env",
    "read_counts",
    "make_device",
    "make_mig_device",
    "recorded_host",
    "RECORDED",
    "LAYOUTS",
    "layout",
]

SOURCE_DIR = Path(__file__).resolve().parent
LIBRARY_NAME = "libnvidia-ml.so.1"
#: Recordings of real GPU hosts by benchmarks/real_gpu_probe.py (see README.md, "Recorded hosts").
RECORDED = SOURCE_DIR / "recorded"

# One record of the FAKENVML_COUNTS file: char name[64]; uint64_t count (host order).
_COUNT_RECORD = struct.Struct("=64sQ")


def build(outdir: str | os.PathLike, without_memory_v2: bool = False) -> Path:
    """Build (or reuse, if up to date) ``outdir/libnvidia-ml.so.1``; return ``outdir``.

    ``without_memory_v2``: a library without ``nvmlDeviceGetMemoryInfo_v2`` (the
    symbol is absent, as in drivers before 510); give it an ``outdir`` of its own.

    Runs ``build.sh`` with this interpreter as ``PYTHON`` (it locates ``nvml.h``
    through the ``nvidia`` package). Raises ``RuntimeError`` with the compiler's
    output when the build fails.
    """
    outdir = Path(outdir)
    proc = subprocess.run(
        ["bash", str(SOURCE_DIR / "build.sh"), str(outdir), *(["--without-memory-v2"] if without_memory_v2 else [])],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building the stand-in NVML failed:\n{proc.stdout}{proc.stderr}")
    return outdir.resolve()


def write_config(path: str | os.PathLike, config: Mapping[str, Any]) -> None:
    """Write the device file atomically (temporary file + ``os.replace``).

    A process reloading it live never sees half a file; the replacement also
    changes the file's identity, so even two writes within one timestamp tick
    are noticed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o644)  # servers running as other users read it too
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def env(
    libdir: str | os.PathLike,
    config_path: str | os.PathLike | None,
    counts_path: str | os.PathLike | None = None,
    container: bool = False,
) -> dict[str, str]:
    """Environment variables that make a new process use the stand-in.

    Merge them over the parent's: ``{**os.environ, **env(...)}``. All four
    variables are always set, so nothing inherited leaks in: ``config_path``
    None means "no driver" (``nvmlInit`` fails with DRIVER_NOT_LOADED),
    ``counts_path`` None means no call counting, ``container`` False means
    host visibility (every GPU). With ``container=True`` the visible devices
    come from ``NVIDIA_VISIBLE_DEVICES`` (else ``CUDA_VISIBLE_DEVICES``), which
    the caller sets as it wants.
    """
    libdir = os.path.abspath(libdir)  # paths stay right whatever the child's working directory
    inherited = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and p != libdir]
    return {
        "LD_LIBRARY_PATH": ":".join([libdir, *inherited]),
        "FAKENVML_CONFIG": os.path.abspath(config_path) if config_path is not None else "",
        "FAKENVML_COUNTS": os.path.abspath(counts_path) if counts_path is not None else "",
        "FAKENVML_CONTAINER": "1" if container else "0",
    }


def read_counts(counts_path: str | os.PathLike) -> dict[str, int]:
    """Calls per exported NVML function recorded in a ``FAKENVML_COUNTS`` file.

    Safe to call while processes are still counting; a missing file reads as
    no calls.
    """
    try:
        data = Path(counts_path).read_bytes()
    except FileNotFoundError:
        return {}
    counts: dict[str, int] = {}
    for offset in range(0, len(data) - _COUNT_RECORD.size + 1, _COUNT_RECORD.size):
        raw, count = _COUNT_RECORD.unpack_from(data, offset)
        if raw[:8] in (b"\0" * 8, b"\xff" * 8):  # free, or being claimed
            continue
        name = raw.split(b"\0", 1)[0].decode("ascii", "replace")
        counts[name] = counts.get(name, 0) + count
    return counts


# ------------------------------------------------------------------ devices --

_A100_80GB = {
    "memory_total": 80 * 1024**3,
    "compute_capability": [8, 0],
    "architecture": "AMPERE",
    "pci_device_id": 0x20B210DE,
    "temperature": 32,
    "power_usage": 61_000,
    "power_limit": 400_000,
    "clocks": {"graphics": 1410, "sm": 1410, "memory": 1593, "video": 1275},
    "max_clocks": {"graphics": 1410, "sm": 1410, "memory": 1593, "video": 1290},
    "fan_speed": None,  # passively cooled: NVML answers NOT_SUPPORTED
    "mig_mode": 0,
    "pcie": {"max_generation": 4, "max_width": 16, "generation": 4, "width": 16, "tx_kbps": 0, "rx_kbps": 0},
    "nvlink": {"version": "3.0", "links": 12, "speed_mbps": 25781, "tx_kibps": 0, "rx_kibps": 0},
    "bar1_memory_total": 128 * 1024**3,
    "bar1_memory_used": 2 * 1024**2,
}

_T4 = {
    "memory_total": 15 * 1024**3,
    "compute_capability": [7, 5],
    "architecture": "TURING",
    "pci_device_id": 0x1EB810DE,
    "temperature": 30,
    "power_usage": 9_000,
    "power_limit": 70_000,
    "clocks": {"graphics": 585, "sm": 585, "memory": 5000, "video": 540},
    "max_clocks": {"graphics": 1590, "sm": 1590, "memory": 5001, "video": 1470},
    "fan_speed": None,
    # no "mig_mode": a T4 cannot do MIG, nvmlDeviceGetMigMode is NOT_SUPPORTED
    "pcie": {"max_generation": 3, "max_width": 16, "generation": 3, "width": 16, "tx_kbps": 0, "rx_kbps": 0},
    # no "nvlink": a T4 has none, NVLink queries are NOT_SUPPORTED
    "bar1_memory_total": 256 * 1024**2,
    "bar1_memory_used": 2 * 1024**2,
}

# An idle H100 SXM5 as driver 580.159.04 reports it (recorded/h100.json): idle clocks, the memory
# the driver reserves, display mode 1, a 100 ms encoder/decoder sampling period.
_H100_80GB = {
    "memory_total": 81559 * 1024**2,
    "memory_reserved": 480 * 1024**2,
    "compute_capability": [9, 0],
    "architecture": "HOPPER",
    "pci_device_id": 0x233010DE,
    "pci_subsystem_id": 0x16C110DE,
    "temperature": 34,
    "power_usage": 71_000,
    "power_limit": 700_000,
    "clocks": {"graphics": 345, "sm": 345, "memory": 2619, "video": 765},
    "max_clocks": {"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1545},
    "fan_speed": None,
    "mig_mode": 0,
    "display_mode": 1,
    "codec_sampling_period_us": 100_000,
    "pcie": {"max_generation": 5, "max_width": 16, "generation": 5, "width": 16, "tx_kbps": 0, "rx_kbps": 0},
    "nvlink": {"version": "4.0", "links": 18, "speed_mbps": 26562, "tx_kibps": 0, "rx_kibps": 0},
    "bar1_memory_total": 128 * 1024**3,
    "bar1_memory_used": 1664 * 1024,
}

# What every model reports the same way (tools' queries: nvitop, gpustat, nvdashboard).
_COMMON = {
    "encoder_utilization": 0,
    "decoder_utilization": 0,
    "persistence_mode": 1,
    "display_mode": 0,
    "display_active": 0,
    "performance_state": 0,
    "compute_mode": 0,
    "ecc_errors": {"corrected": 0, "uncorrected": 0},
}


def _profile(name: str) -> dict[str, Any]:
    upper = name.upper()
    if "T4" in re.split(r"[^A-Z0-9]+", upper):
        return dict(_T4)
    if "H100" in upper:
        profile = dict(_H100_80GB)
    else:
        profile = dict(_A100_80GB)  # A100 80GB, also the template for other names
    if "A100" in upper and "40GB" in upper:
        profile["memory_total"] = 40 * 1024**3
        profile["pci_device_id"] = 0x20B010DE
    if "A100" in upper and "PCIE" in upper:
        profile["power_limit"] = 250_000 if "40GB" in upper else 300_000
    if "PCIE" in upper:
        del profile["nvlink"]  # PCIe cards: no NVLink (without a bridge)
    return profile


def _digest(*parts: object) -> str:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()


def _uuid_body(hexdigits: str) -> str:
    h = hexdigits
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def make_device(index: int, name: str = "NVIDIA A100-SXM4-80GB", **overrides: Any) -> dict[str, Any]:
    """A realistic device entry for the device file.

    The UUID (``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``), serial and PCI bus
    id are derived from ``index`` and ``name``, so the same arguments give the
    same device. Memory, compute capability, power limit, clocks and MIG
    support follow the model in ``name``: A100 80GB (default; 40GB/PCIe
    variants adjusted), Tesla T4 (no MIG support), H100 80GB. Keyword
    arguments replace top-level keys (``memory_used=...``, ``mig_mode=1``,
    ``mig_devices=[...]``, ``faults={...}``, ``fan_speed=None``,
    ``device_node="/dev/nvidia0"`` ...).
    """
    digest = _digest("fakenvml-gpu", index, name)
    device: dict[str, Any] = {
        "uuid": f"GPU-{_uuid_body(digest)}",
        "name": name,
        "serial": f"132{int(digest[32:48], 16) % 10**10:010d}",
        "pci_bus_id": f"{index // 32:08X}:{0x07 + (index % 32) * 8:02X}:00.0",
        "minor_number": index,
        "brand": "NVIDIA",
        "memory_used": 0,
        "memory_reserved": 0,
        "utilization_gpu": 0,
        "utilization_memory": 0,
        "processes": [],
        **copy.deepcopy(_COMMON),
    }
    device.update(copy.deepcopy(_profile(name)))
    device.update(overrides)
    return device


def make_mig_device(
    parent: Mapping[str, Any], index: int, profile: str = "1g.10gb", **overrides: Any
) -> dict[str, Any]:
    """A MIG device entry for ``parent["mig_devices"]`` (the parent needs ``mig_mode=1``).

    ``profile`` is the MIG profile name (``"1g.10gb"``, ``"3g.40gb"`` ...); its
    memory is 95% of the profile's GiB, as the driver keeps some back
    (1g.10gb -> 9728 MiB). UUID derived from the parent's UUID and ``index``.
    """
    match = re.search(r"(\d+)gb", profile)
    gib = int(match.group(1)) if match else 10
    entry: dict[str, Any] = {
        "uuid": f"MIG-{_uuid_body(_digest('fakenvml-mig', parent.get('uuid', ''), index))}",
        "profile": profile,
        "memory_total": gib * 1024 * 95 // 100 * 1024**2,
        "memory_used": 0,
        "gpu_instance_id": index + 1,
        "compute_instance_id": 0,
        "processes": [],
    }
    entry.update(overrides)
    return entry



def _answer(nvml: Mapping[str, Any], label: str) -> Any:
    """A recorded NVML answer's value; None where the driver refused it (NOT_SUPPORTED ...)."""
    answer = nvml.get(label) or {}
    return answer.get("value")


def _bits(words: list[int]) -> list[int]:
    return [64 * w + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]


def recorded_host(recording: Mapping[str, Any]) -> dict[str, Any]:
    """The device file of the host a ``benchmarks/real_gpu_probe.py`` recording was made on.

    Its GPU 0 (the one the probe asked everything of) as :func:`make_device` describes its model,
    with what the driver answered there: identity (UUID, serial, PCI location and ids), driver,
    NVML and CUDA versions, memory (total, reserved, used), idle clocks, power, temperature, PCIe,
    modes, ECC and BAR1 figures, the codec sampling period, MIG mode, the NUMA node and its CPUs,
    and NVLink only where the driver answered NVLink queries. Nothing else is invented: a query the
    driver refused is left out (``NOT_SUPPORTED``), so behaviour is what remains to compare
    (tests/unit/test_fakenvml_fidelity.py).
    """
    nvml = recording["nvml"]
    name = _answer(nvml, "nvmlDeviceGetName")
    pci = _answer(nvml, "nvmlDeviceGetPciInfo")
    memory = _answer(nvml, "nvmlDeviceGetMemoryInfo_v2")
    clocks = ("graphics", "sm", "memory", "video")  # nvmlClockType_t 0..3
    util = _answer(nvml, "nvmlDeviceGetUtilizationRates")
    encoder = _answer(nvml, "nvmlDeviceGetEncoderUtilization")
    decoder = _answer(nvml, "nvmlDeviceGetDecoderUtilization")
    bar1 = _answer(nvml, "nvmlDeviceGetBAR1MemoryInfo")
    mig = _answer(nvml, "nvmlDeviceGetMigMode")
    device = make_device(
        _answer(nvml, "nvmlDeviceGetIndex") or 0, name,
        uuid=_answer(nvml, "nvmlDeviceGetUUID"), serial=_answer(nvml, "nvmlDeviceGetSerial"),
        pci_bus_id=pci["busId"], pci_device_id=pci["pciDeviceId"], pci_subsystem_id=pci["pciSubSystemId"],
        minor_number=_answer(nvml, "nvmlDeviceGetMinorNumber"),
        brand=_answer(nvml, "nvmlDeviceGetBrand"), architecture=_answer(nvml, "nvmlDeviceGetArchitecture"),
        compute_capability=_answer(nvml, "nvmlDeviceGetCudaComputeCapability"),
        memory_total=memory["total"], memory_reserved=memory["reserved"], memory_used=memory["used"],
        utilization_gpu=util["gpu"] if util else None, utilization_memory=util["memory"] if util else None,
        temperature=_answer(nvml, "nvmlDeviceGetTemperature(GPU)"),
        power_usage=_answer(nvml, "nvmlDeviceGetPowerUsage"),
        power_limit=_answer(nvml, "nvmlDeviceGetPowerManagementLimit"),
        enforced_power_limit=_answer(nvml, "nvmlDeviceGetEnforcedPowerLimit"),
        clocks={c: _answer(nvml, f"nvmlDeviceGetClockInfo({i})") for i, c in enumerate(clocks)},
        max_clocks={c: _answer(nvml, f"nvmlDeviceGetMaxClockInfo({i})") for i, c in enumerate(clocks)},
        fan_speed=_answer(nvml, "nvmlDeviceGetFanSpeed"),
        mig_mode=mig[0] if mig else None, mig_pending_mode=mig[1] if mig else None,
        encoder_utilization=encoder[0] if encoder else None, decoder_utilization=decoder[0] if decoder else None,
        codec_sampling_period_us=(encoder or decoder or [None, 167000])[1],
        persistence_mode=_answer(nvml, "nvmlDeviceGetPersistenceMode"),
        display_mode=_answer(nvml, "nvmlDeviceGetDisplayMode"),
        display_active=_answer(nvml, "nvmlDeviceGetDisplayActive"),
        performance_state=_answer(nvml, "nvmlDeviceGetPerformanceState"),
        compute_mode=_answer(nvml, "nvmlDeviceGetComputeMode"),
        ecc_errors={"corrected": _answer(nvml, "nvmlDeviceGetTotalEccErrors(corrected,volatile)"),
                    "uncorrected": _answer(nvml, "nvmlDeviceGetTotalEccErrors(uncorrected,aggregate)")},
        bar1_memory_total=bar1["bar1Total"] if bar1 else None, bar1_memory_used=bar1["bar1Used"] if bar1 else None,
        pcie={"max_generation": _answer(nvml, "nvmlDeviceGetMaxPcieLinkGeneration"),
              "max_width": _answer(nvml, "nvmlDeviceGetMaxPcieLinkWidth"),
              "generation": _answer(nvml, "nvmlDeviceGetCurrPcieLinkGeneration"),
              "width": _answer(nvml, "nvmlDeviceGetCurrPcieLinkWidth"),
              "tx_kbps": _answer(nvml, "nvmlDeviceGetPcieThroughput(TX)"),
              "rx_kbps": _answer(nvml, "nvmlDeviceGetPcieThroughput(RX)")},
    )
    if device["ecc_errors"]["corrected"] is None:
        device["ecc_errors"] = None
    if _answer(nvml, "nvmlDeviceGetNvLinkVersion(0)") is None:
        device.pop("nvlink", None)  # the driver answered no NVLink query here
    config: dict[str, Any] = {
        "driver_version": _answer(nvml, "nvmlSystemGetDriverVersion"),
        "nvml_version": _answer(nvml, "nvmlSystemGetNVMLVersion"),
        "cuda_driver_version": _answer(nvml, "nvmlSystemGetCudaDriverVersion_v2"),
        "devices": [device],
    }
    cpus = _answer(nvml, "nvmlDeviceGetCpuAffinity(16)")
    nodes = _answer(nvml, "nvmlDeviceGetMemoryAffinity(1,node)")
    if cpus and nodes and len(_bits(nodes)) == 1:  # one NUMA node near the GPU, with these CPUs
        node = _bits(nodes)[0]
        config["topology"] = {"numa_nodes": [{"cpus": [], "socket": 0}] * node + [
            {"cpus": _bits(cpus), "socket": 0}]}
        device["numa_node"] = node
    return config

from .layouts import LAYOUTS, layout  # noqa: E402  (layouts uses make_device, defined above)
