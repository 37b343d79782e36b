"""Moved to :mod:`gpuspawner.backends.local.spawner`; kept so existing configurations keep working."""

from gpuspawner.backends.local.spawner import *  # noqa: F403
