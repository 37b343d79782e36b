"""Shared fixtures: the stand-in NVML library, built once per test session, and the browser."""

import os
from pathlib import Path

import pytest

from needs import missing


@pytest.fixture(scope="session")
def fakenvml_libdir(tmp_path_factory) -> Path:
    """Directory holding the stand-in libnvidia-ml.so.1, compiled from tests/fakenvml."""
    import fakenvml

    return fakenvml.build(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture(scope="session")
def fakenvml_v1_libdir(tmp_path_factory) -> Path:
    """The stand-in without nvmlDeviceGetMemoryInfo_v2, as a driver before 510."""
    import fakenvml

    return fakenvml.build(tmp_path_factory.mktemp("fakenvml-v1"), without_memory_v2=True)


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
