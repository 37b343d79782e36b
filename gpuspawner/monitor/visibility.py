"""Which GPUs this server may show: CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES.

Pure functions, no NVML. A server started by gpuspawner has both variables set
to its GPUs' UUIDs; a CPU-only server has ``CUDA_VISIBLE_DEVICES=""`` and
``NVIDIA_VISIBLE_DEVICES=none``. On a host NVML lists every GPU whatever these
say, so the monitor filters with them; in a container NVML already lists only
what the NVIDIA runtime mounted, and filtering again is harmless.

Rules (as CUDA and the NVIDIA container runtime read them):

- unset: no restriction from that variable;
- ``""``, ``none``, ``void``: nothing is visible;
- ``all``: no restriction;
- otherwise a comma-separated list of entries: NVML indexes (``0``), GPU UUIDs
  (``GPU-4a1e...``, a unique prefix is enough, as in CUDA), MIG UUIDs
  (``MIG-...``: only that MIG instance of its GPU) or ``GPU:MIG`` index pairs
  (``3:1``, NVIDIA_VISIBLE_DEVICES only). As in CUDA, parsing
  CUDA_VISIBLE_DEVICES stops at the first entry it cannot read.

Index entries of NVIDIA_VISIBLE_DEVICES are host indexes: inside a container
NVML has renumbered the mounted GPUs 0..k-1, so they are applied only when
NVML sees more GPUs than the variable lists (that is, on a host).
CUDA_VISIBLE_DEVICES indexes are the ones this process's NVML uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_INDEX = re.compile(r"^\d+$")
_MIG_PAIR = re.compile(r"^(\d+):(\d+)$")
_NOTHING = {"", "none", "void"}


@dataclass(frozen=True)
class Selector:
    """One variable's restriction: ``entries`` None means everything."""

    variable: str
    raw: str | None
    entries: tuple[str, ...] | None

    @property
    def restricts(self) -> bool:
        return self.entries is not None

    def describe(self) -> str:
        return f"{self.variable}={self.raw!r}" if self.raw is not None else f"{self.variable} unset"


def parse(variable: str, raw: str | None) -> Selector:
    """Read one variable's value into a :class:`Selector`."""
    if raw is None:
        return Selector(variable, None, None)
    text = raw.strip()
    if text.lower() in _NOTHING:
        return Selector(variable, raw, ())
    if text.lower() == "all":
        return Selector(variable, raw, None)
    entries: list[str] = []
    for part in text.split(","):
        part = part.strip()
        readable = bool(_INDEX.match(part) or _UUID.match(part))
        if variable == "NVIDIA_VISIBLE_DEVICES" and _MIG_PAIR.match(part):
            readable = True
        if not readable:
            if variable == "CUDA_VISIBLE_DEVICES":
                break  # CUDA ignores this entry and every one after it
            continue
        entries.append(part)
    return Selector(variable, raw, tuple(entries))


@dataclass(frozen=True)
class Device:
    """What visibility needs to know about one GPU NVML lists."""

    index: int
    uuid: str | None
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """Whether a GPU is shown, and which of its MIG devices (None: all of them)."""

    visible: bool
    mig_uuids: tuple[str, ...] | None = None
    cuda_index: int | None = None  # its number inside CUDA (cuda:N), when known


def _matches(entry: str, device: Device, host_indexes: bool) -> tuple[bool, tuple[str, ...] | None]:
    """(GPU matched, MIG UUIDs the entry selects: None = all, () = none)."""
    pair = _MIG_PAIR.match(entry)
    if not host_indexes and (pair or _INDEX.match(entry)):
        return True, None  # already applied by the container runtime
    if _INDEX.match(entry):
        return int(entry) == device.index, None
    if pair:
        if int(pair.group(1)) == device.index:
            n = int(pair.group(2))
            return True, device.mig_uuids[n : n + 1]
        return False, None
    if entry.startswith("GPU-"):
        return bool(device.uuid and device.uuid.lower().startswith(entry.lower())), None
    if entry.startswith("MIG-"):
        chosen = tuple(u for u in device.mig_uuids if u.lower().startswith(entry.lower()))
        return bool(chosen), chosen
    return False, None


def _apply(selector: Selector, device: Device, host_indexes: bool) -> tuple[bool, tuple[str, ...] | None, int | None]:
    if selector.entries is None:
        return True, None, None
    migs: set[str] = set()
    whole = False
    position = None
    for n, entry in enumerate(selector.entries):
        matched, chosen = _matches(entry, device, host_indexes)
        if not matched:
            continue
        position = n if position is None else position
        if chosen is None:
            whole = True
        else:
            migs.update(chosen)
    if position is None:
        return False, None, None
    return True, (None if whole else tuple(u for u in device.mig_uuids if u in migs)), position


def _intersect(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if a is None:
        return b
    if b is None:
        return a
    return tuple(u for u in a if u in b)


@dataclass(frozen=True)
class Visibility:
    """Both variables, read once when the server starts."""

    cuda: Selector
    nvidia: Selector

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Visibility:
        return cls(
            parse("CUDA_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES")),
            parse("NVIDIA_VISIBLE_DEVICES", env.get("NVIDIA_VISIBLE_DEVICES")),
        )

    def describe(self) -> str:
        return f"{self.cuda.describe()}, {self.nvidia.describe()}"

    def decide(self, devices: Sequence[Device]) -> list[Decision]:
        """One decision per device, in the same order."""
        listed = len(self.nvidia.entries) if self.nvidia.entries is not None else 0
        nvidia_host_indexes = len(devices) > listed
        decisions: list[Decision] = []
        cuda_positions: list[tuple[int, int]] = []
        for n, device in enumerate(devices):
            ok_n, migs_n, _ = _apply(self.nvidia, device, nvidia_host_indexes)
            ok_c, migs_c, pos = _apply(self.cuda, device, True)
            if not (ok_n and ok_c):
                decisions.append(Decision(False))
                continue
            migs = _intersect(migs_n, migs_c)
            if migs == ():  # chosen only through MIG entries, and none of them is left
                decisions.append(Decision(False))
                continue
            decisions.append(Decision(True, migs))
            cuda_positions.append((pos if pos is not None else device.index, n))
        # CUDA numbers visible devices in the order CUDA_VISIBLE_DEVICES lists them.
        for cuda_index, (_, n) in enumerate(sorted(cuda_positions)):
            decisions[n] = Decision(True, decisions[n].mig_uuids, cuda_index)
        return decisions
