"""The CPUs a GPU server is pinned to (gpuspawner/cpus.py): next to its GPUs, only those that exist."""

from __future__ import annotations

from gpuspawner.cpus import cpu_binding
from gpuspawner.gpu import GPU
from gpuspawner.topology import format_cpus, parse_cpus


def gpu(index: int, cpus: str | None, node: int | None = None) -> GPU:
    return GPU("h", index, f"GPU-{index}", "Tesla T4", cpus=parse_cpus(cpus), numa_node=node)


def test_the_gpus_node_cpus_that_exist():
    b = cpu_binding([gpu(0, "0-7", 0)], range(4), nodes=[0])
    assert (b.cpuset_cpus, b.cpuset_mems) == ("0-3", "0")
    assert b.reason == "CPUs 0-3, next to the GPUs (of 0-7, those that exist here)"


def test_gpus_on_two_nodes_get_both():
    b = cpu_binding([gpu(0, "0-3", 0), gpu(4, "8-11", 1)], range(16), nodes=[0, 1])
    assert (b.cpuset_cpus, b.cpuset_mems) == ("0-3,8-11", "0-1")


def test_none_existing_means_not_pinned_with_the_reason():
    b = cpu_binding([gpu(0, "32-63", 1)], range(2), nodes=[0])
    assert b.cpus is None and b.mems is None
    assert b.reason == "the GPUs' NUMA-local CPUs 32-63 do not exist here (CPUs 0-1): not pinned"


def test_unknown_cpus_are_not_pinned():
    b = cpu_binding([gpu(0, None), gpu(1, "0-3")], range(8))
    assert b.cpus is None and "GPU 0 are not known" in b.reason


def test_cpu_limit_widens_but_never_narrows():
    narrow = cpu_binding([gpu(0, "4-5", 0)], range(8), nodes=[0], cpu_limit=3.5)
    assert narrow.cpuset_cpus == "0-1,4-5"  # 4 CPUs for a limit of 3.5; the lowest others added
    assert "widened by 0-1 to fit cpu_limit 3.5" in narrow.reason
    wide = cpu_binding([gpu(0, "0-15", 0)], range(32), nodes=[0], cpu_limit=2)
    assert wide.cpuset_cpus == "0-15"  # the quota caps the use; the whole node stays


def test_node_the_host_lacks_is_left_out_of_mems():
    b = cpu_binding([gpu(0, "1", 1)], range(2), nodes=[0])
    assert (b.cpuset_cpus, b.cpuset_mems) == ("1", None)


def test_cpu_list_spellings():
    assert parse_cpus("0-3, 8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpus([11, 10, 0, 1, 2, 3, 8]) == "0-3,8,10-11"
    assert parse_cpus([3, 1]) == (1, 3)
