"""Kernel-enforced GPU isolation for local servers: a device cgroup per server start.

``CUDA_VISIBLE_DEVICES`` only asks CUDA to hide GPUs: a notebook that clears it,
or opens ``/dev/nvidiaN`` itself, reaches every GPU of the host. The kernel's
device controller closes that door: a process in a cgroup whose rules deny the
character device ``195:N`` gets ``EPERM`` opening ``/dev/nvidiaN``, and so does
everything it starts. NVIDIA's device nodes are all major 195: ``nvidiaN`` is
minor N (NVML's minor number for that GPU), ``nvidiactl`` 255 and
``nvidia-modeset`` 254; ``nvidia-uvm`` has a major of its own and stays open.

Mechanisms, best first:

- ``cgroup-v1``: the cgroup v1 ``devices`` controller is mounted and writable
  (root): one group per server start under ``<mount>/gpuspawner/<hub id>/``,
  denying every GPU minor (0-253) except the server's own; the server process
  joins it before it drops privileges, so nothing it runs ever had access.
- ``systemd``: systemd is PID 1 and ``systemd-run`` is installed (cgroup v2
  hosts, the common case), the hub runs as root: each server start runs in its
  own transient scope with ``DevicePolicy=closed`` and ``DeviceAllow=`` for its
  own nodes only (:mod:`gpuspawner.fence_systemd`).
- ``advisory``: neither is available (no systemd, a hub that is not root):
  servers get ``CUDA_VISIBLE_DEVICES`` only, and the hub says so at start and
  on the admin overview.

Nothing here knows about JupyterHub.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .fence_systemd import SYSTEMD_DIR

NVIDIA_MAJOR = 195
GPU_MINORS = range(0, 254)  # 254: nvidia-modeset, 255: nvidiactl (both stay open)
DEVICES_MOUNT = Path("/sys/fs/cgroup/devices")

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
    """Device cgroups of one hub's server starts (cgroup v1)."""

    def __init__(self, hub_id: str, mount: Path = DEVICES_MOUNT) -> None:
        self.root = Path(mount) / "gpuspawner" / hub_id

    def path(self, spawn: str) -> Path:
        return self.root / spawn

    def create(self, spawn: str, own_minors: Iterable[int]) -> Path:
        """A cgroup for start ``spawn`` that may open only the GPU nodes ``own_minors``."""
        path = self.path(spawn)
        path.mkdir(parents=True, exist_ok=True)
        deny = path / "devices.deny"
        for rule in deny_rules(own_minors):
            deny.write_text(rule)
        return path

    @staticmethod
    def join(path: Path) -> None:
        """Move the calling process into ``path`` (call it in the child, before dropping privileges)."""
        with open(path / "cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))

    def remove(self, spawn: str) -> bool:
        """Remove start ``spawn``'s cgroup; False while processes are still in it.

        The hub's own folder goes too once it holds no start (a later start makes it again).
        """
        try:
            self.path(spawn).rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno == errno.EBUSY:
                return False
            raise
        try:
            self.root.rmdir()
        except OSError as e:  # another start's cgroup is in it (EBUSY), or it is gone already
            if e.errno not in (errno.EBUSY, errno.ENOTEMPTY, errno.ENOENT):
                raise
        return True

    def starts(self) -> list[str]:
        """The start ids that have a cgroup here."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())
