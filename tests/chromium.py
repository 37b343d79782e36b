"""Debian's Chromium driven by Playwright: what every browser test shares.

Playwright never downloads a browser of its own (that fails here); the
tests use /usr/bin/chromium (scripts/setup installs it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"  # screenshots kept from each run (gitignored)
BUILT = ROOT / "gpuspawner" / "labextension" / "static" / "style.js"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]

NEEDS_CHROMIUM = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK), reason="needs Debian's chromium at /usr/bin/chromium (scripts/setup installs it)")
NEEDS_LABEXTENSION = pytest.mark.skipif(
    not BUILT.exists(), reason="the JupyterLab extension is not built (scripts/setup builds it)")
#: skip marks for a test that needs the browser and the built JupyterLab extension
NEEDS_BROWSER = [NEEDS_CHROMIUM, NEEDS_LABEXTENSION]
