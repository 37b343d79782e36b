"""Shared fixtures: the stand-in NVML library, built once per test session."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fakenvml_libdir(tmp_path_factory) -> Path:
    """Directory holding the stand-in libnvidia-ml.so.1, compiled from tests/fakenvml."""
    import fakenvml

    return fakenvml.build(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture
def browser():
    """A headless Chromium (Debian's), closed after the test."""
    from chromium import ARGS, CHROMIUM

    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e .[test])")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()
