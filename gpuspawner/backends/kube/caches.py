"""What gpu-kube keeps for one hub beside the ledger: ``hub_state.cache(KubeCaches)``."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from .api import ClusterCapacity


@dataclass
class KubeCaches:
    """gpu-kube's per-hub caches, each made empty and filled on use."""

    #: the capacity reader of each Kubernetes API client (a client gone drops its reader)
    kube_capacity: weakref.WeakKeyDictionary[Any, ClusterCapacity] = field(default_factory=weakref.WeakKeyDictionary)
