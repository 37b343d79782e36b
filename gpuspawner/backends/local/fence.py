"""Kernel-enforced GPU isolation for local servers, and the fence that ends them: cgroups per server start.

``CUDA_VISIBLE_DEVICES`` only asks CUDA to hide GPUs: a notebook that clears it,
or opens ``/dev/nvidiaN`` itself, reaches every GPU of the host. The kernel's
device controller closes that door: a process in a cgroup whose rules deny the
character device ``195:N`` gets ``EPERM`` opening ``/dev/nvidiaN``, and so does
everything it starts. NVIDIA's device nodes are all major 195: ``nvidiaN`` is
minor N (NVML's minor number for that GPU), ``nvidiactl`` 255 and
``nvidia-modeset`` 254; ``nvidia-uvm`` has a major of its own and stays open.

The same cgroup is the truth about which processes belong to a start: a
process can leave its session, double-fork and clear its environment, but not
its cgroup (only root moves processes between cgroups). Ending a start means
emptying its cgroup, and its GPUs are handed on only once it is empty.

Mechanisms, best first:

- ``cgroup-v1``: the cgroup v1 ``devices`` controller is mounted and writable
  (root): one group per server start under ``<mount>/gpuspawner/<hub id>/``,
  denying every GPU minor (0-253) except the server's own, and beside it a group
  of the same name under the ``freezer`` controller; the server process joins
  both before it drops privileges, so nothing it runs ever had access or can
  leave. Ending the start (:meth:`DeviceFence.kill`): freeze the freezer group
  (nothing in it can fork any more), SIGKILL every process of both groups, thaw.
- ``systemd``: systemd is PID 1 and ``systemd-run`` is installed (cgroup v2
  hosts, the common case), the hub runs as root: each server start runs in its
  own transient scope with ``DevicePolicy=closed`` and ``DeviceAllow=`` for its
  own nodes only, and ends by writing ``1`` to its cgroup's ``cgroup.kill``
  (:mod:`gpuspawner.backends.local.fence_systemd`).
- ``advisory``: neither is available (no systemd, a hub that is not root):
  servers get ``CUDA_VISIBLE_DEVICES`` only, and the hub says so at start and
  on the admin overview; a start's processes are those whose environment
  carries its marks (:mod:`gpuspawner.backends.local.processes`).

Nothing here knows about JupyterHub.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .fence_starts import RECORDS, StartRecord, StartRecords, cgroup_pids, kill_pids
from .fence_systemd import SYSTEMD_DIR

NVIDIA_MAJOR = 195
GPU_MINORS = range(254)  # 254: nvidia-modeset, 255: nvidiactl (both stay open)
DEVICES_MOUNT = Path("/sys/fs/cgroup/devices")
FREEZER_MOUNT = Path("/sys/fs/cgroup/freezer")
FREEZE_WAIT = 1.0  # seconds to wait for a freezer group to report FROZEN (a task in the kernel may hold it)

__all__ = ["DeviceFence", "Isolation", "deny_rules", "detect"]


@dataclass(frozen=True)
class Isolation:
    """How this host fences a local server's GPUs."""

    mechanism: str  # "cgroup-v1", "systemd" or "advisory"
    note: str  # a sentence for the log and the admin overview

    @property
    def enforced(self) -> bool:
        return self.mechanism != "advisory"


def deny_rules(own_minors: Iterable[int]) -> list[str]:
    """The cgroup v1 ``devices.deny`` lines that leave only ``own_minors`` of the GPU nodes open."""
    own = set(own_minors)
    return [f"c {NVIDIA_MAJOR}:{minor} rwm" for minor in GPU_MINORS if minor not in own]


def detect(
    mount: Path = DEVICES_MOUNT,
    systemd_dir: Path = SYSTEMD_DIR,
    systemd_run: str | None = "systemd-run",
    root: bool | None = None,
) -> Isolation:
    """Which mechanism this host offers the hub (as the user the hub runs as).

    ``systemd_run``: the program's name (looked up on PATH) or None for "not installed";
    ``root``: whether the hub runs as root (default: asks the kernel).
    """
    if root is None:
        root = os.geteuid() == 0
    v1 = (mount / "devices.deny").exists()
    if v1 and os.access(mount, os.W_OK):
        return Isolation("cgroup-v1", f"GPU isolation: enforced by the kernel (device cgroups under {mount})")
    systemd = systemd_dir.is_dir()
    if systemd and root and systemd_run and shutil.which(systemd_run):
        return Isolation(
            "systemd",
            "GPU isolation: enforced by the kernel (a systemd scope per server with DevicePolicy=closed)",
        )
    if v1:
        reason = f"the hub may not create device cgroups under {mount} (it is not root)"
    elif systemd and not root:
        reason = "the hub is not root, so it cannot start servers in systemd scopes with a device policy"
    elif systemd:
        reason = "systemd runs this host but systemd-run is not installed"
    elif Path("/sys/fs/cgroup/cgroup.controllers").exists():
        reason = "this host uses cgroup v2 without systemd, whose device fence gpuspawner does not set up"
    else:
        reason = "no device cgroup controller is mounted"
    return Isolation(
        "advisory",
        f"GPU isolation: advisory only on this host: {reason}; a user who clears CUDA_VISIBLE_DEVICES "
        "or opens /dev/nvidia* directly can reach other users' GPUs",
    )


class DeviceFence:
    """The cgroups of one hub's server starts (cgroup v1): a devices group, a freezer group beside it.

    ``freezer``: the freezer controller's mount, or None where there is none (a start is then
    ended by SIGKILL rounds alone, which a process that forks fast enough can outrun).
    """

    def __init__(self, hub_id: str, mount: Path = DEVICES_MOUNT, freezer: Path | None = FREEZER_MOUNT,
                 records: Path = RECORDS) -> None:
        self.root = Path(mount) / "gpuspawner" / hub_id
        writable = freezer is not None and (Path(freezer) / "cgroup.procs").exists() and os.access(freezer, os.W_OK)
        self.freezer_root = Path(freezer) / "gpuspawner" / hub_id if writable else None
        self.records = StartRecords(hub_id, records)

    def path(self, spawn: str) -> Path:
        return self.root / spawn

    def groups(self, spawn: str) -> list[Path]:
        """Start ``spawn``'s cgroups: the devices group, then the freezer group where there is one."""
        groups = [self.path(spawn)]
        if self.freezer_root is not None:
            groups.append(self.freezer_root / spawn)
        return groups

    def create(self, spawn: str, own_minors: Iterable[int], record: StartRecord | None = None) -> list[Path]:
        """The cgroups of start ``spawn``, whose processes may open only the GPU nodes ``own_minors``.

        ``record`` (whose start it is, its GPUs) is saved first, so that the start's GPUs are
        known from the moment it can hold a process. Returns the groups to :meth:`join`.
        """
        if record is not None:
            self.records.write(spawn, record)
        path = self.path(spawn)
        path.mkdir(parents=True, exist_ok=True)
        deny = path / "devices.deny"
        for rule in deny_rules(own_minors):
            deny.write_text(rule)
        groups = self.groups(spawn)
        for group in groups[1:]:
            group.mkdir(parents=True, exist_ok=True)
        return groups

    @staticmethod
    def join(paths: Path | Iterable[Path]) -> None:
        """Move the calling process into ``paths`` (call it in the child, before dropping privileges)."""
        pid = str(os.getpid())
        for path in [paths] if isinstance(paths, Path) else paths:
            with open(path / "cgroup.procs", "w") as procs:
                procs.write(pid)

    def pids(self, spawn: str) -> list[int]:
        """Every process of start ``spawn``: those in its devices group or its freezer group."""
        found: set[int] = set()
        for group in self.groups(spawn):
            found.update(cgroup_pids(group))
        return sorted(found)

    def kill(self, spawn: str) -> None:
        """SIGKILL every process of start ``spawn``; frozen first, so that none can fork meanwhile.

        Returns at once: the caller waits until :meth:`pids` is empty. A process that is in
        the kernel (uninterruptible sleep, e.g. in a driver) dies when it comes back.
        """
        freezer = self.groups(spawn)[1] if self.freezer_root is not None else None
        frozen = freezer is not None and _set_freezer(freezer, "FROZEN")
        try:
            if frozen:
                deadline = time.monotonic() + FREEZE_WAIT
                while _freezer_state(freezer) == "FREEZING" and time.monotonic() < deadline:
                    time.sleep(0.01)
            kill_pids(self.pids(spawn))
        finally:
            if frozen:
                _set_freezer(freezer, "THAWED")  # the killed processes run again, only to die

    def remove(self, spawn: str) -> bool:
        """Remove start ``spawn``'s cgroups and record; False while processes are still in them.

        The hub's own folders go too once they hold no start (a later start makes them again).
        """
        for group in reversed(self.groups(spawn)):  # the freezer group first: the devices group decides
            try:
                group.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno == errno.EBUSY:
                    return False
                raise
        self.records.remove(spawn)
        for root in (self.root, self.freezer_root):
            try:
                if root is not None:
                    root.rmdir()
            except OSError as e:  # another start's cgroup is in it (EBUSY), or it is gone already
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY, errno.ENOENT):
                    raise
        return True

    def starts(self) -> list[str]:
        """The start ids that have a cgroup or a record here."""
        found = set(self.records.starts())
        for root in (self.root, self.freezer_root):
            if root is not None and root.is_dir():
                found.update(p.name for p in root.iterdir() if p.is_dir())
        return sorted(found)

    def record(self, spawn: str) -> StartRecord | None:
        """Whose start ``spawn`` is and which GPUs it holds, as saved when it was made."""
        return self.records.read(spawn)

    def knows(self, spawn: str) -> bool:
        """Whether start ``spawn`` has a cgroup (or a record) here."""
        return self.path(spawn).is_dir() or spawn in self.records.starts()


def _freezer_state(group: Path) -> str:
    try:
        return (group / "freezer.state").read_text().strip()
    except OSError:
        return ""


def _set_freezer(group: Path, state: str) -> bool:
    try:
        (group / "freezer.state").write_text(state)
        return True
    except OSError:  # gone (the start is over), or no such group
        return False
