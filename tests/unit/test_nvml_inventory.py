"""The safe NVML wrapper and the NVML inventory, through the real nvidia-ml-py
bindings and the stand-in libnvidia-ml.so.1.

Each scenario runs in a fresh Python process so that the dynamic linker sees
exactly the library (or the absence of one) the scenario sets up.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fakenvml
from gpuspawner.simulation import simulated_config

READ_INVENTORY = """
import json
from gpuspawner.inventory import NVMLInventory
reading = NVMLInventory(host="node-1").read()
print(json.dumps({"gpus": [g.to_dict() for g in reading.gpus], "problems": list(reading.problems)}))
"""


def read_inventory(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", READ_INVENTORY], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def nvml_env(tmp_path, fakenvml_libdir):
    """Returns a function: config dict -> environment running against the stand-in."""

    def make(config: dict) -> dict:
        path = tmp_path / "gpus.json"
        fakenvml.write_config(path, config)
        return fakenvml.env(fakenvml_libdir, path)

    return make


def test_inventory_lists_every_gpu_with_its_facts(nvml_env):
    config = simulated_config(a100=2, t4=2)
    result = read_inventory(nvml_env(config))
    assert result["problems"] == []
    gpus = result["gpus"]
    assert [g["uuid"] for g in gpus] == [d["uuid"] for d in config["devices"]]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    a100, t4 = gpus[0], gpus[3]
    assert a100["name"] == "NVIDIA A100-SXM4-80GB" and a100["model"] == "a100-sxm4-80gb"
    assert a100["memory_total"] == 80 * 2**30
    assert a100["compute_capability"] == [8, 0]
    assert a100["mig_mode"] is False
    assert t4["model"] == "t4" and t4["compute_capability"] == [7, 5]
    assert t4["mig_mode"] is None  # a T4 has no MIG: NVML says not supported
    assert all(g["driver_version"] == "550.54.15" and g["cuda_driver_version"] == 12040 for g in gpus)
    assert all(g["host"] == "node-1" and g["healthy"] for g in gpus)


def test_lost_gpu_is_reported_and_not_listed(nvml_env):
    config = simulated_config(a100=2, t4=2)
    config["devices"][1]["faults"] = {"*": "GPU_IS_LOST"}
    result = read_inventory(nvml_env(config))
    assert [g["index"] for g in result["gpus"]] == [0, 2, 3]
    assert result["problems"] == ["GPU 1 on node-1: GPU is lost (fell off the bus or stopped responding)"]


def test_gpu_lost_after_its_handle_is_unhealthy(nvml_env):
    config = simulated_config(a100=1, t4=1)
    config["devices"][0]["faults"] = {"nvmlDeviceGetName": "GPU_IS_LOST", "nvmlDeviceGetMemoryInfo": "GPU_IS_LOST"}
    result = read_inventory(nvml_env(config))
    a100 = result["gpus"][0]
    assert a100["healthy"] is False and "lost" in a100["reason"]
    assert result["gpus"][1]["healthy"] is True


def test_unsupported_field_becomes_none(nvml_env):
    config = simulated_config(a100=1, t4=0)
    config["devices"][0]["faults"] = {"nvmlDeviceGetCudaComputeCapability": "NOT_SUPPORTED"}
    gpu = read_inventory(nvml_env(config))["gpus"][0]
    assert gpu["compute_capability"] is None and gpu["healthy"] is True


def test_driver_not_loaded_gives_a_reason_not_a_crash(nvml_env):
    config = simulated_config()
    config["faults"] = {"nvmlInitWithFlags": "DRIVER_NOT_LOADED"}
    result = read_inventory(nvml_env(config))
    assert result == {"gpus": [], "problems": ["NVML: NVIDIA driver is not loaded"]}


def test_library_missing_gives_a_reason_not_a_crash(tmp_path):
    env = fakenvml.env(tmp_path, tmp_path / "none.json")  # a directory without the library
    result = read_inventory(env)
    assert result["gpus"] == []
    assert result["problems"] == ["NVML: NVIDIA driver library (libnvidia-ml.so.1) not found"]


def test_query_turns_errors_into_reasons(nvml_env):
    config = simulated_config(a100=1, t4=0)
    config["devices"][0]["faults"] = {"nvmlDeviceGetPowerUsage": "NOT_SUPPORTED"}
    code = """
import json
from gpuspawner import nvml
h = nvml.query("nvmlDeviceGetHandleByIndex", 0).value
print(json.dumps([list(nvml.query("nvmlDeviceGetPowerUsage", h)), list(nvml.query("nvmlDeviceGetName", h)),
                  list(nvml.query("nvmlNoSuchFunction"))]))
"""
    out = subprocess.run([sys.executable, "-c", code], env=nvml_env(config), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    power, name, missing = json.loads(out.stdout)
    assert power == [None, "not supported by this GPU or driver"]
    assert name == ["NVIDIA A100-SXM4-80GB", None]
    assert missing[0] is None and "not available" in missing[1]


def test_simulation_activates_in_a_running_process(fakenvml_libdir, tmp_path):
    """The runnable default loads the stand-in into an already-running hub process."""
    code = f"""
import json
from pathlib import Path
from gpuspawner import simulation
from gpuspawner.inventory import NVMLInventory
simulation.activate(Path({str(fakenvml_libdir)!r}), Path({str(tmp_path / 'sim.json')!r}))
print(json.dumps([g.name for g in NVMLInventory().read().gpus]))
"""
    fakenvml.write_config(tmp_path / "sim.json", simulated_config(a100=1, t4=1))
    env = {k: v for k, v in fakenvml.env(fakenvml_libdir, tmp_path / "x.json").items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["NVIDIA A100-SXM4-80GB", "Tesla T4"]
