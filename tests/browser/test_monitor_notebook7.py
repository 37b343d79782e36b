"""The GPU status item and panel in real Notebook 7, in real Chromium, on the stand-in NVML.

Notebook 7 has no status bar: the extension puts its GPU item in the top bar of
every page, and opens the GPU panel in the right side panel (Notebook 7 keeps one
document per page in its main area). Screenshots go to test-artifacts/ (gitignored).
"""

from __future__ import annotations

import json

import pytest

import chromium
import fakenvml
import needs
from jupyter_server_proc import JupyterServer

pytestmark = [pytest.mark.monitor, *chromium.NEEDS_BROWSER]
sync_api = chromium.playwright_sync_api()
needs.module("notebook.app", "needs Notebook 7 (pip install -e .[test])")


def notebook7(tmp_path, env, monkeypatch) -> JupyterServer:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    workdir = tmp_path / "nb7"
    workdir.mkdir()
    # a notebook with its kernel named, so Notebook 7 asks no kernel question on opening it
    (workdir / "train.ipynb").write_text(json.dumps({
        "cells": [], "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    }))
    return JupyterServer(workdir, {**env, **chromium.checkout_extension_env(tmp_path)}, ["--GPUMonitor.interval=0.5"],
                         app="notebook")


@pytest.mark.parametrize("page_path", ["notebooks/train.ipynb", "tree"])
def test_top_bar_item_and_panel_follow_the_stand_in(tmp_path, fakenvml_libdir, browser, monkeypatch, page_path):
    path = chromium.one_gpu_file(tmp_path / "gpus.json", **chromium.FIRST_READING)
    chromium.ARTIFACTS.mkdir(exist_ok=True)
    with notebook7(tmp_path, fakenvml.env(fakenvml_libdir, path), monkeypatch) as server:
        page = chromium.open_page(browser, f"{server.url}{page_path}?token={server.token}")
        status = page.get_by_role("banner").locator("[data-gpuspawner=status]")  # the top bar
        chromium.expect_first_status(sync_api, status)

        status.click()  # opens the GPU panel (command gpu:open-panel) in the right side panel
        panel = page.locator("#gpuspawner-gpu-panel")
        sync_api.expect(panel).to_be_visible()
        card = panel.locator(".jp-gpuspawner-Card[data-gpu-index='0']")
        sync_api.expect(card.locator("[data-field=util]")).to_have_text("Utilisation: 73 / 100 %")
        sync_api.expect(card.locator("[data-field=memory]")).to_have_text("Memory: 12.1 / 80.0 GiB")
        sync_api.expect(card.locator("[data-field=power]")).to_have_text("Power: 250 / 400 W")
        sync_api.expect(card.locator("[data-field=clocks]")).to_contain_text("sm 1410 / 1410 MHz")
        if page_path.startswith("notebooks/"):
            # the notebook is still the page's document, beside the panel
            sync_api.expect(page.locator(".jp-NotebookPanel")).to_be_visible()

        busy = fakenvml.make_device(0, utilization_gpu=41, memory_used=int(60.5 * 2**30), temperature=71,
                                    power_usage=380_000)
        fakenvml.write_config(path, {"devices": [busy]})
        sync_api.expect(status).to_have_text("GPU 41% | 60.5 / 80.0 GiB")
        sync_api.expect(card.locator("[data-field=util]")).to_have_text("Utilisation: 41 / 100 %")
        sync_api.expect(card.locator("[data-field=temperature]")).to_have_text("Temperature: 71 °C")
        page.screenshot(path=str(chromium.ARTIFACTS / f"monitor-notebook7-{page_path.split('/')[0]}.png"))
