"""Which GPUs this server may show: CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES.

Pure functions, no NVML. A server started by gpuspawner has both variables set
to its GPUs' UUIDs; a CPU-only server has ``CUDA_VISIBLE_DEVICES=""`` and
``NVIDIA_VISIBLE_DEVICES=none``. On a host NVML lists every GPU whatever these
say, so the monitor filters with them; in a container NVML already lists only
what the NVIDIA runtime mounted, and filtering again is harmless.

Rules (as CUDA and the NVIDIA container runtime read them):

- unset: no restriction from that variable;
- ``""``, ``none``, ``void``: nothing is visible;
- ``all``: no restriction (NVIDIA_VISIBLE_DEVICES; CUDA cannot read it: nothing);
- otherwise a comma-separated list of entries: NVML indexes (``0``), GPU UUIDs
  (``GPU-4a1e...``, a unique prefix is enough, as in CUDA), MIG UUIDs
  (``MIG-...``: only that MIG instance of its GPU) or ``GPU:MIG`` index pairs
  (``3:1``, NVIDIA_VISIBLE_DEVICES only).

CUDA_VISIBLE_DEVICES as CUDA reads it (CUDA's documented rule, and what libcuda
of driver 580 enumerated for each value in tests/fakenvml/recorded/h100.json):
the entries count in order up to the first one that names no GPU this process
may open: one it cannot read (``abc``, ``-1``, ``all``), an index past the last
GPU, a UUID no GPU has. ``1,0`` on a one-GPU host shows nothing. A GPU named
twice the same way (``0,0``, a UUID twice) makes CUDA refuse to start
(CUDA_ERROR_INVALID_DEVICE): nothing; named again the other way (a UUID, then
its index) the later entry is ignored. An entry starting with digits is read as
that index (``0:0`` is GPU 0; spaces around entries are ignored).

Index entries of NVIDIA_VISIBLE_DEVICES are host indexes: inside a container
NVML has renumbered the mounted GPUs 0..k-1, so they are applied only when
NVML sees more GPUs than the variable lists (that is, on a host).
CUDA_VISIBLE_DEVICES indexes count the GPUs this process may open, in NVML's
order, as CUDA enumerates only those: NVML's own indexes, except under a device
cgroup that refuses some GPUs (Slurm's ``ConstrainDevices=yes``), where Slurm
sets indexes relative to the job's GPUs and ``0`` is the first GPU it may open.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_INDEX = re.compile(r"^\d+$")
_LEADING_INDEX = re.compile(r"^(\d+)")  # CUDA reads "0:0" as 0
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
    cuda = variable == "CUDA_VISIBLE_DEVICES"
    if text.lower() in _NOTHING:
        return Selector(variable, raw, ())
    if text.lower() == "all" and not cuda:
        return Selector(variable, raw, None)
    entries: list[str] = []
    for part in text.split(","):
        part = part.strip()
        leading = _LEADING_INDEX.match(part)
        if cuda and leading and not _INDEX.match(part):
            part = leading.group(1)
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
    mig_uuids: tuple[str, ...] = ()  # its MIG devices, in NVML's order
    mig_mode: bool | None = None  # None: unknown (then MIG mode is assumed when it has MIG devices)
    name: str | None = None
    #: its place among the GPUs this process may open, which is what CUDA_VISIBLE_DEVICES indexes
    #: count (CUDA enumerates only those); differs from ``index`` under a device cgroup (Slurm's
    #: ConstrainDevices, which then sets indexes relative to the job's GPUs). None: ``index``.
    ordinal: int | None = None

    @property
    def cuda_ordinal(self) -> int:
        return self.index if self.ordinal is None else self.ordinal

    @property
    def in_mig_mode(self) -> bool:
        return bool(self.mig_mode) or bool(self.mig_uuids)


@dataclass(frozen=True)
class Decision:
    """Whether a GPU is shown, and which of its MIG devices (None: all of them).

    ``cuda_index`` is the GPU's number inside CUDA (``cuda:N``); when None,
    ``cuda_reason`` says why. ``mig_cuda`` maps each shown MIG device's UUID
    to its CUDA number or, when None, the reason in ``mig_cuda_reasons``.
    """

    visible: bool
    mig_uuids: tuple[str, ...] | None = None
    cuda_index: int | None = None
    cuda_reason: str | None = None
    mig_cuda: Mapping[str, int | None] = field(default_factory=dict)
    mig_cuda_reasons: Mapping[str, str] = field(default_factory=dict)


# Why a device shown here has no CUDA number. CUDA's rules, as NVIDIA documents them:
# - CUDA_VISIBLE_DEVICES: "Only the devices whose index is present in the sequence are visible to
#   CUDA applications and they are enumerated in the order of the sequence" (CUDA C++ Programming
#   Guide, "CUDA Environment Variables"); unset, CUDA_DEVICE_ORDER applies: PCI_BUS_ID orders by PCI
#   bus id (NVML's order), the default FASTEST_FIRST puts the fastest device first "using a simple
#   heuristic" and leaves the order of the rest unspecified.
# - MIG: "only enumeration of a single MIG instance is supported. In other words, regardless of how
#   many MIG devices are created (or made available to a container), a single CUDA process can only
#   enumerate a single MIG device" (NVIDIA MIG User Guide, "CUDA Device Enumeration"). A GPU in MIG
#   mode is used through its MIG devices, never as a whole.
# - With a MIG device visible, that one MIG device is the only CUDA device: GPUs not in MIG mode
#   are not enumerated beside it (observed behaviour on mixed systems; CUDA lists the GPUs not in
#   MIG mode first, then the first MIG device of each GPU in MIG mode, and keeps only the first MIG
#   device of that list when there is one).
CUDA_MIG_PARENT = "in MIG mode: CUDA uses its MIG devices, never the GPU as a whole"
CUDA_ONE_MIG = "CUDA enumerates a single MIG device per process, and it is another one"
CUDA_HIDDEN_BY_MIG = "not enumerated by CUDA: with a MIG device visible, that MIG device is CUDA's only device"
CUDA_ORDER_UNKNOWN = ("CUDA_DEVICE_ORDER is not PCI_BUS_ID and the GPUs differ: CUDA puts the fastest "
                      "first by its own heuristic, so the numbering is not known here")
CUDA_MIG_BY_GPU = ("CUDA_VISIBLE_DEVICES names a GPU in MIG mode, not one of its MIG devices: "
                   "which device CUDA then uses is not documented")
CUDA_INDEX_WITH_MIG = ("CUDA_VISIBLE_DEVICES lists indexes while a GPU is in MIG mode: CUDA's indexes "
                       "then differ from NVML's, so the numbering is not known here")


def _matches(entry: str, device: Device, host_indexes: bool,
             cuda: bool = False) -> tuple[bool, tuple[str, ...] | None]:
    """(GPU matched, MIG UUIDs the entry selects: None = all, () = none)."""
    pair = _MIG_PAIR.match(entry)
    if not host_indexes and (pair or _INDEX.match(entry)):
        return True, None  # already applied by the container runtime
    if _INDEX.match(entry):
        return int(entry) == (device.cuda_ordinal if cuda else device.index), None
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
    cuda = selector.variable == "CUDA_VISIBLE_DEVICES"
    for n, entry in enumerate(selector.entries):
        matched, chosen = _matches(entry, device, host_indexes, cuda)
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
    cuda_device_order: str | None = None  # CUDA_DEVICE_ORDER (FASTEST_FIRST when unset)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Visibility:
        return cls(
            parse("CUDA_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES")),
            parse("NVIDIA_VISIBLE_DEVICES", env.get("NVIDIA_VISIBLE_DEVICES")),
            env.get("CUDA_DEVICE_ORDER"),
        )

    def describe(self) -> str:
        return f"{self.cuda.describe()}, {self.nvidia.describe()}"

    def _cuda_as_applied(self, devices: Sequence[Device]) -> Selector:
        """CUDA_VISIBLE_DEVICES's entries that count, as CUDA applies them to these devices (module doc)."""
        entries = self.cuda.entries
        if entries is None:
            return self.cuda
        kept: list[str] = []
        named: dict[tuple[int, tuple[str, ...] | None], bool] = {}  # (device, its MIG devices) -> by index
        for entry in entries:
            found = [(n, chosen) for n, d in enumerate(devices)
                     for matched, chosen in [_matches(entry, d, True, cuda=True)] if matched]
            if len(found) != 1:
                break  # names no GPU (or no single one): CUDA stops here
            key = found[0][0], found[0][1]
            by_index = bool(_INDEX.match(entry))
            if key in named:
                if named[key] == by_index:
                    return Selector(self.cuda.variable, self.cuda.raw, ())  # CUDA refuses to start
                continue
            named[key] = by_index
            kept.append(entry)
        return Selector(self.cuda.variable, self.cuda.raw, tuple(kept))

    def decide(self, devices: Sequence[Device]) -> list[Decision]:
        """One decision per device, in the same order."""
        listed = len(self.nvidia.entries) if self.nvidia.entries is not None else 0
        nvidia_host_indexes = len(devices) > listed
        cuda = self._cuda_as_applied(devices)
        decisions: list[Decision] = []
        for device in devices:
            ok_n, migs_n, _ = _apply(self.nvidia, device, nvidia_host_indexes)
            ok_c, migs_c, _ = _apply(cuda, device, True)
            if not (ok_n and ok_c):
                decisions.append(Decision(False))
                continue
            migs = _intersect(migs_n, migs_c)
            if migs == ():  # chosen only through MIG entries, and none of them is left
                decisions.append(Decision(False))
                continue
            decisions.append(Decision(True, migs))
        return self._number(devices, decisions, cuda)

    # ------------------------------------------------------ CUDA numbers --

    def _cuda_sequence(self, devices: Sequence[Device], shown: dict[int, tuple[str, ...]],
                       unknown: dict[tuple[int, str | None], str], cuda: Selector) -> list[tuple[int, str | None]]:
        """CUDA's devices among those shown, in CUDA's order: (device position, MIG UUID or None).

        Devices whose place cannot be known get a reason in ``unknown`` instead.
        """
        if cuda.entries is None:  # CUDA's own enumeration
            whole = [n for n in shown if not devices[n].in_mig_mode]
            by_bus = (self.cuda_device_order or "").strip().upper() == "PCI_BUS_ID"
            if not by_bus and len({devices[n].name for n in whole}) > 1:
                unknown.update({(n, None): CUDA_ORDER_UNKNOWN for n in whole})
                whole = []
            firsts = [(n, shown[n][0]) for n in shown if devices[n].in_mig_mode and shown[n]]
            return [(n, None) for n in whole] + firsts
        if any(_INDEX.match(e) for e in cuda.entries) and any(d.in_mig_mode for d in devices):
            unknown.update({(n, None): CUDA_INDEX_WITH_MIG for n in shown})
            unknown.update({(n, u): CUDA_INDEX_WITH_MIG for n in shown for u in shown[n]})
            return []
        sequence: list[tuple[int, str | None]] = []
        for entry in cuda.entries:
            for n in shown:
                device = devices[n]
                if entry.startswith("MIG-"):
                    chosen = [u for u in shown[n] if u.lower().startswith(entry.lower())]
                    sequence += [(n, u) for u in chosen[:1]]
                elif _matches(entry, device, True, cuda=True)[0]:
                    if device.in_mig_mode:
                        unknown.update({(n, u): CUDA_MIG_BY_GPU for u in shown[n]})
                    else:
                        sequence.append((n, None))
        return list(dict.fromkeys(sequence))  # a device listed twice keeps its first place

    def _number(self, devices: Sequence[Device], decisions: list[Decision], cuda: Selector) -> list[Decision]:
        shown = {n: (dec.mig_uuids if dec.mig_uuids is not None else devices[n].mig_uuids)
                 for n, dec in enumerate(decisions) if dec.visible}
        unknown: dict[tuple[int, str | None], str] = {}
        sequence = self._cuda_sequence(devices, shown, unknown, cuda)
        first_mig = next((item for item in sequence if item[1] is not None), None)
        mig_unknown = next((r for (_, u), r in unknown.items() if u is not None), None)
        if first_mig is not None:  # that MIG device is CUDA's only device
            numbers = {first_mig: 0}
        elif mig_unknown is not None:  # whether a MIG device hides the others is not known
            numbers = {}
        else:
            numbers = {item: i for i, item in enumerate(sequence)}

        def reason(key: tuple[int, str | None]) -> str:
            if key[1] is not None:
                return unknown.get(key, CUDA_ONE_MIG)
            if first_mig is not None:
                return CUDA_HIDDEN_BY_MIG
            return unknown.get(key, mig_unknown or CUDA_HIDDEN_BY_MIG)

        out = []
        for n, dec in enumerate(decisions):
            if not dec.visible:
                out.append(dec)
                continue
            if devices[n].in_mig_mode:
                gpu_index, gpu_reason = None, CUDA_MIG_PARENT
            else:
                gpu_index = numbers.get((n, None))
                gpu_reason = None if gpu_index is not None else reason((n, None))
            mig_cuda = {u: numbers.get((n, u)) for u in shown[n]}
            mig_reasons = {u: reason((n, u)) for u, i in mig_cuda.items() if i is None}
            out.append(Decision(True, dec.mig_uuids, gpu_index, gpu_reason, mig_cuda, mig_reasons))
        return out
