"""Finding things on a real hub (issue 29): the navigation bar's links, each user's own GPU overview
and usage, the admin page's GPU section, end reasons in words, and the usage filters' answers.

One hub for the module: alice held one GPU (stopped), holds one now (running); bob held two (culled,
as the GPU idle culler reports it); boss is the admin. Busy and idle time come in through the
culler's own report endpoint, posted here with the admin's token, as the culler would post them.
"""

from __future__ import annotations

import re
from datetime import datetime

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings, strategies as st

from gpuspawner.hub.usage import GROUPINGS
from hub import login
from ops_hub import OpsHub
from test_local_hub import start
from test_ops_overview import user_token

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2],
             "default_gpus": 1, "default": True}]
ONE_GPU = {"profile": "gpu", "gpus": 1, "gpu_model": "any"}
TWO_GPUS = {"profile": "gpu", "gpus": 2, "gpu_model": "any"}
NAV = [("/hub/gpus", "GPUs"), ("/hub/gpus/usage", "GPU usage"), ("/hub/gpus/bookings", "Bookings"),
       ("/hub/gpus/notifications", "Notifications")]


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Site:
    """The module's hub, its people's sessions and tokens."""

    def __init__(self, hub: OpsHub) -> None:
        self.hub = hub
        self.url = hub.url
        self.alice, self.bob, self.boss = (login(hub, n) for n in ("alice", "bob", "boss"))
        self.tokens = {name: user_token(hub, web, name)
                       for name, web in (("alice", self.alice), ("bob", self.bob), ("boss", self.boss))}

    def api(self, who: str, path: str, **params) -> requests.Response:
        return requests.get(self.url + "/hub/api" + path, params=params, timeout=30,
                            headers={"Authorization": f"token {self.tokens[who]}"})

    def report(self, body: dict) -> None:
        r = requests.post(self.url + "/hub/api/gpus/usage/report", json=body, timeout=30,
                          headers={"Authorization": f"token {self.tokens['boss']}"})
        assert r.status_code == 200 and r.json()["recorded"], r.text


@pytest.fixture(scope="module")
def site(tmp_path_factory, fakenvml_libdir):
    hub = OpsHub(tmp_path_factory.mktemp("finding"), fakenvml_libdir, PROFILES)
    hub.start()
    try:
        hub.add_users("alice", "bob", "boss")
        site = Site(hub)
        start(hub, "alice", ONE_GPU)
        start(hub, "bob", TWO_GPUS)
        rows = {r["owner"]: r for r in site.api("boss", "/gpus/usage", by="allocation").json()["rows"]}
        began = epoch(rows["alice/"]["started"])
        # alice's GPU: 60 s busy (90 %), then 60 s idle (0 %), by the culler's rule at a 10 % threshold
        site.report({"owner": "alice/", "threshold": 10,
                     "samples": [[began + 1, 90], [began + 61, 90], [began + 121, 0]]})
        site.report({"owner": "bob/", "end_reason": "culled"})  # what the culler says before it stops bob
        hub.stop_server("bob")
        hub.stop_server("alice")
        start(hub, "alice", ONE_GPU)
        yield site
    finally:
        hub.close()


def nav_links(html: str) -> list[tuple[str, str]]:
    navbar = html[html.index('<nav class="navbar'):html.index("</nav>")]
    return re.findall(r'<a class="nav-link" id="gpuspawner-nav-[a-z]+" href="([^"]+)">([^<]+)</a>', navbar)


def test_navbar_links_overview_and_usage_on_every_hub_page(site):
    for web, pages in ((site.alice, ["/hub/home", "/hub/token", "/hub/gpus", "/hub/gpus/usage"]),
                       (site.bob, ["/hub/spawn"]), (site.boss, ["/hub/home", "/hub/admin", "/hub/gpus"])):
        for page in pages:
            r = web.get(site.url + page, timeout=30)
            assert r.status_code == 200, (page, r.text)
            assert nav_links(r.text) == NAV, page
            assert 'href="/hub/home">Home</a>' in r.text  # JupyterHub's own items stay
    # the links are for logged-in people: the login page has none
    assert not re.search(r"gpuspawner-nav-", requests.get(site.url + "/hub/login", timeout=30).text)


def test_each_user_sees_their_own_gpus_admins_every_gpu(site):
    alice = site.api("alice", "/gpus").json()
    assert [g["holder"]["user"] for g in alice["gpus"]] == ["alice"]
    assert sum(m["total"] for m in alice["models"]) == 4 and sum(m["free"] for m in alice["models"]) == 3
    assert alice["isolation"] is None and alice["viewer"] == "alice"
    bob = site.api("bob", "/gpus").json()
    assert bob["gpus"] == [] and bob["queue"] == [] and sum(m["free"] for m in bob["models"]) == 3
    page = site.bob.get(site.url + "/hub/gpus", timeout=30).text
    assert "<h1" in page and "Your GPUs</h1>" in page and "Your servers and jobs hold no GPU now." in page
    assert "alice" not in page

    everyone = site.api("boss", "/gpus").json()
    assert len(everyone["gpus"]) == 4 and "viewer" not in everyone
    assert "GPUs</h1>" in site.boss.get(site.url + "/hub/gpus", timeout=30).text
    # a service with neither the overview's scope nor GPUs of its own: 403 (as before)
    assert site.hub.overview(site.hub.token).status_code == 403


def test_admin_page_lists_each_servers_gpus_and_model(site):
    admin = site.boss.get(site.url + "/hub/admin", timeout=30).text
    assert 'id="react-admin-hook"' in admin  # JupyterHub's own admin app stays
    assert 'id="gpuspawner-admin-gpus" data-refresh="/hub/gpus?fragment=admin"' in admin
    section = site.boss.get(site.url + "/hub/gpus?fragment=admin", timeout=30)
    assert section.status_code == 200
    row = re.search(r'<tr data-owner="alice/">(.*?)</tr>', section.text, re.S)
    assert row, section.text
    cells = re.findall(r"<td[^>]*>\s*(.*?)\s*</td>", row.group(1), re.S)
    assert cells[:3] == ["alice", "default server", "1 x NVIDIA A100-SXM4-80GB"] or \
        cells[:3] == ["alice", "default server", "1 x Tesla T4"], cells
    assert cells[3] == "running"
    assert 'data-owner="bob/"' not in section.text  # bob holds nothing now
    # only readers of everyone's GPUs: not alice, whatever she holds; a fragment it has not: 400
    assert site.alice.get(site.url + "/hub/gpus?fragment=admin", timeout=30).status_code == 403
    assert site.boss.get(site.url + "/hub/gpus?fragment=2", timeout=30).status_code == 400


def history(html: str) -> list[tuple[str, str, str]]:
    """(owner, end reason code, words shown) of each row of the usage page's history."""
    return re.findall(r'<tr data-owner="([^"]*)" data-end-reason="([^"]*)">.*?<td data-field="how"[^>]*>([^<]*)</td>',
                      html, re.S)


def test_each_user_sees_their_own_usage_busy_idle_and_end_reasons(site):
    page = site.alice.get(site.url + "/hub/gpus/usage", timeout=30)
    assert page.status_code == 200
    assert "Your GPU usage</h1>" in page.text and "bob" not in page.text
    assert history(page.text) == [("alice/", "", "Running"), ("alice/", "stopped", "Stopped")]
    server = re.search(r'<tr data-owner="alice/"><td>default server</td>(.*?)</tr>', page.text, re.S)
    assert server, page.text
    assert 'data-field="busy">0.02<' in server.group(1) and 'data-field="idle">0.02<' in server.group(1)

    # her CSV link, followed as a browser follows a link, gives her rows
    link = re.search(r'href="(/hub/api/gpus/usage\?format=csv&amp;by=allocation[^"]*)"', page.text).group(1)
    csv = site.alice.get(site.url + link.replace("&amp;", "&"), headers={"Sec-Fetch-Mode": "navigate"}, timeout=30)
    assert csv.status_code == 200 and csv.text.count(",alice/,") == 2 and "bob" not in csv.text, csv.text

    mine = site.api("alice", "/gpus/usage", by="server").json()
    assert mine["user"] == "alice" and [r["key"] for r in mine["rows"]] == ["alice/"]
    assert mine["rows"][0]["busy_gpu_hours"] == mine["rows"][0]["idle_gpu_hours"] == round(60 / 3600, 4)
    assert [r["user"] for r in site.api("alice", "/gpus/usage", by="allocation").json()["rows"]] == ["alice"] * 2
    assert site.api("alice", "/gpus/usage", user="alice").status_code == 200
    # someone else's usage: 403, on the API and the page, and never their rows
    for who in ("bob", "boss", "nobody"):
        r = site.api("alice", "/gpus/usage", user=who, by="allocation")
        assert r.status_code == 403 and "your own GPU usage only" in r.json()["message"]
        r = site.alice.get(site.url + "/hub/gpus/usage", params={"user": who}, timeout=30)
        assert r.status_code == 403 and 'data-owner="bob/"' not in r.text


def test_admin_sees_everyones_usage_filters_by_user_and_reads_end_reasons(site):
    page = site.boss.get(site.url + "/hub/gpus/usage", timeout=30).text
    assert "GPU usage</h1>" in page and "Per user" in page and "Per group" in page
    assert ("bob/", "culled", "Stopped: GPUs idle") in history(page)
    assert ("alice/", "stopped", "Stopped") in history(page)
    # the date filter's placeholders are hints, the fields empty
    for name in ("since", "until"):
        field = re.search(rf'<input [^>]*id="{name}"[^>]*>', page, re.S).group(0)
        assert 'placeholder="YYYY-MM-DD"' in field and 'value=""' in field
    bob = site.boss.get(site.url + "/hub/gpus/usage", params={"user": "bob"}, timeout=30).text
    assert "GPU usage of bob</h1>" in bob
    assert history(bob) == [("bob/", "culled", "Stopped: GPUs idle")]
    assert [r["key"] for r in site.api("boss", "/gpus/usage", user="bob", by="user").json()["rows"]] == ["bob"]
    # a bad date: 400 with a sentence that says what to write
    bad = site.boss.get(site.url + "/hub/gpus/usage", params={"since": "yesterday"}, timeout=30)
    assert bad.status_code == 400 and "yesterday" in bad.text and "is not a time: use ISO 8601" in bad.text


CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f]")  # what tornado makes spaces of in an argument, before its strip
VALID_TIMES = ["", "2026-11-01", "2026-11-01T08:00:00Z", "1700000000"]
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
times = st.one_of(st.sampled_from(VALID_TIMES + ["yesterday", "2026-13-01", "nan", "-1e308", "1e20", "%s", "%"]),
                  texts)
PARAMETERS = st.fixed_dictionaries({}, optional={
    "since": times, "until": times, "by": st.one_of(st.sampled_from(GROUPINGS), texts),
    "format": st.one_of(st.sampled_from(["json", "csv"]), texts),
    "user": st.one_of(st.sampled_from(["alice", "bob", " alice "]), texts)})


def valid(params: dict) -> bool:
    """Whether every parameter is one the hub takes (a valid since with until now, a grouping, a format)."""
    return (params.get("since", "").strip() in VALID_TIMES and params.get("until", "").strip() == ""
            and params.get("by", "user") in GROUPINGS and params.get("format", "json") in ("json", "csv"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=PARAMETERS)
@example(params={"since": "%", "by": "%s"})
@example(params={"user": "bob", "since": "yesterday"})
@example(params={"user": "al\x01ice"})
def test_usage_parameters_answer_200_400_or_403_never_500(site, params):
    asked = CONTROL.sub(" ", params.get("user", "")).strip()
    for who, web in (("boss", site.boss), ("alice", site.alice)):
        forbidden = who == "alice" and asked not in ("", "alice")
        r = site.api(who, "/gpus/usage", **params)
        page = web.get(site.url + "/hub/gpus/usage", params=params, timeout=30)
        for answer in (r, page):
            assert answer.status_code < 500, (who, params, answer.text)
            if forbidden:
                assert answer.status_code == 403, (who, params, answer.text)
        if r.status_code == 400:
            assert r.json()["message"], params
        elif r.status_code == 200 and who == "alice":
            assert "bob" not in r.text, params
        if valid(params) and not forbidden and len(asked) <= 255:
            assert r.status_code == 200, (who, params, r.text)
        if who == "boss":
            assert page.status_code in (200, 400), (params, page.status_code)
