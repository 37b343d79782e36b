"""JupyterHub spawner backends; each is a thin adapter over GPUSpawnerMixin.

The names below are imported on first use, so that importing one backend's module
(or :mod:`.processes`, which the job runners use) does not import the others.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {"GPUSpawnerMixin": ".base", "GPULocalProcessSpawner": ".local", "GPUSimpleLocalProcessSpawner": ".local"}

__all__ = ["GPUSpawnerMixin", "GPULocalProcessSpawner", "GPUSimpleLocalProcessSpawner"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
