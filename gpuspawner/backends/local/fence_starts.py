"""What the fences of every kind share: a start's record, its cgroup's processes, killing them.

The record: what each fenced server start holds, written beside the kernel's objects.

A start's cgroup (or systemd scope) says which processes belong to it, but not
whose they are or which GPUs they may open. Before the start's first process
exists the hub writes that here, one small JSON file per start:
``<folder>/<hub id>/<start id>.json`` with the owner (``user/server`` or
``user/job/<id>``) and the GPUs' UUIDs. A restarted hub that finds a start's
cgroup still holding processes (say a daemon that cleared its environment, so
nothing in ``/proc/PID/environ`` names it) reads here whose GPUs they are, and
keeps those GPUs held until the processes are gone.

The default folder is ``/run/gpuspawner`` (root's runtime state); a record goes
with its start's cgroup. Nothing here knows about JupyterHub.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

RECORDS = Path("/run/gpuspawner")

__all__ = ["RECORDS", "StartRecord", "StartRecords", "cgroup_pids", "kill_pids"]


def cgroup_pids(group: Path) -> list[int]:
    """The processes in cgroup ``group`` (v1 or v2; empty when the group is gone)."""
    try:
        text = (Path(group) / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(line) for line in text.split()]


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILL every pid (those already gone are skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass(frozen=True)
class StartRecord:
    """Whose start it is and which GPUs it holds."""

    owner: str  # the ledger owner: "user/server-name" or "user/job/<id>"
    uuids: tuple[str, ...]


class StartRecords:
    """The records of one hub's fenced starts."""

    def __init__(self, hub_id: str, folder: Path = RECORDS) -> None:
        self.folder = Path(folder) / hub_id

    def _path(self, spawn: str) -> Path:
        return self.folder / f"{spawn}.json"

    def write(self, spawn: str, record: StartRecord) -> None:
        """Save ``record`` for start ``spawn`` (readable by root only), atomically."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(spawn)
        partial = path.with_suffix(".partial")
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            json.dump({"owner": record.owner, "uuids": list(record.uuids)}, out)
        partial.replace(path)

    def read(self, spawn: str) -> StartRecord | None:
        """The record of start ``spawn``; None when there is none (or it cannot be read)."""
        try:
            data = json.loads(self._path(spawn).read_text())
            return StartRecord(str(data["owner"]), tuple(str(u) for u in data["uuids"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def remove(self, spawn: str) -> None:
        """Forget start ``spawn`` (and the hub's folder once it holds no record)."""
        self._path(spawn).unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:  # other records are in it, or it is gone already
            pass

    def starts(self) -> list[str]:
        """The start ids that have a record."""
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.json"))
