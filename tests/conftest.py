"""Shared fixtures: the stand-in NVML library, built once per test session, and the browser.

Servers run as unprivileged accounts (gpu-local makes one per hub user), and read
what the tests write for them (the stand-in NVML, its GPU files, notebooks) under
the tests' temporary folders. pytest makes those folders for root alone (mode 0700,
under ``/tmp/pytest-of-root``, which every root pytest run on the machine resets):
as root, this session's temporary folders lie in a folder of their own instead, and
each test's folder may be passed through (mode 0711: entered, not listed). The
hub's own files stay its own (the test hub's database is mode 0600).
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hub import passable
from needs import missing


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if os.geteuid() == 0 and config.option.basetemp is None and not hasattr(config, "workerinput"):
        top = Path(tempfile.mkdtemp(prefix="gpuspawner-tests-"))
        top.chmod(0o711)
        config.option.basetemp = str(top / "t")
        config._gpuspawner_tmp = top


def pytest_unconfigure(config):
    top = getattr(config, "_gpuspawner_tmp", None)
    if top is not None:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def tmp_path(tmp_path):
    """pytest's own, which servers (unprivileged accounts) may pass through."""
    return passable(tmp_path)


@pytest.fixture(scope="session")
def fakenvml_libdir(tmp_path_factory) -> Path:
    """Directory holding the stand-in libnvidia-ml.so.1, compiled from tests/fakenvml."""
    import fakenvml

    return passable(fakenvml.build(tmp_path_factory.mktemp("fakenvml")))


@pytest.fixture(scope="session")
def fakenvml_v1_libdir(tmp_path_factory) -> Path:
    """The stand-in without nvmlDeviceGetMemoryInfo_v2, as a driver before 510."""
    import fakenvml

    return passable(fakenvml.build(tmp_path_factory.mktemp("fakenvml-v1"), without_memory_v2=True))


@pytest.fixture(scope="session")
def chromium_installed() -> None:
    """Debian's Chromium is there; else the test skips (fails in CI)."""
    from chromium import CHROMIUM

    if not os.access(CHROMIUM, os.X_OK):
        missing(f"needs Debian's chromium at {CHROMIUM} (scripts/setup installs it)")


@pytest.fixture(scope="session")
def labextension_built() -> None:
    """The JupyterLab extension is built; else the test skips (fails in CI)."""
    from chromium import BUILT

    if not BUILT.exists():
        missing("the JupyterLab extension is not built (scripts/setup builds it)")


@pytest.fixture
def browser(chromium_installed):
    """A headless Chromium (Debian's), closed after the test."""
    from chromium import ARGS, CHROMIUM, playwright_sync_api

    with playwright_sync_api().sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()
