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

Nothing here knows about JupyterHub.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

SYSTEMD_DIR = Path("/run/systemd/system")  # exists iff systemd is PID 1 (sd_booted)
CAPABILITIES = Path("/proc/driver/nvidia/capabilities")
SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
# Device groups (names in /proc/devices): nvidia-uvm's nodes are often made on a first CUDA call
# (nvidia-modprobe), after the scope starts; Jupyter's terminals open /dev/ptmx and /dev/pts/N.
OTHER_DEVICES = ("char-nvidia-uvm", "/dev/tty", "/dev/ptmx", "char-pts")

__all__ = ["SYSTEMD_DIR", "device_allow", "mig_nodes", "scope_command", "unit_name"]


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
