"""Moved to :mod:`gpuspawner.backends.docker.spawner`; kept so existing configurations keep working."""

from gpuspawner.backends.docker.spawner import *  # noqa: F403
