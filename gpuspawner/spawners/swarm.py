"""Moved to :mod:`gpuspawner.backends.swarm.spawner`; kept so existing configurations keep working."""

from gpuspawner.backends.swarm.spawner import *  # noqa: F403
