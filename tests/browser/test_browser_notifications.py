"""Being told in the browser (issue 31), in real Chromium on the runnable default hub (2 x A100 + 2 x T4
simulated): the spawn-pending page tells a user their queued server is ready while its tab is in the
background, and the hub's pages show the items of the user's notification feed (the ``browser``
channel, gpuspawner.hub.browser_feed), each user only their own.

The browser is Debian's Chromium as a person runs it: tabs of one window, so a tab behind another is
really hidden (``document.visibilityState``); Playwright attaches to it over CDP without its default
overrides (which keep every page "visible" and focused). The context is granted the ``notifications``
permission, and an init script records each ``Notification`` a page makes (the real one is still made).
The hub's notifier (notify.py) is not part of this hub: its stand-in is a small admin-only handler
that gives the browser channel one notification, as the notifier's ``tell`` does.
"""

from __future__ import annotations

import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from test_walks_browser import PASSWORD, QUEUED, Someone, patient_expect, shot, wait_for  # noqa: F401

from chromium import ARGS, CHROMIUM, NEEDS_BROWSER, log_in, playwright_sync_api
from test_default_config import REPO, runnable_default

pytestmark = [pytest.mark.integration, *NEEDS_BROWSER]

sync_api = playwright_sync_api()
expect = sync_api.expect

#: the stand-in for the hub's notifier: POST /hub/api/test-tell/<user> {event, title, text, url} (admins only)
CONFIG = f"""
load_subconfig({str(REPO / "jupyterhub_config.py")!r})
from jupyterhub.apihandlers import APIHandler
from tornado import web
from gpuspawner.hub.browser_feed import feed_of

class TellHandler(APIHandler):
    async def post(self, name):
        if self.current_user is None or not getattr(self.current_user, "admin", False):
            raise web.HTTPError(403)
        body = self.get_json_body()
        await feed_of(self.settings).send(name, body["event"], body["title"], body["text"], body.get("url"))
        self.set_status(204)
        self.finish()

c.JupyterHub.extra_handlers.append((r"/api/test-tell/([^/]+)", TellHandler))
c.JupyterHub.template_vars = {{"notify_poll_seconds": 1}}
"""

#: records each Notification a page makes: title, options, whether the page was hidden; the last one's object
RECORD = """
(() => {
  const Real = window.Notification;
  if (!Real) { return; }
  window.__made = [];
  window.__objects = [];
  class Recorded extends Real {
    constructor(title, options) {
      super(title, options);
      window.__made.push({ title, body: (options || {}).body, tag: (options || {}).tag,
                           visibility: document.visibilityState });
      window.__objects.push(this);
      window.__lastNotification = this;
    }
  }
  Object.defineProperty(Recorded, "permission", { get: () => Real.permission });
  Recorded.requestPermission = (...a) => Real.requestPermission(...a);
  window.Notification = Recorded;
})();
"""


@pytest.fixture(scope="module")
def notify_hub(tmp_path_factory, fakenvml_libdir):
    folder = tmp_path_factory.mktemp("notify-hub")
    (folder / "notify_config.py").write_text(CONFIG)
    with runnable_default(folder, fakenvml_libdir, config_file=folder / "notify_config.py") as hub_and_state:
        yield hub_and_state


@contextmanager
def tabbed_chromium(folder: Path, chromium):
    """Another Debian Chromium with one window of tabs, ``chromium`` (Playwright's browser type) attached over
    CDP without its default overrides: its default context (the window's first tab is ``context.pages[0]``)."""
    profile = folder / "profile"
    log = open(folder / "chromium.log", "wb")
    proc = subprocess.Popen([CHROMIUM, *ARGS, "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
                             f"--user-data-dir={profile}", "about:blank"], stdout=log, stderr=log)
    try:
        port_file = profile / "DevToolsActivePort"
        wait_for(lambda: port_file.exists() and len(port_file.read_text().split()) == 2, "Chromium did not listen")
        port = port_file.read_text().split()[0]
        browser = chromium.connect_over_cdp(f"http://127.0.0.1:{port}", no_defaults=True)
        try:
            yield browser.contexts[0]
        finally:
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def made(page) -> list[dict]:
    """The notifications ``page`` made since it loaded."""
    return page.evaluate("window.__made || []")


def test_a_queued_server_tells_its_user_it_is_ready_while_the_tab_is_in_the_background(
        notify_hub, tmp_path, browser):
    hub, state = notify_hub
    bob, ada, carol = (Someone(hub, state, name) for name in ("bob", "ada", "carol"))
    bob.start({"profile": "gpu", "gpus": 2, "gpu_model": "any"})  # bob holds all four GPUs
    r = requests.post(bob.api + "/servers/more", json={"profile": "gpu", "gpus": 2, "gpu_model": "any"},
                      headers=bob.auth, timeout=60)
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: bob.call("GET").json()["servers"].get("more", {}).get("ready"), "bob's second server", hub)

    with tabbed_chromium(tmp_path, browser.browser_type) as tabs:
        tabs.grant_permissions(["notifications"], origin=hub.url)
        tabs.add_init_script(RECORD)
        page = tabs.pages[0]
        log_in(page, hub.url, "ada", PASSWORD, 60_000)
        # her server waits in the queue; the page says she will be told (she allowed notifications)
        page.locator(".gs-profile", has_text=QUEUED).locator("input[name=profile]").check()
        page.click("#spawn_form button[type=submit]")
        page.wait_for_url(re.compile(r"/hub/spawn-pending/ada"))
        expect(page.locator("#progress-message")).to_contain_text("Waiting for a free GPU: number 1 in the queue")
        expect(page.locator("#gpuspawner-ready-said")).to_have_text(
            "You will get a browser notification when it is ready, also while this tab is in the background.")
        expect(page.locator("#gpuspawner-ready-ask")).to_be_hidden()
        shot(page, "browser-notify", 1, "queued")

        # carol queues too, in a browser that refuses notifications: her page says so once
        refusing = browser.new_context(viewport={"width": 1400, "height": 900})
        carols = refusing.new_page()
        log_in(carols, hub.url, "carol", PASSWORD, 60_000)
        carols.locator(".gs-profile", has_text=QUEUED).locator("input[name=profile]").check()
        carols.click("#spawn_form button[type=submit]")
        expect(carols.locator("#progress-message")).to_contain_text("number 2 in the queue")
        carols.locator("#gpuspawner-ready-ask").click()
        expect(carols.locator("#gpuspawner-ready-said")).to_have_text(re.compile(
            r"^Notifications are blocked for this hub in your browser, so this page cannot tell you when your "
            r"server is ready; it still opens your server then\.$"))
        expect(carols.locator("#gpuspawner-ready-ask")).to_be_hidden()
        shot(carols, "browser-notify", 2, "blocked")

        # she reads something else in another tab: the hub's tab is hidden
        other = tabs.new_page()
        other.goto(hub.url + "/hub/gpus/usage")
        wait_for(lambda: page.evaluate("document.visibilityState") == "hidden", "the hub's tab is not hidden")

        # bob stops a server: hers starts on its GPUs while her tab is hidden, and the tab tells her
        requests.delete(bob.api + "/server", headers=bob.auth, timeout=60)
        told = wait_for(lambda: [n for n in made(page) if n["title"] == "Your server is ready"],
                        f"no notification: {made(page)}", hub, timeout=180)
        assert len(told) == 1
        assert re.fullmatch(r"On 1 x (NVIDIA A100-SXM4-80GB|Tesla T4)\. Click to open it\.", told[0]["body"]), told
        assert told[0]["visibility"] == "hidden"
        assert "/hub/spawn-pending/ada" in page.url  # it waits for her to come back before it moves on
        assert ada.call("GET").json()["servers"][""]["ready"]

        # she clicks the notification: the tab opens her server; carol's page (in front) opened hers
        page.evaluate("window.__lastNotification.dispatchEvent(new Event('click'))")
        page.wait_for_url(re.compile(r"/user/ada/lab"), timeout=120_000)
        other.close()
        carols.wait_for_url(re.compile(r"/user/carol/lab"), timeout=120_000)
        refusing.close()
    ada.stop()
    carol.stop()
    requests.delete(bob.api + "/servers/more", headers=bob.auth, timeout=60)


def tell(hub, admin: Someone, user: str, **notification) -> None:
    r = requests.post(f"{hub.url}/hub/api/test-tell/{user}", json=notification, headers=admin.auth, timeout=60)
    assert r.status_code == 204, r.text


def test_the_feed_shows_a_users_own_notifications_on_the_hubs_pages(notify_hub, browser):
    hub, state = notify_hub
    admin, ada, bob = (Someone(hub, state, name) for name in ("admin", "ada", "bob"))
    feed = hub.url + "/hub/api/gpus/notifications/feed"

    context = browser.new_context(viewport={"width": 1400, "height": 900}, permissions=["notifications"])
    context.add_init_script(RECORD)
    page = context.new_page()
    log_in(page, hub.url, "ada", PASSWORD, 60_000)
    page.goto(hub.url + "/hub/gpus/usage")
    expect(page.locator("body")).to_have_attribute("data-gpuspawner-feed", "read")  # what came before is not news
    before = {who.name: requests.get(feed, headers=who.auth, timeout=60).json()["last"] for who in (ada, bob)}

    tell(hub, admin, "bob", event="job", title="Job 7 ended", text="bob's job 7: failed")
    tell(hub, admin, "ada", event="cull", title="Odd link", text="never followed",
         url="javascript:document.body.dataset.followed='yes'")
    tell(hub, admin, "ada", event="job", title="Job 3 ended", text="Your notebook job 3 is done.",
         url=hub.url + "/hub/gpus/bookings")
    shown = wait_for(lambda: made(page)[1:] and made(page), "no notification on ada's page", hub)
    assert [n["title"] for n in shown] == ["Odd link", "Job 3 ended"]
    page.evaluate("window.__objects[0].dispatchEvent(new Event('click'))")  # a javascript: link is not followed
    page.wait_for_timeout(500)
    assert page.evaluate("document.body.dataset.followed") is None and "/hub/gpus/usage" in page.url
    told = made(page)[1:]
    assert told == [{"title": "Job 3 ended", "body": "Your notebook job 3 is done.", "tag": told[0]["tag"],
                     "visibility": "visible"}]
    page.wait_for_timeout(2500)  # two more polls: nothing is shown twice, bob's never
    assert made(page)[1:] == told
    shot(page, "browser-notify", 3, "feed")
    page.evaluate("window.__lastNotification.dispatchEvent(new Event('click'))")  # opens its link
    page.wait_for_url(re.compile(r"/hub/gpus/bookings$"))
    expect(page.locator("body")).to_have_attribute("data-gpuspawner-feed", "read")
    page.wait_for_timeout(1500)
    assert made(page) == []  # this browser showed it already

    # the REST feed: each user's own; no credentials 403; a bad since 400
    mine = requests.get(feed, params={"since": before["ada"]}, headers=ada.auth, timeout=60)
    assert mine.status_code == 200
    assert [i["text"] for i in mine.json()["items"]] == ["never followed", "Your notebook job 3 is done."]
    bobs = requests.get(feed, params={"since": before["bob"]}, headers=bob.auth, timeout=60).json()["items"]
    assert [i["text"] for i in bobs] == ["bob's job 7: failed"]
    last = mine.json()["last"]
    assert requests.get(feed, params={"since": last}, headers=ada.auth, timeout=60).json() == {
        "items": [], "last": last}
    assert requests.get(feed, timeout=60).status_code == 403
    r = ada.call("POST", "/tokens", json={"scopes": ["read:users:activity!user"], "note": "no servers"})
    narrow = {"Authorization": f"token {r.json()['token']}"}
    assert requests.get(feed, headers=narrow, timeout=60).status_code == 403  # her own read:servers is needed
    bad = requests.get(feed, params={"since": "yesterday"}, headers=ada.auth, timeout=60)
    assert bad.status_code == 400 and "since must be the id of a notification" in bad.json()["message"]

    # a browser that refuses notifications: the page offers them, says once that they are blocked, still works
    refusing = browser.new_context(viewport={"width": 1400, "height": 900})
    plain = refusing.new_page()
    log_in(plain, hub.url, "bob", PASSWORD, 60_000)
    plain.goto(hub.url + "/hub/gpus/usage")
    plain.locator("#gpuspawner-notify-ask").click()
    note = plain.locator("#gpuspawner-notify-note")
    expect(note).to_have_text(re.compile(r"^Notifications are blocked for this hub in your browser"))
    expect(plain.locator("#gpuspawner-notify-ask")).to_be_hidden()
    expect(plain.locator("h1")).to_have_text("Your GPU usage")
    shot(plain, "browser-notify", 4, "blocked")
    context.close()
    refusing.close()
