"""The GPU record every part of gpuspawner speaks about, model slugs and names.

A :class:`GPU` is a plain, immutable value: inventory sources produce them,
placement chooses among them, backends turn them into device requests. It
carries no NVML handle, so it can be compared, hashed, logged and stored.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from .topology import normalise_links, parse_cpus

# Words that name the vendor or a product line rather than the model.
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}

# Leading words dropped by display_name(); "Tesla" stays, people say "Tesla T4".
_DISPLAY_DROP = ("nvidia",)

#: ``NVIDIA_VISIBLE_DEVICES`` of a server without GPUs, on every backend. In the
#: NVIDIA container toolkit ``void`` (like empty or unset) makes the runtime
#: behave as plain runc: no GPU and no driver libraries; ``none`` would still
#: mount the driver's libraries and tools. A CPU-only server needs neither, and a
#: set value overrides the ``NVIDIA_VISIBLE_DEVICES=all`` CUDA images ship.
NO_GPU_DEVICES = "void"


T = TypeVar("T")

class GPUs(tuple):
    """One reading's GPU records, in order: a tuple that also keeps what :func:`per_gpus` derived from it
    (an inventory reading's ``gpus`` is one; it lives as long as the reading)."""

    def __new__(cls, gpus: Iterable[GPU] = ()) -> GPUs:
        self = super().__new__(cls, gpus)
        self.made = {}
        return self

    def __reduce__(self):
        return (GPUs, (tuple(self),))  # what was derived is not carried along


_NOT_MADE = object()

#: the most derivations one reading keeps (the kinds a hub asks for are a few per profile)
MADE_PER_READING = 64


def per_gpus(gpus: Iterable[GPU], kind: Hashable, make: Callable[[Iterable[GPU]], T]) -> T:
    """``make(gpus)``, worked out once per reading: an inventory reading keeps one :class:`GPUs` until
    the GPUs are read again, and what is grouped or indexed from 10,000 of them is asked for at every form,
    count and placement. Anything else (a list or plain tuple may be anyone's) is worked out each time."""
    if type(gpus) is not GPUs:
        return make(gpus)
    made = gpus.made
    found = made.get(kind, _NOT_MADE)
    if found is _NOT_MADE:
        found = make(gpus)  # two threads may both make it: the same value, and harmless
        if len(made) >= MADE_PER_READING:
            made.clear()
        made[kind] = found
    return found


def nvidia_visible_devices(uuids: Sequence[str]) -> str:
    """The ``NVIDIA_VISIBLE_DEVICES`` value for exactly these GPUs (:data:`NO_GPU_DEVICES` for none)."""
    return ",".join(uuids) or NO_GPU_DEVICES


@functools.lru_cache(maxsize=4096)  # inventories repeat a handful of names
def model_slug(name: str) -> str:
    """A short, stable, URL-safe slug for a GPU model name.

    >>> model_slug("NVIDIA A100-SXM4-80GB")
    'a100-sxm4-80gb'
    >>> model_slug("Tesla T4")
    't4'
    >>> model_slug("NVIDIA H100 80GB HBM3")
    'h100-80gb-hbm3'
    """
    words = re.split(r"[^a-z0-9]+", name.lower())
    kept = [w for w in words if w and w not in _VENDOR_WORDS]
    return "-".join(kept) or "unknown"


def display_name(name: str) -> str:
    """A short human label for a GPU model name.

    >>> display_name("NVIDIA A100-SXM4-80GB")
    'A100-SXM4-80GB'
    >>> display_name("Tesla T4")
    'Tesla T4'
    """
    words = name.split()
    while len(words) > 1 and words[0].lower() in _DISPLAY_DROP:
        words = words[1:]
    return " ".join(words) or name


def slug_matches(pattern: str, slug: str) -> bool:
    """Whether a configured model pattern selects a model slug.

    A pattern matches a slug equal to it or starting with it followed by a
    dash, so ``"a100"`` selects ``"a100-sxm4-80gb"`` and ``"a100-pcie-40gb"``
    but not ``"a1000"``. ``"any"`` matches everything.
    """
    pattern = pattern.lower()
    return pattern == "any" or slug == pattern or slug.startswith(pattern + "-")


def model_rank(patterns: tuple[str, ...], slug: str) -> int | None:
    """Where ``slug`` stands in a request's preference order; None if no pattern selects it.

    No patterns at all means any model, ranked 0.
    """
    if not patterns:
        return 0
    for rank, pattern in enumerate(patterns):
        if slug_matches(pattern, slug):
            return rank
    return None


@dataclass(frozen=True, order=True)
class GPU:
    """One physical GPU (or, later, a MIG instance) that can be given to a user."""

    host: str
    index: int
    uuid: str
    name: str
    memory_total: int | None = None  # bytes
    compute_capability: tuple[int, int] | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None  # as NVML reports it, e.g. 12040
    mig_mode: bool | None = None
    healthy: bool = True
    reason: str | None = field(default=None, compare=False)  # why unhealthy
    minor_number: int | None = None  # of its device node /dev/nvidiaN (character device 195:N)
    # Topology (gpuspawner.topology): the CPU-side NUMA node, the CPUs of that node, and the
    # link to each other GPU of the host by index: "NV<n>" (NVLink, n links), "PIX", "PXB",
    # "PHB", "NODE" or "SYS" (the words of nvidia-smi topo -m). None / (): unknown.
    numa_node: int | None = field(default=None, compare=False)
    cpus: tuple[int, ...] | None = field(default=None, compare=False)
    links: tuple[tuple[int, str], ...] = field(default=(), compare=False)

    @property
    def model(self) -> str:
        return model_slug(self.name)

    @property
    def memory_gib(self) -> float | None:
        if self.memory_total is None:
            return None
        return self.memory_total / 2**30

    def to_dict(self) -> dict:
        data = asdict(self)
        data["model"] = self.model
        if self.compute_capability is not None:
            data["compute_capability"] = list(self.compute_capability)
        if self.cpus is not None:
            data["cpus"] = list(self.cpus)
        data["links"] = {str(peer): level for peer, level in self.links}
        return data


def gpu_from_record(record: Mapping) -> GPU:
    """A :class:`GPU` from a dict (a ``static_gpus`` entry, saved spawner state, :meth:`GPU.to_dict`).

    Keys that are not fields are ignored; lists become tuples, ``cpus`` may be
    ``"0-15,32-47"``, ``links`` a dict ``{peer index: level}``. Raises
    ValueError (or TypeError) for values GPU cannot hold.
    """
    values = {k: v for k, v in record.items() if k in GPU.__dataclass_fields__}
    if values.get("compute_capability") is not None:
        values["compute_capability"] = tuple(values["compute_capability"])
    if "cpus" in values:
        values["cpus"] = parse_cpus(values["cpus"])
    if "links" in values:
        values["links"] = normalise_links(values["links"])
    numa = values.get("numa_node")
    if numa is not None and (type(numa) is not int or numa < 0):
        raise ValueError(f"numa_node must be a whole number >= 0, not {numa!r}")
    return GPU(**values)
