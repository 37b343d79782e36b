"""The notification settings page (issue 31, "Being told"), in real Chromium on a real hub whose admin
configured an email sender and one allowed webhook prefix. A screenshot of each step in
test-artifacts/ (walk-notify-*.png).

A user finds "Notifications" in the navigation bar, gives an address and a webhook outside the
allowed prefix (the page shows the hub's sentence and nothing is stored), then an allowed one with
one event turned off: saved, and what the REST API answers and the page shows on reload agree.
"""

from __future__ import annotations

import pytest
from test_walks_browser import open_login, shot

import fakenvml
from chromium import NEEDS_BROWSER, playwright_sync_api
from gpuspawner.simulation import simulated_config
from hub import Hub

pytestmark = [pytest.mark.integration, *NEEDS_BROWSER]

expect = playwright_sync_api().expect

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1], "default": True}]
ALLOWED = "https://hooks.example.org/gpu/"
CONFIG = f"""
from gpuspawner.hub.setup import configure
c.GPUSpawnerMixin.gpu_notify_email = "mailto://127.0.0.1:1?from=gpus@example.org"
c.GPUSpawnerMixin.gpu_notify_webhook_prefixes = [{ALLOWED!r}]
configure(c)
"""


@pytest.fixture
def hub(tmp_path, fakenvml_libdir):
    gpus = tmp_path / "gpus.json"
    fakenvml.write_config(gpus, simulated_config(a100=1, t4=1))
    hub = Hub(tmp_path / "hub", fakenvml.env(fakenvml_libdir, gpus), PROFILES, extra_config=CONFIG)
    hub.start()
    try:
        hub.add_users("gil")
        yield hub
    finally:
        hub.close()


def settings_of(hub: Hub, user: str) -> dict:
    r = hub.api("GET", "/gpus/notifications", params={"user": user})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_user_sets_their_address_webhook_and_events_on_the_page(hub, browser):
    page = open_login(browser, hub.url, "gil")
    page.click("#login_submit")
    page.locator("#gpuspawner-nav-notifications").click()
    expect(page.locator("h1")).to_have_text("Notifications")
    expect(page.locator("#gpuspawner-notify-events thead")).to_contain_text("email")
    shot(page, "notify", 1, "page")

    form = page.locator("#gpuspawner-notify-form")
    form.locator("input[name=email]").fill("gil@example.org")
    form.locator("input[name=webhook]").fill("https://evil.example.net/steal")
    form.locator("#notify-save").click()
    error = page.locator("#gpuspawner-notify-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("webhook: 'https://evil.example.net/steal' is not under an allowed prefix")
    shot(page, "notify", 2, "refused")
    assert settings_of(hub, "gil")["email"] == ""  # nothing stored

    form.locator("input[name=webhook]").fill(ALLOWED + "gil")
    form.locator("input[data-channel=email][data-event=cull]").uncheck()
    form.locator("#notify-save").click()
    expect(page.locator("#gpuspawner-notify-done")).to_be_visible()
    expect(error).to_be_hidden()
    shot(page, "notify", 3, "saved")
    saved = settings_of(hub, "gil")
    assert (saved["email"], saved["webhook"]) == ("gil@example.org", ALLOWED + "gil")
    assert saved["events"]["email"]["cull"] is False and saved["events"]["email"]["ready"] is True
    assert saved["events"]["webhook"]["cull"] is True

    page.reload()
    expect(form.locator("input[name=email]")).to_have_value("gil@example.org")
    expect(form.locator("input[data-channel=email][data-event=cull]")).not_to_be_checked()
    expect(form.locator("input[data-channel=webhook][data-event=cull]")).to_be_checked()
