"""The GPU record every part of gpuspawner speaks about, and model slugs.

A :class:`GPU` is a plain, immutable value: inventory sources produce them,
placement chooses among them, backends turn them into device requests. It
carries no NVML handle, so it can be compared, hashed, logged and stored.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

# Words that name the vendor or a product line rather than the model.
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


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


def slug_matches(pattern: str, slug: str) -> bool:
    """Whether a configured model pattern selects a model slug.

    A pattern matches a slug equal to it or starting with it followed by a
    dash, so ``"a100"`` selects ``"a100-sxm4-80gb"`` and ``"a100-pcie-40gb"``
    but not ``"a1000"``. ``"any"`` matches everything.
    """
    pattern = pattern.lower()
    return pattern == "any" or slug == pattern or slug.startswith(pattern + "-")


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
    minor_number: int | None = None  # of its device node /dev/nvidiaN (character device 195:N)
    healthy: bool = True
    reason: str | None = field(default=None, compare=False)  # why unhealthy

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
        return data
