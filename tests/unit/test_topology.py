"""Topology: the stand-in answers NVIDIA's topology calls through the real
nvidia-ml-py, the inventory reads them into links, and placement prefers
connected GPUs on the three example layouts.

The pynvml scenarios run in a fresh Python process (the dynamic linker must
see the stand-in); placement runs here on the GPU records read there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import fakenvml
from gpuspawner.gpu import gpu_from_record
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest, PlacementError, place, set_class_of

PYNVML_SCENARIO = r"""
import json, pynvml as p
p.nvmlInit()
n = p.nvmlDeviceGetCount()
h = [p.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
def err(f, *a):
    try:
        return f(*a)
    except p.NVMLError as e:
        return type(e).__name__
def bus(x):
    return x.decode() if isinstance(x, bytes) else x
out = {
    "ancestor": [[err(p.nvmlDeviceGetTopologyCommonAncestor, a, b) for b in h] for a in h],
    "cpus": [list(err(p.nvmlDeviceGetCpuAffinity, x, 2)) for x in h],
    "socket_nodes": [list(err(p.nvmlDeviceGetMemoryAffinity, x, 1, p.NVML_AFFINITY_SCOPE_SOCKET)) for x in h],
    "node_nodes": [list(err(p.nvmlDeviceGetMemoryAffinity, x, 1, p.NVML_AFFINITY_SCOPE_NODE)) for x in h],
    "numa_id": err(p.nvmlDeviceGetNumaNodeId, h[0]),
    "bad_scope": err(p.nvmlDeviceGetCpuAffinityWithinScope, h[0], 1, 7),
    "state0": err(p.nvmlDeviceGetNvLinkState, h[0], 0),
    "state_past": err(p.nvmlDeviceGetNvLinkState, h[0], 36),
    "remote0": err(lambda: bus(p.nvmlDeviceGetNvLinkRemotePciInfo(h[0], 0).busId)),
    "type0": err(p.nvmlDeviceGetNvLinkRemoteDeviceType, h[0], 0),
    "util_bad_counter": err(p.nvmlDeviceGetNvLinkUtilizationCounter, h[0], 0, 2),
    "bus": [bus(p.nvmlDeviceGetPciInfo(x).busId) for x in h],
}
print(json.dumps(out))
"""

READ_INVENTORY = """
import json
from gpuspawner.inventory import NVMLInventory
reading = NVMLInventory(host="node-1").read()
print(json.dumps({"gpus": [g.to_dict() for g in reading.gpus], "problems": list(reading.problems)}))
"""


def run(code: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def host_env(tmp_path, fakenvml_libdir):
    """Layout name (or a device file) -> environment of a process on that host."""

    def make(config) -> dict:
        if isinstance(config, str):
            config = fakenvml.layout(config)
        path = tmp_path / "gpus.json"
        fakenvml.write_config(path, config)
        return {**os.environ, **fakenvml.env(fakenvml_libdir, path)}

    return make


# ----------------------------------------------------------- the stand-in --


def test_nvswitch_host_answers_as_nvml_documents(host_env):
    r = run(PYNVML_SCENARIO, host_env("nvswitch-8"))
    single, hostbridge, system = 10, 30, 50
    # a GPU with itself: NOT_SUPPORTED, as driver 580 answers (tests/fakenvml/recorded/h100.json)
    assert r["ancestor"][0][:5] == ["NVMLError_NotSupported", single, hostbridge, hostbridge, system]
    assert r["ancestor"][5][4] == single and r["ancestor"][4][5] == single
    # NUMA node 0 has CPUs 0-31: one 64-bit word of 32 ones; node 1 has 32-63
    assert r["cpus"][0] == [0xFFFFFFFF, 0] and r["cpus"][7] == [0xFFFFFFFF00000000, 0]
    assert r["node_nodes"][0] == [1] and r["node_nodes"][7] == [2]
    assert r["socket_nodes"][0] == [1]  # one node per socket in this layout
    assert r["numa_id"] == "NVMLError_NotSupported"  # x86: the GPU is not itself a NUMA node
    assert r["bad_scope"] == "NVMLError_InvalidArgument"
    assert r["state0"] == 1 and r["state_past"] == "NVMLError_InvalidArgument"
    assert r["type0"] == 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
    assert r["remote0"] == "00000000:C5:00.0"
    assert r["util_bad_counter"] == "NVMLError_InvalidArgument"


def test_cube_mesh_links_lead_to_the_peer_gpus(host_env):
    r = run(PYNVML_SCENARIO, host_env("cube-mesh-8"))
    assert r["type0"] == 0  # NVML_NVLINK_DEVICE_TYPE_GPU
    assert r["remote0"] == r["bus"][1]  # GPU 0's first link goes to GPU 1 (NV1)
    assert r["ancestor"][0][2] == 20  # MULTIPLE: two switches under one
    assert r["ancestor"][0][4] == 50


def test_pcie_host_has_no_nvlink(host_env):
    r = run(PYNVML_SCENARIO, host_env("pcie-2socket-8"))
    assert r["state0"] == "NVMLError_NotSupported"
    assert r["remote0"] == "NVMLError_NotSupported"
    assert r["ancestor"][0][1:4] == [10, 40, 40]  # PIX, then NODE (other host bridge, same node)
    assert r["ancestor"][4][6] == 30  # PHB on socket 1


def broken_file_message(host_env, config) -> str:
    """What the stand-in says about a device file it cannot use (init then fails, as documented)."""
    out = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"],
        env=host_env(config), capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    return out.stderr


def test_device_file_rejects_impossible_topologies(host_env):
    cube = fakenvml.layout("cube-mesh-8")
    cube["topology"]["nvlink"].append([0, 5, 1])  # GPU 0 already uses its 6 links
    assert "GPU 0 uses 7 links but has 6" in broken_file_message(host_env, cube)
    both = fakenvml.layout("cube-mesh-8")
    both["topology"]["nvswitches"] = ["00000000:C5:00.0"]
    assert "either nvswitches (all-to-all) or nvlink pairs, not both" in broken_file_message(host_env, both)
    pcie = fakenvml.layout("pcie-2socket-8")
    pcie["topology"]["numa_nodes"].pop()
    assert "devices[4].numa_node 1 is not in topology.numa_nodes (1 listed)" in broken_file_message(host_env, pcie)
    t4 = fakenvml.layout("pcie-2socket-8")
    t4["topology"]["nvlink"] = [[0, 1, 1]]
    assert "topology.nvlink[0]: GPU 0 has no \"nvlink\"" in broken_file_message(host_env, t4)


# -------------------------------------------------------------- inventory --


def inventory(host_env, name: str, host: str = "node-1") -> list:
    result = run(READ_INVENTORY, host_env(name))
    assert result["problems"] == []
    return [gpu_from_record(dict(g, host=host)) for g in result["gpus"]]


def test_inventory_reads_links_numa_and_cpus(host_env):
    cube = inventory(host_env, "cube-mesh-8")
    assert dict(cube[0].links) == {1: "NV1", 2: "NV1", 3: "NV2", 4: "NV2", 5: "SYS", 6: "SYS", 7: "SYS"}
    assert cube[0].numa_node == 0 and cube[0].cpus == tuple(range(32))
    assert cube[5].numa_node == 1 and cube[5].cpus == tuple(range(32, 64))
    switch = inventory(host_env, "nvswitch-8")
    assert set(dict(switch[3].links).values()) == {"NV18"}
    pcie = inventory(host_env, "pcie-2socket-8")
    assert dict(pcie[0].links) == {1: "PIX", 2: "NODE", 3: "NODE", 4: "SYS", 5: "SYS", 6: "SYS", 7: "SYS"}
    assert dict(pcie[4].links)[6] == "PHB"


@pytest.mark.parametrize("name", fakenvml.LAYOUTS)
def test_layout_words_are_what_the_inventory_reads(host_env, name):
    """fakenvml.layouts.links(), which the benchmark builds inventories from, is what NVML says."""
    gpus = inventory(host_env, name)
    assert [dict(g.links) for g in gpus] == fakenvml.layouts.links(name)


# -------------------------------------------------------------- placement --


def uuids(gpus) -> set[str]:
    return {g.uuid for g in gpus}


def indexes(gpus) -> list[int]:
    return [g.index for g in gpus]


def test_cube_mesh_gives_connected_quads_and_pairs(host_env):
    gpus = inventory(host_env, "cube-mesh-8")
    ledger = Ledger()
    quad = ledger.reserve(gpus, GPURequest("a", 4))
    assert indexes(quad) == [0, 1, 2, 3] and set_class_of(quad) == "nvlink-all"
    pair = ledger.reserve(gpus, GPURequest("b", 2))
    assert set_class_of(pair) == "nvlink-all"
    assert indexes(pair) in ([4, 7], [5, 6], [6, 7])  # a doubly linked pair (NV2) of the other quad
    other = ledger.reserve(gpus, GPURequest("c", 2))
    assert set_class_of(other) == "nvlink-all"
    with pytest.raises(PlacementError):
        ledger.reserve(gpus, GPURequest("d", 1))


def test_single_gpus_leave_nvlink_pairs_whole(host_env):
    gpus = inventory(host_env, "cube-mesh-8")
    held: set[str] = set()
    for _ in range(3):
        held |= uuids(place(gpus, held, GPURequest("x", 1)))
    # three single GPUs taken; a 4-GPU all-to-all quad must still be free
    quad = place(gpus, held, GPURequest("q", 4))
    assert set_class_of(quad) == "nvlink-all"


def test_pcie_host_pairs_share_a_switch(host_env):
    gpus = inventory(host_env, "pcie-2socket-8")
    ledger = Ledger()
    first = ledger.reserve(gpus, GPURequest("a", 1))
    pair = ledger.reserve(gpus, GPURequest("b", 2))
    assert indexes(first) == [0] and indexes(pair) == [2, 3]  # a whole switch, not GPU 0's mate
    assert set_class_of(pair) == "pix"
    four = ledger.reserve(gpus, GPURequest("c", 4))
    assert set_class_of(four) in ("phb", "node")  # one socket, never across
    assert len({g.numa_node for g in four}) == 1


def test_nvlink_profile_is_refused_on_a_pcie_host_with_a_sentence(host_env):
    gpus = inventory(host_env, "pcie-2socket-8")
    with pytest.raises(PlacementError) as e:
        place(gpus, set(), GPURequest("a", 2, interconnect="nvlink"))
    assert e.value.code == "no_nvlink_host"  # waiting would not help: the queue ends at once
    assert str(e.value) == (
        "2 GPUs joined by NVLink were requested, but no machine here has 2 GPUs joined by NVLink. "
        "Pick a profile without the NVLink requirement."
    )
    assert place(gpus, set(), GPURequest("a", 1, interconnect="nvlink"))  # one GPU needs no link


def test_nvlink_profile_waits_while_the_linked_gpus_are_busy(host_env):
    gpus = inventory(host_env, "cube-mesh-8")
    by_index = {g.index: g.uuid for g in gpus}
    held = {by_index[i] for i in (1, 2, 3, 4, 6, 7)}  # free: GPUs 0 and 5, across the sockets
    with pytest.raises(PlacementError) as e:
        place(gpus, held, GPURequest("a", 2, ("v100",), interconnect="nvlink"))
    assert e.value.code == "no_nvlink_set"
    assert str(e.value) == (
        "2 x Tesla V100-SXM2-32GB joined by NVLink were requested, but no 2 free on one machine are joined by "
        "NVLink (2 of 8 free in all). Try again later, or pick a profile without the NVLink requirement."
    )
    assert {g.index for g in place(gpus, held, GPURequest("b", 2))} == {0, 5}  # without the requirement


def test_nvlink_profile_takes_the_nvswitch_host(host_env):
    pcie = inventory(host_env, "pcie-2socket-8", host="pcie-host")
    switch = inventory(host_env, "nvswitch-8", host="switch-host")
    got = place(pcie + switch, set(), GPURequest("a", 4, ("any",), interconnect="nvlink"))
    assert {g.host for g in got} == {"switch-host"}


def test_profile_interconnect_key():
    from gpuspawner.profiles import OptionsError, profile_from_config

    linked = profile_from_config({"display_name": "Linked", "gpu_counts": [2, 4], "interconnect": "nvlink"})
    assert linked.interconnect == "nvlink"
    assert profile_from_config({"display_name": "Plain", "gpu_counts": [2]}).interconnect is None
    with pytest.raises(OptionsError, match="interconnect 'pcie' must be one of \\['nvlink'\\] or absent"):
        profile_from_config({"display_name": "Bad", "gpu_counts": [2], "interconnect": "pcie"})


def test_cluster_backends_refuse_the_interconnect_key():
    from traitlets import TraitError

    from gpuspawner.backends.slurm.spawner import GPUSlurmSpawner

    with pytest.raises(TraitError, match="'interconnect' needs a backend whose hub picks the GPUs"):
        GPUSlurmSpawner(gpu_profiles=[{"display_name": "Linked", "gpu_counts": [2], "interconnect": "nvlink"}])
