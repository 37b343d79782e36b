"""Moved to :mod:`gpuspawner.backends.slurm.spawner`; kept so existing configurations keep working."""

from gpuspawner.backends.slurm.spawner import *  # noqa: F403
