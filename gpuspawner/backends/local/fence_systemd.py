"""The device fence on systemd hosts: each server start in its own transient scope.

Where systemd is PID 1 (``/run/systemd/system`` exists), the hub starts a server as
``systemd-run --scope ... -- <server command>``: systemd makes the scope (a cgroup
of its own, with ``DevicePolicy=closed`` and a ``DeviceAllow=`` for each node the
server may open) and then ``systemd-run`` *execs* the command, so the process the
hub started is the server (same pid). Under ``closed`` systemd itself allows
``/dev/null``, ``zero``, ``full``, ``random`` and ``urandom``; terminals
(``/dev/tty``, ``/dev/ptmx``, ``/dev/pts/N``) are allowed here.

The scope ends when its last process exits, so there is nothing to remove, and a
restarted hub's adopted servers are still in theirs. ``systemd-run --uid`` does
not reset supplementary groups: the caller sets the user's before exec.

Ending a start (:class:`ScopeFence`): its scope's cgroup (``systemctl show -P
ControlGroup``) lists every process of the start, whatever session or
environment it made itself; writing ``1`` to that cgroup's ``cgroup.kill``
(cgroup v2, Linux 5.14+) SIGKILLs all of them at once, forks in flight included.
Where the scope lives in a v1 hierarchy only, its processes are SIGKILLed one
by one, round after round, until none is left.

Nothing here knows about JupyterHub.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from .fence_starts import RECORDS, StartRecord, StartRecords, cgroup_pids, kill_pids

SYSTEMD_DIR = Path("/run/systemd/system")  # exists iff systemd is PID 1 (sd_booted)
CAPABILITIES = Path("/proc/driver/nvidia/capabilities")
SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
# Device groups (names in /proc/devices): nvidia-uvm's nodes are often made on a first CUDA call
# (nvidia-modprobe), after the scope starts; Jupyter's terminals open /dev/ptmx and /dev/pts/N.
OTHER_DEVICES = ("char-nvidia-uvm", "/dev/tty", "/dev/ptmx", "char-pts")

# Where a unit's ControlGroup lies: the v2 hierarchy (pure v2 hosts; hybrid hosts mount it at
# unified/), then systemd's own v1 hierarchy (legacy hosts).
CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))

__all__ = ["SYSTEMD_DIR", "ScopeFence", "device_allow", "kill_cgroup", "mig_nodes", "scope_command", "unit_name"]


def unit_name(hub_id: str, spawn: str) -> str:
    """The scope's unit name for one server start of one hub (characters systemd refuses become ``_``)."""
    return re.sub(r"[^A-Za-z0-9:_.-]", "_", f"gpuspawner-{hub_id}-{spawn}") + ".scope"


def mig_nodes(minor: int, capabilities: Path = CAPABILITIES) -> list[str]:
    """The ``/dev/nvidia-caps`` nodes of GPU ``minor``'s MIG instances.

    NVIDIA's driver lists each GPU instance and compute instance of GPU ``N`` under
    ``<capabilities>/gpuN/mig/giG[/ciC]/access``, whose ``DeviceFileMinor: M`` names
    the node ``/dev/nvidia-caps/nvidia-capM`` a process must open to use it. Empty
    where the GPU is not in MIG mode (or the driver has no such folder).
    """
    nodes = []
    for access in sorted((capabilities / f"gpu{minor}" / "mig").glob("gi*/**/access")):
        try:
            text = access.read_text()
        except OSError:
            continue
        match = re.search(r"^DeviceFileMinor:\s*(\d+)", text, re.MULTILINE)
        if match:
            nodes.append(f"/dev/nvidia-caps/nvidia-cap{match.group(1)}")
    return nodes


def device_allow(own_minors: Iterable[int], capabilities: Path = CAPABILITIES) -> list[str]:
    """The ``DeviceAllow=`` values of a scope that may use only the GPUs ``own_minors``."""
    own = sorted(set(own_minors))
    nodes = list(SHARED_NODES) + [f"/dev/nvidia{minor}" for minor in own]
    for minor in own:
        nodes.extend(mig_nodes(minor, capabilities))
    return [f"{node} rw" for node in nodes + list(OTHER_DEVICES)]


def scope_command(
    hub_id: str,
    spawn: str,
    own_minors: Iterable[int],
    user: str | None = None,
    group: int | None = None,
    capabilities: Path = CAPABILITIES,
    program: str = "systemd-run",
) -> list[str]:
    """The ``systemd-run`` words to put before a server's command (``user``/``group``: who it runs as).

    ``program``: best the full path (the server's ``PATH`` is the one used to find it).
    """
    cmd = [program, "--scope", "--quiet", "--collect", f"--unit={unit_name(hub_id, spawn)}"]
    if user is not None:
        cmd.append(f"--uid={user}")
    if group is not None:
        cmd.append(f"--gid={group}")
    cmd += ["-p", "DevicePolicy=closed"]
    for allow in device_allow(own_minors, capabilities):
        cmd += ["-p", f"DeviceAllow={allow}"]
    return cmd + ["--"]


def kill_cgroup(group: Path) -> None:
    """SIGKILL every process in cgroup ``group``: at once through ``cgroup.kill`` (v2), else one by one."""
    kill = Path(group) / "cgroup.kill"
    if kill.exists():
        try:
            kill.write_text("1")
            return
        except FileNotFoundError:  # the group went away meanwhile: nothing left to kill
            return
    kill_pids(cgroup_pids(group))


class ScopeFence:
    """The scopes of one hub's server starts (systemd): their processes, ending them, their records."""

    def __init__(self, hub_id: str, records: Path = RECORDS, systemctl: str = "systemctl",
                 roots: Iterable[Path] = CGROUP_ROOTS) -> None:
        self.hub_id = hub_id
        self.records = StartRecords(hub_id, records)
        self.systemctl = systemctl
        self.roots = tuple(Path(r) for r in roots)
        self._groups: dict[str, Path] = {}  # start -> its scope's cgroup (fixed for the scope's life)

    def create(self, spawn: str, record: StartRecord | None = None) -> None:
        """Save start ``spawn``'s record before its scope exists (``scope_command`` makes the scope)."""
        if record is not None:
            self.records.write(spawn, record)

    def group(self, spawn: str) -> Path | None:
        """The cgroup of start ``spawn``'s scope; None when the scope is gone (or never was)."""
        if spawn in self._groups:
            return self._groups[spawn]
        try:
            out = subprocess.run(
                [self.systemctl, "show", "--property=ControlGroup", "--value", unit_name(self.hub_id, spawn)],
                capture_output=True, text=True, timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
        if not out:
            return None
        candidates = [root / out.lstrip("/") for root in self.roots]
        found = [c for c in candidates if (c / "cgroup.procs").exists()]
        best = next((c for c in found if (c / "cgroup.kill").exists()), found[0] if found else None)
        if best is not None:
            self._groups[spawn] = best
        return best

    def pids(self, spawn: str) -> list[int]:
        group = self.group(spawn)
        return cgroup_pids(group) if group is not None else []

    def kill(self, spawn: str) -> None:
        group = self.group(spawn)
        if group is not None:
            kill_cgroup(group)

    def remove(self, spawn: str) -> bool:
        """False while the scope still has processes; else forget the start (systemd drops the scope)."""
        if self.pids(spawn):
            return False
        self._groups.pop(spawn, None)
        self.records.remove(spawn)
        return True

    def starts(self) -> list[str]:
        return self.records.starts()

    def record(self, spawn: str) -> StartRecord | None:
        return self.records.read(spawn)

    def knows(self, spawn: str) -> bool:
        return spawn in self.records.starts() or self.group(spawn) is not None
