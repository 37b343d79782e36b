"""A pytest plugin for kubespawner's own tests on this machine (JupyterHub 6, no cluster).

Loaded with ``-p kubeparent`` beside :mod:`parentswap` by
``test_kubespawner_suite.py``. Their test bodies and fixtures stay as they are;
this adapts only what JupyterHub 6 changed under them:

- their session fixture ``ssl_app`` builds a JupyterHub app and calls
  ``init_internal_ssl()``, which in JupyterHub 6 makes an HTTP client that needs
  a running event loop (JupyterHub 5 did not): the fixture's body is run inside
  one here.

The cluster tests skip themselves: the kubeconfig the suite is run with points
at ``https://127.0.0.1:1``, where nothing answers.
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
