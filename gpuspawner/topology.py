"""How the GPUs of one host are connected, in the words of ``nvidia-smi topo -m``.

A :class:`~gpuspawner.gpu.GPU` carries ``links``: for each other GPU of its
host (by index) one level word:

====== ===============================================================
NV<n>  NVLink, ``n`` links (directly or through NVSwitches)
PIX    at most one PCIe switch between them
PXB    several PCIe switches, no host bridge
PHB    the same PCIe host bridge (root complex)
NODE   the same NUMA node, different host bridges
SYS    across the CPU sockets (the SMP interconnect)
====== ===============================================================

and ``numa_node`` / ``cpus``: the CPU-side NUMA node and its CPUs. These come
from NVML (:func:`gpuspawner.nvml.topology`) or from ``static_gpus`` entries.

A *set* of GPUs gets a connectivity class (lower is better), used by
placement and shown in the monitor:

0. ``nvlink-all``: every pair joined by NVLink (one GPU: trivially);
1. ``nvlink``: NVLink joins them all, some pairs only through another GPU;
2. ``pix`` .. 6. ``sys``: the worst pair's PCIe/CPU level;
7. ``unknown``: some pair's link is not known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "CLASS_NAMES",
    "INTERCONNECTS",
    "LEVELS",
    "NVLINK_CLASSES",
    "NVML_LEVEL_WORDS",
    "format_cpus",
    "level_rank",
    "normalise_links",
    "nvlink_count",
    "parse_cpus",
    "set_class",
]

#: The PCIe/CPU level words, best first (NVLink, "NV<n>", is better than all).
LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
#: nvmlGpuTopologyLevel_t -> word (NVML_TOPOLOGY_SINGLE .. _SYSTEM).
NVML_LEVEL_WORDS = {10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
CLASS_NAMES = ("nvlink-all", "nvlink", "pix", "pxb", "phb", "node", "sys", "unknown")
#: Classes that count as NVLink-connected (the ``"interconnect": "nvlink"`` profile key).
NVLINK_CLASSES = (0, 1)
#: Values of a profile's ``interconnect`` (and ``GPURequest.interconnect``); absent: any.
INTERCONNECTS = ("nvlink",)
UNKNOWN_RANK = len(LEVELS) + 1


def nvlink_count(level: str | None) -> int:
    """The NVLink link count of a level word (``"NV12"`` -> 12); 0 when not NVLink."""
    if level and level.startswith("NV") and level[2:].isdigit():
        return int(level[2:])
    return 0


def level_rank(level: str | None) -> int:
    """0 for NVLink, 1 (PIX) .. 5 (SYS), 6 when unknown."""
    if nvlink_count(level):
        return 0
    try:
        return LEVELS.index(level) + 1  # type: ignore[arg-type]
    except ValueError:
        return UNKNOWN_RANK


def set_class(n: int, rank: Sequence[Sequence[int]], members: Sequence[int]) -> int:
    """The connectivity class (see the module docstring) of ``members`` (positions 0..n-1).

    ``rank[i][j]`` is :func:`level_rank` of the link between positions i and j.
    """
    if len(members) <= 1:
        return 0
    worst = 0
    for a, i in enumerate(members):
        for j in members[a + 1:]:
            worst = max(worst, rank[i][j])
    if worst == 0:
        return 0
    # NVLink-connected through other members? (a walk over the NVLink edges)
    seen = {members[0]}
    todo = [members[0]]
    while todo:
        i = todo.pop()
        for j in members:
            if j not in seen and rank[i][j] == 0:
                seen.add(j)
                todo.append(j)
    if len(seen) == len(members):
        return 1
    return 1 + worst


def parse_cpus(value: str | Iterable[int] | None) -> tuple[int, ...] | None:
    """``"0-3,8"`` or ``[0, 1, 2, 3, 8]`` -> ``(0, 1, 2, 3, 8)``; None stays None.

    Raises ValueError for anything else.
    """
    if value is None:
        return None
    cpus: set[int] = set()
    if isinstance(value, str):
        for part in filter(None, (p.strip() for p in value.split(","))):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"{value!r} is not a CPU list like '0-31,64-95'")
            first, last = int(lo), int(hi or lo)
            if last < first:
                raise ValueError(f"{value!r}: CPU range {part} runs backwards")
            cpus.update(range(first, last + 1))
    else:
        for cpu in value:
            if type(cpu) is not int or cpu < 0:
                raise ValueError(f"CPU numbers must be whole numbers >= 0, not {cpu!r}")
            cpus.add(cpu)
    return tuple(sorted(cpus))


def format_cpus(cpus: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3,8"`` (the cpuset / taskset spelling)."""
    out: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def normalise_links(value: Mapping | Iterable | None) -> tuple[tuple[int, str], ...]:
    """``{1: "NV4", "2": "SYS"}`` or ``[(1, "NV4")]`` -> ``((1, "NV4"), (2, "SYS"))``, sorted by peer.

    Raises ValueError for a peer that is not an index or a word that is not a level.
    """
    if not value:
        return ()
    pairs = value.items() if isinstance(value, Mapping) else value
    out: dict[int, str] = {}
    for peer, level in pairs:
        index = int(peer) if isinstance(peer, str) and peer.isdigit() else peer
        if type(index) is not int or index < 0:
            raise ValueError(f"link peer {peer!r} is not a GPU index")
        word = str(level).upper()
        if not nvlink_count(word) and word not in LEVELS:
            raise ValueError(f"link level {level!r} is not one of NV<n>, {', '.join(LEVELS)}")
        out[index] = word
    return tuple(sorted(out.items()))
