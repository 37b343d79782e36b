"""Which kernel (notebook) a GPU process belongs to.

NVML reports process ids. A kernel's GPU work runs in the kernel process or in
its children (DataLoader workers, multiprocessing), so a pid is attributed by
walking its parent chain in ``/proc`` until a kernel's pid is found. The table
of kernel pids comes from the server's kernel and session managers
(:func:`kernel_table`, on the event loop); :class:`Attributor` is used from the
sampler thread and only reads ``/proc``.

Inside a container the driver reports the host's pids, which do not exist in
the container's PID namespace: such a process is listed with a note saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NOT_VISIBLE = "process not visible from this server (another PID namespace, e.g. a container, or it has ended)"
NOT_A_KERNEL = "not started by a kernel of this server"


@dataclass(frozen=True)
class Kernel:
    id: str
    name: str | None  # kernelspec name
    path: str | None  # notebook (or console) path of its session, if any
    pid: int

    def as_json(self, via: int | None = None) -> dict:
        return {"id": self.id, "name": self.name, "path": self.path, "pid": self.pid, "via_child": via}


def parent_pid(pid: int, proc: str = "/proc") -> int | None:
    """The parent of ``pid`` from ``/proc/PID/stat``, or None if there is no such process here."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


class Attributor:
    """Maps NVML pids to kernels, using the latest kernel table."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.table: Mapping[int, Kernel] = {}  # replaced whole, never mutated: safe across threads

    def __call__(self, pid: int) -> tuple[dict | None, str | None]:
        table = self.table
        current: int | None = pid
        for _ in range(64):  # parent chains are short; a loop guard against odd /proc contents
            if current is None or current <= 1:
                break
            if current in table:
                return table[current].as_json(via=pid if current != pid else None), None
            parent = parent_pid(current, self.proc)
            if parent is None:
                return None, (NOT_VISIBLE if current == pid else NOT_A_KERNEL)
            current = parent
        return None, NOT_A_KERNEL


def _kernel_pid(manager: Any) -> int | None:
    """The OS pid of a local kernel (jupyter_client's LocalProvisioner), else None."""
    provisioner = getattr(manager, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    if pid is None:
        process = getattr(provisioner, "process", None) or getattr(manager, "kernel", None)
        pid = getattr(process, "pid", None)
    return pid if isinstance(pid, int) else None


async def kernel_table(kernel_manager: Any, session_manager: Any) -> dict[int, Kernel]:
    """pid -> Kernel for this server's running local kernels, with their notebook paths."""
    paths: dict[str, str] = {}
    if session_manager is not None:
        try:
            for session in await session_manager.list_sessions():
                kernel = session.get("kernel") or {}
                if kernel.get("id"):
                    paths[kernel["id"]] = session.get("path")
        except Exception:  # a session store problem must not stop the monitor
            pass
    table: dict[int, Kernel] = {}
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            manager = kernel_manager.get_kernel(kernel_id)
        except KeyError:  # ended meanwhile
            continue
        pid = _kernel_pid(manager)
        if pid is not None:
            table[pid] = Kernel(kernel_id, getattr(manager, "kernel_name", None), paths.get(kernel_id), pid)
    return table

