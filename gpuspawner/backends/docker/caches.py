"""What gpu-docker and gpu-swarm keep for one hub beside the ledger: ``hub_state.cache(DockerCaches)``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DockerCaches:
    """gpu-docker's and gpu-swarm's per-hub caches, each made empty and filled on use."""

    #: container conflicts already logged, per backend name (logged once, not per pass)
    docker_conflicts: dict[str, set[str]] = field(default_factory=dict)
    #: backends (by name) whose inventory source was checked against their runtime, once per hub
    inventory_checked: set[str] = field(default_factory=set)
