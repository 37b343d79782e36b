"""The GPU status bar and panel in real JupyterLab, in real Chromium, on the stand-in NVML.

Chromium is Debian's (/usr/bin/chromium, installed by scripts/setup) driven by
Playwright; Playwright's own browsers are never downloaded. Screenshots go to
test-artifacts/ (gitignored).
"""

from __future__ import annotations

import os
import re

import pytest

import chromium
import fakenvml
from jupyter_server_proc import JupyterServer

pytestmark = [pytest.mark.monitor, *chromium.NEEDS_BROWSER]
sync_api = chromium.playwright_sync_api()




def lab(tmp_path, env, monkeypatch) -> JupyterServer:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    return JupyterServer(tmp_path / "lab", {**env, **chromium.checkout_extension_env(tmp_path)},
                         ["--GPUMonitor.interval=0.5"], app="jupyterlab")


def canvas_images(page) -> list[str]:
    """The charts shown (a GPU without NVLink has no NVLink chart)."""
    return page.eval_on_selector_all(".jp-gpuspawner-Card .jp-gpuspawner-Chart:not([hidden]) canvas",
                                     "cs => cs.map(c => c.toDataURL())")


def test_status_bar_and_panel_follow_the_stand_in(tmp_path, fakenvml_libdir, browser, monkeypatch):
    path = chromium.one_gpu_file(tmp_path / "gpus.json", **chromium.FIRST_READING)
    chromium.ARTIFACTS.mkdir(exist_ok=True)
    with lab(tmp_path, fakenvml.env(fakenvml_libdir, path), monkeypatch) as server:
        page = chromium.open_page(browser, f"{server.url}lab?token={server.token}")
        status = page.locator("[data-gpuspawner=status]")
        chromium.expect_first_status(sync_api, status)

        status.click()  # opens the GPU panel (command gpu:open-panel)
        card = page.locator(".jp-gpuspawner-Card[data-gpu-index='0']")
        sync_api.expect(card.locator("[data-field=util]")).to_have_text("Utilisation: 73 / 100 %")
        sync_api.expect(card.locator("[data-field=memory]")).to_have_text("Memory: 12.1 / 80.0 GiB")
        sync_api.expect(card.locator("[data-field=power]")).to_have_text("Power: 250 / 400 W")
        sync_api.expect(card.locator("[data-field=clocks]")).to_contain_text("sm 1410 / 1410 MHz")
        page.wait_for_timeout(1500)  # a few points on the charts
        before = canvas_images(page)
        assert len(before) == 5  # utilisation, memory, temperature, power, PCIe

        busy = fakenvml.make_device(0, utilization_gpu=41, memory_used=int(60.5 * 2**30), temperature=71,
                                    power_usage=380_000, processes=[{"pid": os.getpid(), "used_memory": 2**31}])
        fakenvml.write_config(path, {"devices": [busy]})
        sync_api.expect(status).to_have_text("GPU 41% | 60.5 / 80.0 GiB")
        sync_api.expect(card.locator("[data-field=util]")).to_have_text("Utilisation: 41 / 100 %")
        sync_api.expect(card.locator("[data-field=temperature]")).to_have_text("Temperature: 71 °C")
        processes = card.locator(".jp-gpuspawner-Processes")
        sync_api.expect(processes).to_contain_text(str(os.getpid()))
        sync_api.expect(processes).to_contain_text("not started by a kernel of this server")
        page.wait_for_timeout(1500)
        after = canvas_images(page)
        assert len(after) == len(before) == 5, "the panel still shows its five charts"
        assert all(a != b for a, b in zip(before, after, strict=True)), "every chart drew the new values"
        page.screenshot(path=str(chromium.ARTIFACTS / "monitor-lab-panel.png"))

        # power reading stops being supported: the panel says N/A and why
        busy["faults"] = {"nvmlDeviceGetPowerUsage": "NOT_SUPPORTED"}
        fakenvml.write_config(path, {"devices": [busy]})
        power = card.locator("[data-field=power]")
        sync_api.expect(power).to_have_text("Power: N/A (not supported by this GPU or driver)")


def test_panel_shows_the_link_matrix_and_nvlink_throughput(tmp_path, fakenvml_libdir, browser, monkeypatch):
    path = tmp_path / "gpus.json"
    config = fakenvml.layout("cube-mesh-8")
    for device in config["devices"]:
        device["nvlink"]["tx_kibps"] = 2000
        device["pcie"]["tx_kbps"] = 1000
    fakenvml.write_config(path, config)
    with lab(tmp_path, fakenvml.env(fakenvml_libdir, path), monkeypatch) as server:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.set_default_timeout(120_000)
        page.goto(f"{server.url}lab?token={server.token}")
        status = page.locator("[data-gpuspawner=status]")
        sync_api.expect(status).to_contain_text("GPU", timeout=120_000)
        status.click()
        topology = page.locator("[data-gpuspawner=topology]")
        row = topology.locator("tr[data-gpu-index='0'] > *")
        sync_api.expect(row).to_have_text(["GPU0", "X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS", "0-31", "0"])
        assert topology.locator("tr[data-gpu-index='0'] td[data-link=NV2]").first.get_attribute("title") == (
            "NVLink, 2 links")
        card = page.locator(".jp-gpuspawner-Card[data-gpu-index='0']")
        # 6 links sending 2000 KiB/s each: 12.3 MB/s once two samples are in (a rate between
        # two samples: a little either way)
        sync_api.expect(card.locator("[data-field=nvlink]")).to_have_text(
            re.compile(r"NVLink \(6 links\): tx 1[12]\.\d · rx 0\.0 MB/s"))
        sync_api.expect(card.locator("[data-field=pcie]")).to_have_text("PCIe: tx 1.0 · rx 0.0 MB/s")
        page.screenshot(path=str(chromium.ARTIFACTS / "monitor-lab-topology.png"))


def test_no_driver_is_said_plainly(tmp_path, fakenvml_libdir, browser, monkeypatch):
    with lab(tmp_path, fakenvml.env(fakenvml_libdir, None), monkeypatch) as server:
        page = browser.new_page(viewport={"width": 1200, "height": 700})
        page.set_default_timeout(120_000)
        page.goto(f"{server.url}lab?token={server.token}")
        status = page.locator("[data-gpuspawner=status]")
        sync_api.expect(status).to_have_text("GPU: N/A", timeout=120_000)
        assert "NVIDIA driver is not loaded" in status.get_attribute("title")
        status.click()
        sync_api.expect(page.locator("[data-gpuspawner=panel-status]")).to_contain_text(
            "NVIDIA driver is not loaded. GPU statistics are not available on this server.")
        chromium.ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(chromium.ARTIFACTS / "monitor-lab-no-driver.png"))
