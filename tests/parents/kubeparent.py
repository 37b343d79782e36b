"""A pytest plugin for kubespawner's own tests on this machine (JupyterHub 6).

Loaded with ``-p kubeparent`` beside :mod:`parentswap` by
``test_kubespawner_suite.py``. Their test bodies and fixtures stay as they are;
this adapts only what JupyterHub 6 changed under them:

- their session fixture ``ssl_app`` builds a JupyterHub app and calls
  ``init_internal_ssl()``, which in JupyterHub 6 makes an HTTP client that needs
  a running event loop (JupyterHub 5 did not): the fixture's body is run inside
  one here.

Their cluster tests run against the test run's control plane (the kubeconfig and namespaces
``test_kubespawner_suite.py`` gives them), their tests and fixtures in one event loop (pytest's
``-o asyncio_default_*_loop_scope=session``, given there too).
"""

from __future__ import annotations

import asyncio
import functools

import pytest


def _in_a_running_loop(func):
    """``func`` (a sync fixture function) called from inside a running event loop."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        async def call():
            return func(*args, **kwargs)

        return asyncio.run(call())

    return wrapper


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.argname == "ssl_app" and not getattr(fixturedef.func, "_in_loop", False):
        fixturedef.func = _in_a_running_loop(fixturedef.func)
        fixturedef.func._in_loop = True
