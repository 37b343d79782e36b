"""Moved to :mod:`gpuspawner.backends.kube.spawner`; kept so existing configurations keep working."""

from gpuspawner.backends.kube.spawner import *  # noqa: F403
