"""Moved to :mod:`gpuspawner.backends.docker.spawner` (and its engine helpers to
:mod:`gpuspawner.backends.docker.engine`); kept so existing configurations keep working."""

from gpuspawner.backends.docker.engine import *  # noqa: F403
from gpuspawner.backends.docker.spawner import *  # noqa: F403
