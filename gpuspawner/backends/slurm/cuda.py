"""Which CUDA version the drivers of Slurm's GPU nodes support. Pure: no I/O here.

Slurm itself does not know the NVIDIA driver's CUDA version, so the hub reads it
from what the site declares, in this order:

1. a node feature named after it, as sites tag nodes for ``--constraint``:
   ``Feature=cuda12.4`` in ``slurm.conf`` (also ``cuda_12.4``, ``cuda-12.4``,
   ``cuda12_4``); ``sinfo --json`` lists it among the node's active features.
   Several such features on one node: the newest counts.
2. the spawner's ``slurm_driver_cuda`` map, per GPU model (the GRES type's slug)
   with ``"*"`` for every other node: ``{"a100": "12.4", "*": "12.2"}``.

A node with neither has an unknown driver and is never the reason for a refusal.
Requirements (what an environment or image needs) are read by
:func:`gpuspawner.compat.min_cuda`, the one CUDA parser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...compat import CudaVersion, min_cuda

__all__ = ["CudaNeed", "DriverCuda", "feature_cuda"]

_FEATURE = re.compile(r"cuda[_-]?([0-9]{1,3})[._]([0-9]{1,3})", re.IGNORECASE)


def feature_cuda(features: tuple[str, ...]) -> CudaVersion | None:
    """The CUDA version a node's features declare (``cuda12.4`` -> (12, 4)); the newest of several.

    >>> feature_cuda(("ib", "cuda12.2", "cuda_12.4"))
    (12, 4)
    """
    found = [(int(m.group(1)), int(m.group(2))) for f in features if (m := _FEATURE.fullmatch(f.strip()))]
    return max(found) if found else None


@dataclass(frozen=True)
class DriverCuda:
    """The driver's CUDA version on a node, from its features or the configured map (slug or ``*`` -> version)."""

    by_slug: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parsed = {slug: min_cuda(text) for slug, text in self.by_slug.items()}  # ValueError for bad values
        object.__setattr__(self, "_parsed", parsed)

    def version(self, features: tuple[str, ...], slug: str) -> CudaVersion | None:
        """What the node with ``features`` supports for its GPUs of model ``slug``; None when not known."""
        declared = feature_cuda(features)
        if declared is not None:
            return declared
        parsed: dict[str, CudaVersion] = self._parsed  # type: ignore[attr-defined]
        return parsed.get(slug, parsed.get("*"))


@dataclass(frozen=True)
class CudaNeed:
    """What a spawn needs: ``version``, said of ``subject`` ("Image X", "Profile 'torch'"); ``instead``
    is what the user can pick instead ("an image", "a profile")."""

    version: CudaVersion
    subject: str
    instead: str
