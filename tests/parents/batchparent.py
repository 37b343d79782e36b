"""A pytest plugin for batchspawner's own tests on this machine (JupyterHub 6, pytest-asyncio 1.x).

Loaded with ``-p batchparent`` beside :mod:`parentswap` by
``test_batchspawner_suite.py``, which also passes ``--import-mode=importlib`` and
``consider_namespace_packages``. Their test bodies and fixtures stay as they are;
this adapts only what their layout and JupyterHub >= 5 need:

- their tests import the spawners relatively (``from .. import SlurmSpawner``), as
  ``batchspawner.tests``; their folder holds only ``batchspawner/tests`` (the sdist
  does not ship it). That ``batchspawner`` folder joins the installed package's
  ``__path__``, so ``batchspawner.tests.test_spawners`` imports from their folder and
  ``..`` is the installed batchspawner, where :mod:`parentswap` put the GPU class.
- their ``conftest.py`` imports ``event_loop`` from ``jupyterhub.tests.conftest``,
  which JupyterHub >= 5 no longer has (pytest-asyncio 1.x dropped that fixture too):
  an ``event_loop`` fixture giving the running loop is put there first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import batchspawner
import jupyterhub.tests.conftest as jupyterhub_conftest
import pytest
import pytest_asyncio


@pytest_asyncio.fixture
async def event_loop():
    """The loop the test runs in (what pytest-asyncio's old fixture of that name gave)."""
    return asyncio.get_running_loop()


if not hasattr(jupyterhub_conftest, "event_loop"):
    jupyterhub_conftest.event_loop = event_loop


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before their conftest is read: each ``.../batchspawner/tests`` folder named on the command line
    makes its ``batchspawner`` folder part of the installed package."""
    for arg in args:
        named = Path(arg.split("::")[0]).absolute()
        for folder in (named, named.resolve()):  # as named (pytest imports by that path) and through any link
            while folder.name and folder.name != "tests":
                folder = folder.parent
            package = folder.parent
            if folder.name == "tests" and package.name == "batchspawner" and str(package) not in batchspawner.__path__:
                batchspawner.__path__.append(str(package))
