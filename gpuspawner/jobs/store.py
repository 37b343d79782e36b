"""Moved to :mod:`gpuspawner.jobmodel.store`; kept for code that imports it by this name."""

from ..jobmodel.store import *  # noqa: F403
