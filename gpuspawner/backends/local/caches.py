"""What gpu-local keeps for one hub beside the ledger: ``hub_state.cache(LocalCaches)``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .fence import Isolation
from .processes import StartFence


@dataclass
class LocalCaches:
    """gpu-local's per-hub caches, each made empty and filled on use."""

    #: how this host isolates servers' GPUs, detected once per hub
    local_isolation: Isolation | None = None
    #: the start fence per isolation mechanism
    local_fences: dict[str, StartFence] = field(default_factory=dict)
    #: owner -> the spawn id of the start this hub recorded for it
    local_starts: dict[str, str] = field(default_factory=dict)
    #: owner -> the pid of the server process found at reconciliation
    local_pids: dict[str, int] = field(default_factory=dict)
    #: orphan servers being stopped (their tasks, kept until done)
    local_orphans: set[asyncio.Future] = field(default_factory=set)
    #: one account change at a time, per account name
    local_account_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
