"""In real Chromium: the admin GPU page and the admin page's GPU section of a real hub, and the
culler's notice in real JupyterLab.

Debian's Chromium (/usr/bin/chromium) through Playwright, launched as in
test_monitor_lab.py; Playwright's own browsers are never downloaded.
"""

from __future__ import annotations

import re

import pytest
import requests

import fakenvml
from chromium import ARTIFACTS, NEEDS_CHROMIUM, NEEDS_LABEXTENSION, hub_login, playwright_sync_api
from jupyter_server_proc import JupyterServer
from ops_hub import OpsHub
from test_local_hub import TWO_GPUS, start

sync_api = playwright_sync_api()

pytestmark = [
    pytest.mark.integration,
    NEEDS_CHROMIUM,
]

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2],
             "default_gpus": 1, "default": True}]


def test_admin_page_shows_holders_and_live_utilisation(tmp_path, fakenvml_libdir, browser):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES)
    hub.start()
    try:
        hub.add_users("alice")
        alice = start(hub, "alice", TWO_GPUS)
        page = hub_login(browser, hub.url, "boss")
        page.wait_for_url("**/hub/**")
        page.goto(hub.url + "/hub/gpus")
        sync_api.expect(page.locator("h1")).to_have_text("GPUs")
        for uuid in alice:
            row = page.locator(f"#gpuspawner-gpu-table tr[data-uuid='{uuid}']")
            sync_api.expect(row.locator("[data-field=holder]")).to_contain_text("alice")
            sync_api.expect(row.locator("[data-field=holder]")).to_contain_text("running")
        assert page.locator("#gpuspawner-gpu-table [data-field=holder]:has-text('free')").count() == 2
        sync_api.expect(page.locator("#gpuspawner-models")).to_contain_text("Tesla T4")

        hub.set_utilization(dict.fromkeys(alice, 64))  # the page refreshes itself
        first = sorted(alice)[0]
        sync_api.expect(page.locator(f"tr[data-uuid='{first}'] [data-field=util]")).to_have_text("64 %", timeout=60_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ops-admin-gpus.png"), full_page=True)

        # JupyterHub's admin page, with gpuspawner's section filled by its script; then the navbar's link
        page.goto(hub.url + "/hub/admin")
        held = page.locator("#gpuspawner-admin-gpus tr[data-owner='alice/'] [data-field=gpus]")
        sync_api.expect(held).to_have_text(re.compile(r"^2 x (NVIDIA A100-SXM4-80GB|Tesla T4)$"))
        sync_api.expect(page.locator("#react-admin-hook")).to_contain_text("alice")  # the React app still draws
        page.screenshot(path=str(ARTIFACTS / "ops-admin-page-gpus.png"), full_page=True)
        page.locator("#gpuspawner-nav-usage").click()
        sync_api.expect(page.locator("h1")).to_have_text("GPU usage")
        page.screenshot(path=str(ARTIFACTS / "ops-admin-usage.png"), full_page=True)
    finally:
        hub.close()


@NEEDS_LABEXTENSION
def test_culler_notice_shows_in_jupyterlab(tmp_path, fakenvml_libdir, browser, monkeypatch):
    path = tmp_path / "gpus.json"
    fakenvml.write_config(path, {"devices": [fakenvml.make_device(0)]})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    with JupyterServer(tmp_path / "lab", fakenvml.env(fakenvml_libdir, path), [], app="jupyterlab") as server:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(120_000)
        page.goto(f"{server.url}lab?token={server.token}")
        sync_api.expect(page.locator("[data-gpuspawner=status]")).to_be_visible(timeout=120_000)
        message = "This server will be stopped in 10 minutes because its GPUs are idle (test)."
        r = requests.post(f"{server.url}api/gpus/notices", headers={"Authorization": f"token {server.token}"},
                          json={"id": "gpu-culler", "level": "warning", "message": message, "source": "gpu-culler"},
                          timeout=30)
        assert r.status_code == 201, r.text
        sync_api.expect(page.get_by_text(message).first).to_be_visible(timeout=60_000)  # a notification
        page.locator("[data-gpuspawner=status]").click()  # the GPU panel lists it too
        sync_api.expect(page.locator("[data-gpuspawner=notices]")).to_contain_text(message)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ops-lab-notice.png"))
