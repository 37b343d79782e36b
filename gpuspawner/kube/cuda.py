"""An image's CUDA requirement, and the node affinity that honours it.

Kept separate from any NVML-side compatibility helper (``gpuspawner/compat.py``
on another branch): this one only needs "which CUDA version does the image ask
for" and turns it into Kubernetes node affinity on the labels NVIDIA GPU
Feature Discovery puts on GPU nodes (``nvidia.com/cuda.driver.major`` and
``nvidia.com/cuda.driver.minor``: the newest CUDA version the node's driver
supports).
"""

from __future__ import annotations

import re
from typing import Any

CUDA_MAJOR_LABEL = "nvidia.com/cuda.driver.major"
CUDA_MINOR_LABEL = "nvidia.com/cuda.driver.minor"

CudaVersion = tuple[int, int]

_PLAIN = re.compile(r"\s*(?:cuda\s*>=\s*)?([0-9]{1,3})(?:\.([0-9]{1,3}))?(?:\.[0-9]{1,4})?\s*")
_TERM = re.compile(r"cuda\s*>=\s*([0-9]{1,3})(?:\.([0-9]{1,3}))?", re.IGNORECASE)


class CudaRequirementError(ValueError):
    """A CUDA requirement that cannot be understood."""


def parse_kube_cuda_requirement(text: Any) -> CudaVersion:
    """The CUDA version an image needs, from configuration text.

    Accepts ``"12.4"``, ``"12"``, ``"12.4.1"``, ``"cuda>=12.4"`` and whole
    ``NVIDIA_REQUIRE_CUDA`` values as CUDA images declare them
    (``"cuda>=12.4 brand=tesla,driver>=470,driver<471 ..."``: only the
    ``cuda>=`` term matters for node selection).

    >>> parse_kube_cuda_requirement("cuda>=12.4 brand=tesla,driver>=470,driver<471")
    (12, 4)
    >>> parse_kube_cuda_requirement("11")
    (11, 0)
    """
    if not isinstance(text, str):
        raise CudaRequirementError(f"CUDA requirement must be a string such as '12.4', not {type(text).__name__}")
    plain = _PLAIN.fullmatch(text)
    match = plain or _TERM.search(text)
    if match is None:
        shown = text if len(text) <= 60 else text[:60] + "..."
        raise CudaRequirementError(f"{shown!r} is not a CUDA requirement such as '12.4' or 'cuda>=12.4'")
    return int(match.group(1)), int(match.group(2) or 0)


def node_supports(labels: dict[str, str], need: CudaVersion) -> bool | None:
    """Whether a node's driver supports CUDA ``need``; None when the node does not say."""
    try:
        have = (int(labels[CUDA_MAJOR_LABEL]), int(labels.get(CUDA_MINOR_LABEL, "0")))
    except (KeyError, ValueError):
        return None
    return have >= need


def node_cuda(labels: dict[str, str]) -> CudaVersion | None:
    """The newest CUDA version a node's driver supports, from its GFD labels."""
    try:
        return int(labels[CUDA_MAJOR_LABEL]), int(labels.get(CUDA_MINOR_LABEL, "0"))
    except (KeyError, ValueError):
        return None


def cuda_affinity_terms(need: CudaVersion) -> list[list[dict[str, Any]]]:
    """Node selector terms (ORed) that each hold the match expressions (ANDed)
    for "the driver supports CUDA ``need``".

    Kubernetes' ``Gt`` compares integers strictly, so ``>= 12.4`` becomes
    ``major > 12`` OR (``major == 12`` AND ``minor > 3``).
    """
    major, minor = need
    newer_major = [{"key": CUDA_MAJOR_LABEL, "operator": "Gt", "values": [str(major)]}]
    same_major = [{"key": CUDA_MAJOR_LABEL, "operator": "In", "values": [str(major)]}]
    if minor > 0:
        same_major.append({"key": CUDA_MINOR_LABEL, "operator": "Gt", "values": [str(minor - 1)]})
    return [newer_major, same_major]


def format_cuda(version: CudaVersion) -> str:
    return f"{version[0]}.{version[1]}"
