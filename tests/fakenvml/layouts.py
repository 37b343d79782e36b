"""Example host layouts for the stand-in: whole device files with a topology.

``layout(name)`` returns a device file (``{"devices": [...], "topology": {...}}``)
for one of :data:`LAYOUTS`:

``nvswitch-8``
    8 x H100 SXM, 18 NVLink links each, all to 4 NVSwitches: every pair is
    NVLink-connected (``nvidia-smi topo -m`` shows NV18 everywhere). GPUs 0-3
    on NUMA node 0, 4-7 on node 1; two GPUs per PCIe switch.
``cube-mesh-8``
    8 x V100 SXM2, 6 NVLink links each, the hybrid cube-mesh of a DGX-1: each
    GPU has NVLink to 4 others (NV1 or NV2), quads 0-3 and 4-7 are all-to-all,
    the remaining pairs cross the CPU sockets (SYS).
``pcie-2socket-8``
    8 x A100 PCIe, no NVLink: per socket 4 GPUs, two per PCIe switch. On
    socket 0 the two switches hang off two host bridges of NUMA node 0 (NODE),
    on socket 1 off one host bridge (PHB).

``numa_cpus`` gives each NUMA node's CPU list (default ``("0-31", "32-63")``);
``("0", "1")`` makes a layout whose CPUs exist on a 2-CPU machine.
"""

from __future__ import annotations

from typing import Any

LAYOUTS = ("nvswitch-8", "cube-mesh-8", "pcie-2socket-8")

# DGX-1 (V100) hybrid cube-mesh, as nvidia-smi topo -m shows it: (gpu, gpu, links).
CUBE_MESH_LINKS = (
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2),
    (1, 2, 2), (1, 3, 1), (1, 5, 2),
    (2, 3, 2), (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1), (4, 6, 1), (4, 7, 2),
    (5, 6, 2), (5, 7, 1),
    (6, 7, 2),
)

_V100 = {
    "memory_total": 32 * 1024**3,
    "compute_capability": [7, 0],
    "architecture": "VOLTA",
    "pci_device_id": 0x1DB510DE,
    "power_limit": 300_000,
    "mig_mode": None,  # Volta has no MIG
    "nvlink": {"version": "2.0", "links": 6, "speed_mbps": 25781, "tx_kibps": 0, "rx_kibps": 0},
}


def _numa_nodes(numa_cpus: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"cpus": cpus, "socket": socket} for socket, cpus in enumerate(numa_cpus)]


def layout(name: str, numa_cpus: tuple[str, str] = ("0-31", "32-63")) -> dict[str, Any]:
    """The device file of example layout ``name`` (one of :data:`LAYOUTS`)."""
    from . import make_device  # the package imports this module

    topology: dict[str, Any] = {"numa_nodes": _numa_nodes(numa_cpus)}
    devices = []
    if name == "nvswitch-8":
        for i in range(8):
            devices.append(make_device(
                i, "NVIDIA H100 80GB HBM3", numa_node=i // 4, pcie_path=f"hb{i // 4}/sw{i // 2}",
            ))
        topology["nvswitches"] = [f"00000000:{0xC5 + s:02X}:00.0" for s in range(4)]
    elif name == "cube-mesh-8":
        for i in range(8):
            path = f"hb{i // 4}/plx{i // 4}/sw{i // 2}"
            gpu = make_device(i, "Tesla V100-SXM2-32GB", numa_node=i // 4, pcie_path=path)
            gpu.update(_V100)
            devices.append(gpu)
        topology["nvlink"] = [list(link) for link in CUBE_MESH_LINKS]
    elif name == "pcie-2socket-8":
        paths = ["hb0/sw0", "hb0/sw0", "hb1/sw1", "hb1/sw1", "hb2/sw2", "hb2/sw2", "hb2/sw3", "hb2/sw3"]
        for i in range(8):
            devices.append(make_device(i, "NVIDIA A100-PCIE-40GB", numa_node=i // 4, pcie_path=paths[i]))
    else:
        raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}")
    return {"devices": devices, "topology": topology}


def links(name: str) -> list[dict[int, str]]:
    """What ``nvidia-smi topo -m`` shows for layout ``name``: per GPU, other GPU -> level word.

    The inventory reads exactly this from the stand-in (tests/unit/test_topology.py);
    benchmarks use it to build large inventories without the library.
    """
    words: list[dict[int, str]] = [{} for _ in range(8)]
    cube = {(a, b): n for a, b, n in CUBE_MESH_LINKS}
    for i in range(8):
        for j in range(8):
            if i == j:
                continue
            same_socket = i // 4 == j // 4
            if name == "nvswitch-8":
                words[i][j] = "NV18"
            elif name == "cube-mesh-8":
                n = cube.get((min(i, j), max(i, j)))
                words[i][j] = f"NV{n}" if n else ("PIX" if i // 2 == j // 2 else "PXB") if same_socket else "SYS"
            elif name == "pcie-2socket-8":
                if not same_socket:
                    words[i][j] = "SYS"
                elif i // 2 == j // 2:
                    words[i][j] = "PIX"
                else:
                    words[i][j] = "NODE" if i < 4 else "PHB"
            else:
                raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}")
    return words
