"""A pytest plugin that puts a gpuspawner class where a parent spawner's own tests expect the parent.

Loaded with ``-p parentswap`` into a run of a parent's unmodified test folder (see
:mod:`parentsuite`). It acts when it is imported, which pytest does for ``-p``
plugins before it reads the parent's ``conftest.py``, so every ``from kubespawner
import KubeSpawner`` in their files already finds the GPU class. What to swap comes
from the environment variable ``GPUSPAWNER_SWAP`` (JSON):

- ``targets``: ``[[module, attribute], ...]``, the names the parent's tests import
  the parent class by (``[["kubespawner", "KubeSpawner"]]``);
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


def _swap() -> None:
    settings = json.loads(os.environ.get("GPUSPAWNER_SWAP", "{}"))
    mode = settings.get("mode", "parent")
    if mode == "parent":
        return
    module, _, name = settings["gpu_class"].partition(":")
    gpu_class = getattr(importlib.import_module(module), name)
    defaults = dict(settings.get("defaults") or {})
    if mode == "cpu":
        defaults.setdefault("gpu_profiles", CPU_ONLY)
    elif mode != "default":
        raise ValueError(f"GPUSPAWNER_SWAP mode {mode!r}: use parent, cpu or default")
    swapped = _with_defaults(gpu_class, defaults) if defaults else gpu_class
    for target_module, attribute in settings["targets"]:
        setattr(importlib.import_module(target_module), attribute, swapped)


_swap()
