"""Bookings (issue 30), in real Chromium on the runnable default hub (2 x A100 + 2 x T4 simulated).

Two walks, a screenshot of each step in test-artifacts/ (walk-booking-*.png):

- an administrator books both A100s for a class on the bookings page (after a booking the hub
  cannot take, whose sentence the page shows, booking nothing); during the window a student of
  the class gets them, while someone else is refused with the sentence that names the booking;
- a user whose server starts before someone's window is warned in JupyterLab that it will be
  stopped when the window starts, and it is, its usage record saying why.
"""

from __future__ import annotations

import re
import time

import pytest
import requests
from test_walks_browser import Someone, choose, open_login, patient_expect, shot, wait_for  # noqa: F401

from chromium import NEEDS_BROWSER, playwright_sync_api
from test_default_config import default_hub  # noqa: F401  (default_hub: this module's hub)

pytestmark = [pytest.mark.integration, *NEEDS_BROWSER]

sync_api = playwright_sync_api()
expect = sync_api.expect


def minute(t: float) -> str:
    """``t`` as a datetime-local input takes it (UTC, to the minute)."""
    return time.strftime("%Y-%m-%dT%H:%M", time.gmtime(t))


def api(someone: Someone, method: str, path: str, **kwargs) -> requests.Response:
    """``someone``'s call to the hub's REST API at ``/hub/api{path}``."""
    return requests.request(method, someone.hub.url + "/hub/api" + path, headers=someone.auth, timeout=60, **kwargs)


def fill_booking(page, model: str, count: int, start: float, end: float, group: str = "") -> None:
    form = page.locator("#gpuspawner-booking-form")
    values = form.locator("select[name=model] option").evaluate_all("os => os.map(o => o.value)")
    form.locator("select[name=model]").select_option(next(v for v in values if v.startswith(model)))
    form.locator("input[name=count]").fill(str(count))
    form.locator("input[name=start]").fill(minute(start))
    form.locator("input[name=end]").fill(minute(end))
    if group:
        form.locator("select[name=group]").select_option(group)
    form.locator("button[type=submit]").click()


def test_a_class_booked_on_the_page_gets_its_gpus_and_others_are_refused(default_hub, browser):  # noqa: F811
    hub, state = default_hub
    admin_api = Someone(hub, state, "admin")
    ada = Someone(hub, state, "ada")
    r = api(admin_api, "POST", "/groups/class-ml", json={"users": ["ada"]})
    assert r.status_code in (201, 409), r.text

    # 1. the administrator finds the bookings page in the navigation bar
    admin = open_login(browser, hub.url, "admin")
    admin.click("#login_submit")
    admin.wait_for_url(lambda url: "/hub/login" not in url)
    admin.locator("#gpuspawner-nav-bookings").click()
    expect(admin.locator("h1")).to_have_text("GPU bookings")
    expect(admin.locator("#gpuspawner-bookings-table")).to_contain_text("No bookings yet.")
    shot(admin, "booking", 1, "page")

    # 2. a booking the hub cannot take: the API's sentence on the page, nothing booked
    now = time.time()
    fill_booking(admin, "a100", 3, now, now + 2 * 3600, group="class-ml")
    error = admin.locator("#gpuspawner-booking-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("3 GPUs cannot be booked")
    shot(admin, "booking", 2, "refused")
    assert api(admin_api, "GET", "/gpus/bookings").json()["bookings"] == []

    # 3. both A100s for the class, from now for two hours: on the timeline and in the table
    fill_booking(admin, "a100", 2, now, now + 2 * 3600, group="class-ml")
    expect(admin.locator("#gpuspawner-booking-done")).to_contain_text(re.compile(r"Booked b-\w+: 2 x "))
    row = admin.locator("#gpuspawner-bookings-table tbody tr").first
    expect(row.locator("[data-field=for]")).to_have_text("group class-ml")
    expect(row.locator("[data-field=status]")).to_have_text("active")
    bar = admin.locator(".gs-model[data-model^=a100] .gs-booking")
    expect(bar).to_have_text("2 · group class-ml")
    shot(admin, "booking", 3, "booked")

    # 4. bob is not in the class: his spawn form says so, and his A100 spawn is refused, naming the booking
    page = open_login(browser, hub.url, "bob")
    page.click("#login_submit")
    card = page.locator("#gpuspawner-form [data-profile=gpu]")
    expect(card.locator(".gs-booked")).to_contain_text(re.compile(r"2 of 2 booked .* by group class-ml"))
    choose(page, "gpu", "a100", 1)
    shot(page, "booking", 4, "form")
    page.click("#spawn_form button[type=submit]")
    refusal = page.locator(".spawn-error-msg")
    expect(refusal).to_contain_text("booked")
    expect(refusal).to_contain_text("group class-ml")
    shot(page, "booking", 5, "refused")

    # 5. ada, of the class, gets both A100s at once
    ada.start({"profile": "gpu", "gpus": 2, "gpu_model": "any"})
    held = wait_for(lambda: [g for g in api(admin_api, "GET", "/gpus").json()["gpus"]
                             if (g["holder"] or {}).get("user") == "ada"], "ada holds no GPU", hub)
    assert sorted(g["name"] for g in held) == ["NVIDIA A100-SXM4-80GB"] * 2
    admin.reload()
    expect(admin.locator(".gs-model[data-model^=a100] [data-field=held]")).to_contain_text("ada 2")
    shot(admin, "booking", 6, "honoured")
    ada.stop()

    # 6. the administrator cancels it
    admin.locator("#gpuspawner-bookings-table .gs-cancel").first.click()
    expect(admin.locator("#gpuspawner-bookings-table tbody tr").first.locator("[data-field=status]")).to_have_text(
        "cancelled")
    shot(admin, "booking", 7, "cancelled")


def test_a_server_started_before_a_window_is_warned_in_jupyterlab_and_stopped_when_it_starts(
        default_hub, browser):  # noqa: F811
    hub, state = default_hub
    admin_api = Someone(hub, state, "admin")
    window = time.time() + 90
    assert api(admin_api, "POST", "/users/dave").status_code in (201, 409)
    r = api(admin_api, "POST", "/gpus/bookings", json={
        "model": "t4", "count": 2, "start": window, "end": window + 3600, "user": "dave", "note": "deadline run"})
    assert r.status_code == 201, r.text
    booking = r.json()["id"]

    # carol starts a T4 server before dave's window: she is told she may keep it until then
    carol = open_login(browser, hub.url, "carol")
    carol.click("#login_submit")
    choose(carol, "gpu", "t4", 1)
    carol.click("#spawn_form button[type=submit]")
    carol.wait_for_url(re.compile(r"/user/carol/lab"), timeout=120_000)
    # the warning (the window is less than gpu_booking_warn_before away), as a JupyterLab notification
    warning = carol.get_by_text(re.compile(r"This server will be stopped in \d+ minutes?, at \d\d:\d\d UTC: "
                                           rf"its GPUs are booked from then by dave \(booking {booking}\)"))
    expect(warning.first).to_be_visible(timeout=120_000)
    shot(carol, "booking", 8, "warned")

    # at the window's start her server is stopped; her usage says why
    wait_for(lambda: "" not in Someone(hub, state, "carol").call("GET").json()["servers"],
             "carol's server was not stopped at the window's start", hub, timeout=180)
    assert time.time() >= window
    carol.goto(hub.url + "/hub/gpus/usage")
    expect(carol.locator(".gpuspawner-usage-history tr[data-owner='carol/'] [data-field=how]").first).to_have_text(
        "Stopped: GPUs booked")
    shot(carol, "booking", 9, "stopped")
