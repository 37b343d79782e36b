"""Debian's Chromium driven by Playwright: what every browser test shares.

Playwright never downloads a browser of its own (that fails here); the
tests use /usr/bin/chromium (scripts/setup installs it). Where Chromium,
Playwright or the built JupyterLab extension is missing the tests skip,
and fail in CI (tests/needs.py decides).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import needs

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"  # screenshots kept from each run (gitignored)
BUILT = ROOT / "gpuspawner" / "labextension" / "static" / "style.js"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]

# Marks that check before any other fixture starts (a Docker engine, a hub); the fixtures are in tests/conftest.py.
#: the test needs Debian's Chromium (the ``browser`` fixture checks it too)
NEEDS_CHROMIUM = pytest.mark.usefixtures("chromium_installed")
#: the test needs the built JupyterLab extension
NEEDS_LABEXTENSION = pytest.mark.usefixtures("labextension_built")
#: marks for a test that needs the browser and the built JupyterLab extension
NEEDS_BROWSER = [NEEDS_CHROMIUM, NEEDS_LABEXTENSION]


def checkout_extension_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a Jupyter server that loads the extension built in this checkout.

    pip copies the built extension into the venv only when it installs the package, so
    that copy lags behind a rebuild (and belongs to whichever checkout installed it). A
    ``labextensions`` folder on JUPYTER_PATH comes first, so the server finds this
    checkout's gpuspawner/labextension there.
    """
    data = tmp_path / "jupyter-data"
    (data / "labextensions").mkdir(parents=True, exist_ok=True)
    link = data / "labextensions" / "gpuspawner-monitor"
    if not link.exists():
        link.symlink_to(BUILT.parents[1], target_is_directory=True)
    return {"JUPYTER_PATH": str(data)}


def playwright_sync_api():
    """``playwright.sync_api``; where Playwright is missing, skips the calling module (fails it in CI)."""
    __tracebackhide__ = True
    return needs.module("playwright.sync_api", "needs playwright (pip install -e .[test])")


def hub_login(browser, hub_url: str, name: str, password: str = "test-password"):
    """A new page (1400 x 900, 2-minute timeouts) logged in to the hub at ``hub_url`` as ``name``."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(120_000)
    log_in(page, hub_url, name, password)
    return page


def log_in(page, hub_url: str, name: str, password: str = "test-password", timeout_ms: int | None = None) -> None:
    """Log ``page`` in to the hub at ``hub_url`` as ``name`` (the dummy authenticator's form); with
    ``timeout_ms``, that is the page's default timeout from now on."""
    if timeout_ms is not None:
        page.set_default_timeout(timeout_ms)
    page.goto(hub_url + "/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(lambda url: "/hub/login" not in url)


# ------------------------------------------------------------ the GPU monitor's pages (Lab and Notebook 7)

#: the stand-in A100's first reading in the monitor's browser tests, and what the status item shows for it
FIRST_READING = {"utilization_gpu": 73, "memory_used": int(12.1 * 2**30), "temperature": 55, "power_usage": 250_000}
FIRST_STATUS = "GPU 73% | 12.1 / 80.0 GiB"
FIRST_TITLE = "GPU 0 NVIDIA A100-SXM4-80GB: 73%, 12.1 / 80.0 GiB, 55 °C, 250 W"


def one_gpu_file(path: Path, **reading) -> Path:
    """Write a stand-in device file holding one A100 with ``reading`` (NVML fields)."""
    import fakenvml

    fakenvml.write_config(path, {"devices": [fakenvml.make_device(0, **reading)]})
    return path


def open_page(browser, url: str):
    """A new 1400x900 page at ``url``, waiting up to 2 minutes for what it looks for."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(120_000)
    page.goto(url)
    return page


def expect_first_status(sync_api, status) -> None:
    """The status item shows the first reading, and its tooltip the GPU's details."""
    sync_api.expect(status).to_have_text(FIRST_STATUS, timeout=120_000)
    assert FIRST_TITLE in status.get_attribute("title")
