"""The CPUs (and NUMA memory nodes) a GPU server is pinned to: those next to its GPUs.

A process whose CPUs sit on another NUMA node than its GPUs pays on every
host-to-GPU copy. gpu-docker sets the container's ``cpuset_cpus`` /
``cpuset_mems`` and gpu-local starts the server under ``taskset`` from the
:class:`Binding` chosen here. Pure: the caller says which CPUs and nodes exist.

The rule, for the GPUs of one server:

1. the CPUs: the union of the GPUs' NUMA-local CPUs (``GPU.cpus``); if a GPU's
   CPUs are unknown, nothing is pinned;
2. intersected with the CPUs that exist where the server runs (a layout may
   name CPUs the host lacks: the stand-in's example layouts name 64). If
   nothing is left, nothing is pinned, and the reason says so;
3. a CPU limit (the profile's ``cpu_limit``) is a quota, not a set: when the
   local CPUs are fewer than the limit rounds up to, the lowest other CPUs of
   the host are added until the limit fits, so pinning never takes away CPU
   time the profile grants; more local CPUs than the limit are all kept (the
   quota still caps the use; the kernel spreads it over the node);
4. memory nodes: the GPUs' NUMA nodes that exist there; none known: unset.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .gpu import GPU
from .topology import format_cpus, parse_cpus

__all__ = ["Binding", "cpu_binding", "host_cpus", "host_numa_nodes"]


class Binding(NamedTuple):
    """CPUs and memory nodes to pin to (None: do not pin), and why, for the log."""

    cpus: tuple[int, ...] | None
    mems: tuple[int, ...] | None
    reason: str

    @property
    def cpuset_cpus(self) -> str | None:
        """``"0-3,8"`` for Docker's ``cpuset_cpus`` / ``taskset -c``."""
        return format_cpus(self.cpus) if self.cpus else None

    @property
    def cpuset_mems(self) -> str | None:
        return format_cpus(self.mems) if self.mems else None


def cpu_binding(
    gpus: Sequence[GPU],
    available: Iterable[int],
    nodes: Iterable[int] = (),
    cpu_limit: float | None = None,
) -> Binding:
    """Where a server on ``gpus`` runs: see the module docstring for the rule.

    ``available``: the CPUs that exist where the server runs (its host, or the
    CPUs this process may use); ``nodes``: the NUMA nodes there.
    """
    if not gpus:
        return Binding(None, None, "no GPU: not pinned")
    unknown = [g.index for g in gpus if not g.cpus]
    if unknown:
        return Binding(None, None, f"the CPUs next to GPU {', '.join(map(str, unknown))} are not known: not pinned")
    local = sorted({cpu for g in gpus for cpu in g.cpus or ()})
    have = sorted(set(available))
    pinned = sorted(set(local) & set(have))
    if not pinned:
        return Binding(None, None, (
            f"the GPUs' NUMA-local CPUs {format_cpus(local)} do not exist here "
            f"(CPUs {format_cpus(have) or 'unknown'}): not pinned"
        ))
    reason = f"CPUs {format_cpus(pinned)}, next to the GPUs"
    if len(pinned) < len(local):
        reason += f" (of {format_cpus(local)}, those that exist here)"
    if cpu_limit:
        want = min(len(have), math.ceil(cpu_limit))
        extra = [cpu for cpu in have if cpu not in pinned][: max(0, want - len(pinned))]
        if extra:
            pinned = sorted(pinned + extra)
            reason += f"; widened by {format_cpus(extra)} to fit cpu_limit {cpu_limit:g}"
    gpu_nodes = {g.numa_node for g in gpus if g.numa_node is not None}
    mems = tuple(sorted(gpu_nodes & set(nodes))) or None
    return Binding(tuple(pinned), mems, reason)


def _read_list(path: str) -> tuple[int, ...]:
    try:
        with open(path) as f:
            return parse_cpus(f.read().strip()) or ()
    except (OSError, ValueError):
        return ()


def host_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (its affinity; the hub's cgroup limits it)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def host_numa_nodes() -> tuple[int, ...]:
    """The NUMA nodes of this machine (``/sys/devices/system/node/online``); () when not known."""
    return _read_list("/sys/devices/system/node/online")
