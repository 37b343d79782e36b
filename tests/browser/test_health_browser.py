"""In real Chromium: an administrator brings a GPU back into service with /hub/gpus' button."""

from __future__ import annotations

import pytest
import requests

from chromium import ARTIFACTS, NEEDS_CHROMIUM, hub_login, playwright_sync_api
from ops_hub import OpsHub

sync_api = playwright_sync_api()

pytestmark = [pytest.mark.integration, NEEDS_CHROMIUM]

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1],
             "default_gpus": 1, "default": True}]


def test_the_return_to_service_button_brings_a_gpu_back(tmp_path, fakenvml_libdir, browser):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, mixin={"gpu_health_poll_interval": 1.0})
    hub.start()
    try:
        hub.add_users("boss")
        page = hub_login(browser, hub.url, "boss")
        page.wait_for_url("**/hub/**")
        gpu = hub.gpus_config["devices"][0]["uuid"]
        page.goto(hub.url + "/hub/gpus")
        # taken out by hand (through the page's own session: the API's cookie login and its XSRF check)
        taken = page.evaluate("""([url, gpu]) => fetch(url + "/hub/api/gpus/health/" + gpu, {
            method: "POST", body: JSON.stringify({healthy: false, reason: "fan noise"}),
            headers: {"Content-Type": "application/json", "X-XSRFToken": window.jhdata.xsrf_token},
        }).then(r => r.status)""", [hub.url, gpu])
        assert taken == 200
        page.reload()
        health = page.locator(f"#gpuspawner-gpu-table tr[data-uuid='{gpu}'] [data-field=health]")
        sync_api.expect(health).to_contain_text("taken out by an administrator: fan noise")
        sync_api.expect(health.locator("[data-field=health-since]")).to_contain_text("out of service since 20")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "health-gpu-out.png"), full_page=True)
        health.get_by_role("button", name="Return to service").click()
        sync_api.expect(health).to_have_text("ok", timeout=30_000)  # the page refreshes itself
        r = requests.get(hub.url + "/hub/api/gpus", headers={"Authorization": f"token {hub.reader_token}"}, timeout=30)
        assert {g["uuid"]: g["health"] for g in r.json()["gpus"]}[gpu] == "ok"
    finally:
        hub.close()
