"""What gpu-slurm keeps for one hub beside the ledger: ``hub_state.cache(SlurmCaches)``."""

from __future__ import annotations

from dataclasses import dataclass, field

from .commands import SlurmReader


@dataclass
class SlurmCaches:
    """gpu-slurm's per-hub caches, each made empty and filled on use."""

    #: the sinfo readers, per filled-in exec_prefix (or per reason it cannot be filled in)
    slurm_readers: dict[tuple[str, ...], SlurmReader] = field(default_factory=dict)
