"""Skip, or fail in CI: the one rule for a test whose real part is missing here.

Docker tests need a dockerd they can start, browser tests Debian's Chromium,
Playwright and the built JupyterLab extension. On a developer's machine a
missing part skips the test, saying why. In CI (``CI`` set to ``true``, as
CI services and ``.ci/run`` do) it fails the test instead, so that a run
which silently lost its Docker or browser tests cannot pass.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """True when the environment says this is a CI run (``CI=true``, ``CI=1``, ...)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """Skip the calling test (or module) because of ``reason``; in CI, fail it with that reason."""
    __tracebackhide__ = True  # reports name the test's line, not this one
    if in_ci():
        pytest.fail(f"{reason} [CI is set: a missing part fails instead of skipping]", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def module(name: str, reason: str) -> ModuleType:
    """Import ``name``; where it is not installed, :func:`missing` with ``reason``."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(reason)
