"""The monitor's numbers beside nvitop's and gpustat's on the same stand-in devices.

Users check the monitor against nvidia-smi, nvitop and gpustat. Here the real
tools (their Python APIs, from the test extras) and a real jupyter_server with
the monitor read the same stand-in libnvidia-ml: a process with a compute and a
graphics context (C+G), memory the driver reserves, a GPU in MIG mode with a
process on a MIG device, a process from another PID namespace, a GPU that
cannot do MIG and an enforced power limit below the management limit. Where
they measure the same thing they must agree field by field; where they differ
on purpose (the power limit) the README says which the monitor shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

import fakenvml
from gpuspawner.monitor.visibility import CUDA_HIDDEN_BY_MIG, CUDA_MIG_PARENT, CUDA_ONE_MIG, CUDA_ORDER_UNKNOWN
from gpuspawner.nvml import MEMORY_V1_ONLY
from jupyter_server_proc import JupyterServer
from needs import module

pytestmark = pytest.mark.monitor

module("nvitop", "nvitop is not installed (pip install -e '.[test]')")
module("gpustat", "gpustat is not installed (pip install -e '.[test]')")

GiB, MiB = 2**30, 2**20

# What nvitop and gpustat say about every GPU, read in a process of its own (the
# stand-in is found through LD_LIBRARY_PATH at process start).
TOOLS = r"""
import json
import nvitop
from gpustat import new_query

def value(x):
    return None if x == nvitop.NA else x

out = {"nvitop": {}, "gpustat": {}}
for d in nvitop.Device.all():
    mig = d.is_mig_mode_enabled()
    info = d.memory_info()
    out["nvitop"][d.uuid()] = {
        "memory_used": value(d.memory_used()), "memory_total": value(d.memory_total()),
        "memory_reserved": value(getattr(info, "reserved", nvitop.NA)),
        "temperature": value(d.temperature()), "utilization_gpu": value(d.gpu_utilization()),
        "power_limit": value(d.power_limit()), "mig_mode": mig,
        "processes": {str(pid): [p.type, value(p.gpu_memory())] for pid, p in d.processes().items()},
        "mig": [{"uuid": m.uuid(), "memory_used": value(m.memory_used()), "memory_total": value(m.memory_total())}
                for m in (d.mig_devices() if mig else [])],
    }
cuda = []
for entry in nvitop.Device.parse_cuda_visible_devices():
    if isinstance(entry, tuple):
        cuda.append(nvitop.MigDevice(index=entry).uuid())
    else:
        cuda.append(nvitop.Device(index=entry).uuid())
out["nvitop_cuda"] = cuda
for g in new_query().jsonify()["gpus"]:
    out["gpustat"][g["uuid"]] = g
print(json.dumps(out))
"""


def tools_view(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", TOOLS], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Function Not Found" not in proc.stderr and "not found" not in proc.stderr.lower(), proc.stderr
    return json.loads(proc.stdout)


def prometheus(text: str, name: str, labels: dict[str, str]) -> list[float]:
    """The values of metric ``name`` whose labels include ``labels``."""
    return [s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()]


@pytest.fixture
def sleeper():
    """A real process of this PID namespace for the GPU's process lists (gpustat leaves out pids it cannot see)."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc.pid
    proc.kill()
    proc.wait()


def hidden_pid() -> int:
    """A pid that does not exist here: a process from another PID namespace (a container)."""
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


def the_devices(sleeper: int, hidden: int) -> list[dict]:
    """An H100 (a C+G process, reserved memory), an A100 in MIG mode, a T4 with a lowered enforced limit."""
    h100 = fakenvml.make_device(0, "NVIDIA H100 80GB HBM3", memory_used=15 * GiB, memory_reserved=2800 * MiB,
                                utilization_gpu=61, temperature=47,
                                processes=[{"pid": sleeper, "used_memory": 7680 * MiB},
                                           {"pid": hidden, "used_memory": 3 * GiB}],
                                graphics_processes=[{"pid": sleeper, "used_memory": 7680 * MiB}])
    a100 = fakenvml.make_device(1, mig_mode=1, memory_used=GiB, memory_reserved=600 * MiB)
    a100["mig_devices"] = [
        fakenvml.make_mig_device(a100, 0, memory_used=GiB, memory_reserved=20 * MiB,
                                 processes=[{"pid": hidden + 1, "used_memory": GiB}]),
        fakenvml.make_mig_device(a100, 1, "3g.40gb", memory_used=0),
    ]
    t4 = fakenvml.make_device(2, "Tesla T4", memory_used=2 * GiB, memory_reserved=250 * MiB, utilization_gpu=12,
                              power_limit=70_000, enforced_power_limit=60_000)
    return [h100, a100, t4]


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)


def stand_in_env(libdir, tmp_path, **extra: str) -> dict[str, str]:
    return {**fakenvml.env(libdir, tmp_path / "gpus.json"), **extra}


def server_on(tmp_path, libdir, devices: list[dict], **extra: str) -> JupyterServer:
    fakenvml.write_config(tmp_path / "gpus.json", {"devices": devices})
    return JupyterServer(tmp_path / "server", stand_in_env(libdir, tmp_path, **extra), ["--GPUMonitor.interval=0.5"])


def test_monitor_agrees_with_nvitop_and_gpustat(tmp_path, fakenvml_libdir, clean_env, sleeper):
    hidden = hidden_pid()
    devices = the_devices(sleeper, hidden)
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    with server_on(tmp_path, fakenvml_libdir, devices, **env) as server:
        sample = server.wait_for(lambda s: s["gpus"] and s["gpus"][0]["processes"], what="the H100's processes")
        tools = tools_view(stand_in_env(fakenvml_libdir, tmp_path, **env))
        metrics = server.get("api/gpus/metrics").text
    gpus = {g["uuid"]: g for g in sample["gpus"]}
    assert list(gpus) == [d["uuid"] for d in devices]
    for uuid, gpu in gpus.items():
        top, stat = tools["nvitop"][uuid], tools["gpustat"][uuid]
        for key in ("memory_used", "memory_total", "memory_reserved", "temperature", "utilization_gpu", "mig_mode"):
            assert gpu[key] == top[key], (gpu["name"], key)
        # gpustat: MiB, whole watts, the enforced limit
        assert (gpu["memory_used"] // MiB, gpu["memory_total"] // MiB) == (stat["memory.used"], stat["memory.total"])
        assert (gpu["temperature"], gpu["utilization_gpu"]) == (stat["temperature.gpu"], stat["utilization.gpu"])
        assert round(gpu["power_limit"]) == stat["enforced.power.limit"]
        # each process once, with nvitop's type and memory (C+G counted once), the other namespace's too
        processes = {str(p["pid"]): [p["type"], p["used_memory"]] for p in gpu["processes"]}
        assert processes == top["processes"], gpu["name"]
        assert {str(p["pid"]): p["gpu_memory_usage"] for p in stat["processes"]} == {
            pid: memory // MiB for pid, (_, memory) in processes.items() if int(pid) < hidden}  # the visible ones
        assert [{k: m[k] for k in ("uuid", "memory_used", "memory_total")} for m in gpu["mig"]] == top["mig"]

    h100, a100, t4 = gpus.values()
    # what the user reads: nvidia-smi's used memory, reserved apart, processes adding up to no more than used
    assert (h100["memory_used"], h100["memory_reserved"]) == (15 * GiB, 2800 * MiB)
    assert h100["processes"][0] == {**h100["processes"][0], "pid": sleeper, "type": "C+G", "used_memory": 7680 * MiB}
    assert sum(p["used_memory"] for p in h100["processes"]) <= h100["memory_used"]
    assert [m["memory_reserved"] for m in a100["mig"]] == [20 * MiB, 0]
    # mig_mode: false on a GPU that cannot do MIG, without a reason; the A100's MIG mode, without a reason
    assert (t4["mig_mode"], a100["mig_mode"], h100["mig_mode"]) == (False, True, False)
    assert not {"mig_mode"} & (set(t4["na"]) | set(a100["na"]) | set(h100["na"]))
    # the power limit: the enforced one, as gpustat; nvitop shows the management limit (README)
    assert (t4["power_limit"], tools["nvitop"][t4["uuid"]]["power_limit"]) == (60.0, 70_000)

    # CUDA's numbering (nvitop emulates it where libcuda is absent): one MIG device, nothing else
    numbered = [(g["cuda_index"], g["uuid"]) for g in sample["gpus"]] + [
        (m["cuda_index"], m["uuid"]) for g in sample["gpus"] for m in g["mig"]]
    known = sorted((n, uuid) for n, uuid in numbered if n is not None)
    assert [uuid for _, uuid in known] == tools["nvitop_cuda"] == [a100["mig"][0]["uuid"]]
    assert a100["mig"][0]["cuda_index"] == 0
    assert (h100["cuda_index"], h100["na"]["cuda_index"]) == (None, CUDA_HIDDEN_BY_MIG)
    assert (a100["cuda_index"], a100["na"]["cuda_index"]) == (None, CUDA_MIG_PARENT)
    assert a100["mig"][1]["na"]["cuda_index"] == CUDA_ONE_MIG

    # Prometheus: the same figures
    h = {"index": "0", "name": h100["name"], "uuid": h100["uuid"]}
    assert prometheus(metrics, "gpuspawner_gpu_memory_used_bytes", h) == [15 * GiB]
    assert prometheus(metrics, "gpuspawner_gpu_memory_reserved_bytes", h) == [2800 * MiB]
    assert prometheus(metrics, "gpuspawner_gpu_process_memory_bytes", {"pid": str(sleeper)}) == [7680 * MiB]
    for m in a100["mig"]:
        labels = {"index": "1", "uuid": a100["uuid"], "mig_uuid": m["uuid"], "mig_name": m["name"]}
        for key in ("memory_used", "memory_reserved", "memory_total"):
            assert prometheus(metrics, f"gpuspawner_gpu_mig_{key}_bytes", labels) == [m[key]], key


def test_mig_device_listed_after_a_gpu_is_cuda_0(tmp_path, fakenvml_libdir, clean_env, sleeper):
    """CUDA_VISIBLE_DEVICES=<H100>,<second MIG device>: that MIG device is CUDA's only device (as nvitop says)."""
    devices = the_devices(sleeper, hidden_pid())
    mig1 = devices[1]["mig_devices"][1]["uuid"]
    env = {"CUDA_VISIBLE_DEVICES": f"{devices[0]['uuid']},{mig1}"}
    with server_on(tmp_path, fakenvml_libdir, devices, **env) as server:
        sample = server.gpus()
        tools = tools_view(stand_in_env(fakenvml_libdir, tmp_path, **env))
    h100, a100 = sample["gpus"]
    assert tools["nvitop_cuda"] == [mig1]
    assert [(m["uuid"], m["cuda_index"]) for m in a100["mig"]] == [(mig1, 0)]
    assert (h100["cuda_index"], h100["na"]["cuda_index"]) == (None, CUDA_HIDDEN_BY_MIG)


def test_different_models_without_pci_bus_order_have_no_cuda_index(tmp_path, fakenvml_libdir, clean_env):
    """CUDA's default order puts the fastest GPU first by a heuristic: the monitor does not guess."""
    devices = [fakenvml.make_device(0, "NVIDIA H100 80GB HBM3"), fakenvml.make_device(1, "Tesla T4")]
    with server_on(tmp_path, fakenvml_libdir, devices) as server:
        sample = server.gpus()
    assert [(g["cuda_index"], g["na"]["cuda_index"]) for g in sample["gpus"]] == [(None, CUDA_ORDER_UNKNOWN)] * 2


def test_driver_without_the_v2_memory_call(tmp_path, fakenvml_v1_libdir, clean_env, sleeper):
    """A driver before 510: v1's used memory (reserved included), memory_reserved null with the reason, as the tools."""
    devices = the_devices(sleeper, hidden_pid())
    with server_on(tmp_path, fakenvml_v1_libdir, devices, CUDA_DEVICE_ORDER="PCI_BUS_ID") as server:
        sample = server.gpus()
        tools = tools_view(stand_in_env(fakenvml_v1_libdir, tmp_path))
        metrics = server.get("api/gpus/metrics").text
    for gpu, device in zip(sample["gpus"], devices, strict=True):
        assert gpu["memory_used"] == device["memory_used"] + device["memory_reserved"]
        assert gpu["memory_used"] == tools["nvitop"][gpu["uuid"]]["memory_used"]
        assert gpu["memory_used"] // MiB == tools["gpustat"][gpu["uuid"]]["memory.used"]
        assert (gpu["memory_reserved"], gpu["na"]["memory_reserved"]) == (None, MEMORY_V1_ONLY)
    mig = sample["gpus"][1]["mig"][0]
    assert (mig["memory_used"], mig["memory_reserved"], mig["na"]["memory_reserved"]) == (
        GiB + 20 * MiB, None, MEMORY_V1_ONLY)
    assert len(prometheus(metrics, "gpuspawner_gpu_memory_used_bytes", {})) == 3
    assert prometheus(metrics, "gpuspawner_gpu_memory_reserved_bytes", {}) == []
