"""Real GPUs when NVML finds some, simulated ones otherwise.

The runnable default (``jupyterhub_config.py``) calls :func:`real_or_simulated`.
With no NVIDIA driver, the hub and its servers load the stand-in
``libnvidia-ml.so.1`` (built from ``tests/fakenvml``) on a device file written
here, so every code path, NVML included, runs as it would on a GPU machine.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from . import nvml

#: Environment variables a server needs to see the simulated GPUs.
SIMULATION_ENV = ("LD_LIBRARY_PATH", "FAKENVML_CONFIG")

_A100 = {
    "name": "NVIDIA A100-SXM4-80GB",
    "memory_total": 80 * 2**30,
    "compute_capability": [8, 0],
    "power_limit": 400_000,
    "clocks": {"graphics": 1410, "sm": 1410, "memory": 1593, "video": 1275},
    "max_clocks": {"graphics": 1410, "sm": 1410, "memory": 1593, "video": 1290},
    "mig_mode": 0,
    "pcie": {"max_generation": 4, "max_width": 16, "generation": 4, "width": 16, "tx_kbps": 120, "rx_kbps": 80},
}
_T4 = {
    "name": "Tesla T4",
    "memory_total": 15 * 2**30,
    "compute_capability": [7, 5],
    "power_limit": 70_000,
    "clocks": {"graphics": 585, "sm": 585, "memory": 5000, "video": 540},
    "max_clocks": {"graphics": 1590, "sm": 1590, "memory": 5001, "video": 1470},
    "pcie": {"max_generation": 3, "max_width": 16, "generation": 3, "width": 16, "tx_kbps": 60, "rx_kbps": 40},
}


def simulated_devices(a100: int = 2, t4: int = 2) -> list[dict]:
    """Device entries for the stand-in NVML: ``a100`` A100 80GB then ``t4`` Tesla T4."""
    devices = []
    for index, model in enumerate([_A100] * a100 + [_T4] * t4):
        token = uuid.uuid5(uuid.NAMESPACE_URL, f"gpuspawner-simulated-gpu-{index}")
        devices.append({
            **model,
            "uuid": f"GPU-{token}",
            "serial": f"{1320000000000 + index}",
            "pci_bus_id": f"00000000:{index + 7:02X}:00.0",
            "memory_used": 0,
            "utilization_gpu": 0,
            "utilization_memory": 0,
            "temperature": 32 + index,
            "power_usage": model["power_limit"] // 7,
            "fan_speed": None,
            "processes": [],
        })
    return devices


def simulated_config(a100: int = 2, t4: int = 2) -> dict:
    return {
        "driver_version": "550.54.15",
        "cuda_driver_version": 12040,
        "nvml_version": "12.550.54.15",
        "devices": simulated_devices(a100, t4),
    }


def real_gpu_count(python: str = sys.executable) -> int:
    """How many GPUs the real NVML sees, asked in a child so this process stays clean."""
    code = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"
    env = {k: v for k, v in os.environ.items() if k not in SIMULATION_ENV}
    try:
        out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else 0


def activate(library_dir: Path, config_path: Path) -> None:
    """Make this process and its children use the stand-in NVML.

    Children find it through LD_LIBRARY_PATH. This process has already started,
    so the library is loaded by path first; nvidia-ml-py's later
    ``CDLL("libnvidia-ml.so.1")`` then finds it by its SONAME.
    """
    library = Path(library_dir) / "libnvidia-ml.so.1"
    if not library.exists():
        raise FileNotFoundError(
            f"{library} is missing: build it with `bash tests/fakenvml/build.sh {library_dir}`"
        )
    paths = [str(library_dir)] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    os.environ["LD_LIBRARY_PATH"] = ":".join(dict.fromkeys(paths))
    os.environ["FAKENVML_CONFIG"] = str(config_path)
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    nvml.reset()


def real_or_simulated(library_dir: Path, state_dir: Path, a100: int = 2, t4: int = 2) -> bool:
    """Use real GPUs if NVML finds any; otherwise simulate. Returns True when simulated."""
    if real_gpu_count() > 0:
        return False
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    config_path = state_dir / "simulated-gpus.json"
    if not config_path.exists():  # keep an admin's edits (and live values) across restarts
        config_path.write_text(json.dumps(simulated_config(a100, t4), indent=2))
    activate(Path(library_dir), config_path)
    return True


def simulated_devices_in(state_dir: Path) -> list[dict]:
    """The simulated GPUs of the runnable default's state folder."""
    return json.loads((Path(state_dir) / "simulated-gpus.json").read_text())["devices"]


def make_device_files(folder: Path, count: int) -> list[Path]:
    """``folder/nvidia0`` ... ``nvidia<count-1>``: character devices ``195:N`` (mode 0666), as NVIDIA's
    driver makes its GPUs' nodes (needs root). Nodes already there are kept."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    nodes = []
    for minor in range(count):
        node = folder / f"nvidia{minor}"
        if not node.exists():
            os.mknod(node, 0o666 | 0o020000, os.makedev(195, minor))  # S_IFCHR
        node.chmod(0o666)  # as the driver's: every user may open it (the fence decides), whatever the umask
        nodes.append(node)
    return nodes


def place_on_device_files(state_dir: Path, nodes: list[Path]) -> None:
    """Put the simulated GPUs on device files, in order (GPU N on ``nodes[N]``, minor number N).

    The stand-in NVML then opens a GPU's file to give out its handle, as the real
    one does, so a process whose device cgroup refuses the file (gpu-local's fence,
    Slurm's ConstrainDevices) cannot use that GPU, and counts only the others.
    """
    config_path = Path(state_dir) / "simulated-gpus.json"
    config = json.loads(config_path.read_text())
    for minor, (device, node) in enumerate(zip(config["devices"], nodes, strict=False)):
        device["minor_number"] = minor
        device["device_node"] = str(node)
    config_path.write_text(json.dumps(config, indent=2))
