"""The bookings page (/hub/gpus/bookings) on a real hub: who sees what, and the way in.

The page's booked windows and its form run in the browser against the bookings REST API
(tests/browser/test_bookings_browser.py); here: the page as the hub renders it.
"""

from __future__ import annotations

import re
import time

import pytest
import requests

from gpuspawner.bookings import span
from hub import login
from ops_hub import OpsHub
from test_local_hub import start
from test_ops_overview import PROFILES, user_token

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def booking_hub(tmp_path_factory, fakenvml_libdir):
    hub = OpsHub(tmp_path_factory.mktemp("bookings-page"), fakenvml_libdir, PROFILES,
                 groups={"class-ml": {"users": ["ada"]}, "other": {"users": ["bob"]}})
    hub.start()
    try:
        hub.add_users("ada", "bob", "boss")
        start(hub, "bob", {"profile": "gpu", "gpus": 1, "gpu_model": "a100-sxm4-80gb"})
        start(hub, "ada", {"profile": "gpu", "gpus": 2, "gpu_model": "t4"})
        yield hub
    finally:
        hub.close()


def page(hub, session: requests.Session) -> str:
    r = session.get(hub.url + "/hub/gpus/bookings", timeout=60)
    assert r.status_code == 200, r.text
    return r.content.decode()


def held_line(html: str, model: str) -> str:
    found = re.search(rf'data-model="{model}".*?data-field="held">(.*?)</span>', html, re.S)
    assert found, html
    return " ".join(found.group(1).split())


def test_logged_out_visitors_are_sent_to_the_login_page(booking_hub):
    r = requests.get(booking_hub.url + "/hub/gpus/bookings", timeout=60, allow_redirects=False)
    assert r.status_code == 302 and "/hub/login" in r.headers["Location"]


def test_a_user_sees_every_model_their_own_holdings_and_the_form_without_groups(booking_hub):
    html = page(booking_hub, login(booking_hub, "ada"))
    assert 'id="gpuspawner-nav-bookings"' in html  # the navbar's link
    assert "<h1 class=\"h3 mt-3\">GPU bookings</h1>" in html and "Your bookings" in html
    assert held_line(html, "t4") == "held now: ada 2 · 2 in all"
    assert held_line(html, "a100-sxm4-80gb") == "none held now · 2 in all"  # bob's server is not hers to see
    assert "bob" not in html
    assert 'name="group"' not in html and 'data-admin="false"' in html
    assert re.findall(r'<option value="([^"]+)" data-name=', html) == ["a100-sxm4-80gb", "t4", "any"]


def test_an_administrator_sees_everyone_and_may_book_for_a_group(booking_hub):
    html = page(booking_hub, login(booking_hub, "boss"))
    assert "All bookings" in html and 'data-admin="true"' in html
    assert held_line(html, "a100-sxm4-80gb") == "held now: bob 1 · 2 in all"
    assert held_line(html, "t4") == "held now: ada 2 · 2 in all"
    groups = re.search(r'<select[^>]*name="group">(.*?)</select>', html, re.S).group(1)
    assert re.findall(r'<option value="([^"]*)">', groups) == ["", "class-ml", "other"]


def test_the_spawn_form_says_what_is_booked_soon_and_for_whom(booking_hub):
    boss = login(booking_hub, "boss")
    auth = {"Authorization": f"token {user_token(booking_hub, boss, 'boss')}"}
    start = (int(time.time()) // 60 + 90) * 60
    r = requests.post(booking_hub.url + "/hub/api/gpus/bookings", headers=auth, timeout=60, json={
        "model": "t4", "count": 1, "start": start, "end": start + 7200, "group": "class-ml"})
    assert r.status_code == 201, r.text
    html = login(booking_hub, "bob").get(booking_hub.url + "/hub/spawn/bob/more", timeout=60).content.decode()
    assert f"Booked: Tesla T4: 1 of 2 booked {span(start, start + 7200)} by group class-ml" in html, html
    assert requests.delete(booking_hub.url + f"/hub/api/gpus/bookings/{r.json()['id']}", headers=auth,
                           timeout=60).status_code == 204
    html = login(booking_hub, "bob").get(booking_hub.url + "/hub/spawn/bob/more", timeout=60).content.decode()
    assert "gs-booked" not in html  # cancelled: no longer said
