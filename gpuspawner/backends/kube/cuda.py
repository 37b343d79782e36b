"""Node affinity that honours an image's CUDA requirement.

The requirement itself is read by :func:`gpuspawner.compat.min_cuda`, the one
CUDA parser. This module turns it into Kubernetes node affinity on the labels
NVIDIA GPU Feature Discovery puts on GPU nodes (``nvidia.com/cuda.driver.major``
and ``nvidia.com/cuda.driver.minor``: the newest CUDA version the node's driver
supports).
"""

from __future__ import annotations

from typing import Any

from ...compat import CudaVersion

CUDA_MAJOR_LABEL = "nvidia.com/cuda.driver.major"
CUDA_MINOR_LABEL = "nvidia.com/cuda.driver.minor"


def node_cuda(labels: dict[str, str]) -> CudaVersion | None:
    """The newest CUDA version a node's driver supports, from its GFD labels."""
    try:
        return int(labels[CUDA_MAJOR_LABEL]), int(labels.get(CUDA_MINOR_LABEL, "0"))
    except (KeyError, ValueError):
        return None


def node_supports(labels: dict[str, str], need: CudaVersion) -> bool | None:
    """Whether a node's driver supports CUDA ``need``; None when the node does not say."""
    have = node_cuda(labels)
    return None if have is None else have >= need


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
