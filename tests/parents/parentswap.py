"""A pytest plugin that puts a gpuspawner class where a parent spawner's own tests expect the parent.

Loaded with ``-p parentswap`` into a run of a parent's unmodified test folder (see
:mod:`parentsuite`). It acts when it is imported, which pytest does for ``-p``
plugins before it reads the parent's ``conftest.py``, so every ``from kubespawner
import KubeSpawner`` in their files already finds the GPU class. What to swap comes
from the environment variable ``GPUSPAWNER_SWAP`` (JSON):

- ``targets``: ``[[module, attribute], ...]``, the names the parent's tests import
  the parent class by (``[["kubespawner", "KubeSpawner"]]``); a third item
  ``"module:Class"`` puts that gpuspawner class there instead of ``gpu_class``
  (a parent package with several classes: ``["dockerspawner", "SwarmSpawner",
  "gpuspawner.backends.swarm.spawner:GPUSwarmSpawner"]``);
- ``gpu_class``: ``"module:Class"``, the gpuspawner class put there;
- ``mode``: ``"parent"`` (swap nothing: the baseline), ``"cpu"`` (the GPU class with
  only a CPU profile) or ``"default"`` (the GPU class with gpuspawner's default profiles);
- ``defaults``: ``{trait: value}``, more class defaults of the GPU class in this run
  (e.g. a static GPU inventory), given as a site's ``c.GPUSpawnerMixin`` would.
"""

from __future__ import annotations

import copy
import importlib
import json
import os

from traitlets import default

CPU_ONLY = [{"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]}]


def _with_defaults(cls: type, values: dict) -> type:
    """A subclass of ``cls`` (same name) whose traits ``values`` default to the given values."""
    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    for key, value in values.items():
        namespace[f"_swap_default_{key}"] = default(key)(lambda self, v=value: copy.deepcopy(v))
    return type(cls.__name__, (cls,), namespace)


def _load(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _swap() -> None:
    settings = json.loads(os.environ.get("GPUSPAWNER_SWAP", "{}"))
    mode = settings.get("mode", "parent")
    if mode == "parent":
        return
    defaults = dict(settings.get("defaults") or {})
    if mode == "cpu":
        defaults.setdefault("gpu_profiles", CPU_ONLY)
    elif mode != "default":
        raise ValueError(f"GPUSPAWNER_SWAP mode {mode!r}: use parent, cpu or default")
    swapped: dict[str, type] = {}  # one class per gpuspawner class, wherever it goes
    for target_module, attribute, *chosen in settings["targets"]:
        path = chosen[0] if chosen else settings["gpu_class"]
        if path not in swapped:
            gpu_class = _load(path)
            swapped[path] = _with_defaults(gpu_class, defaults) if defaults else gpu_class
        setattr(importlib.import_module(target_module), attribute, swapped[path])


_swap()
