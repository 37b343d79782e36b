"""GPU bookings over REST on a real hub (2 simulated A100s, 2 T4s): book, list, cancel, refusals, restarts."""

from __future__ import annotations

import json
import signal
import time

import pytest
import requests
from hypothesis import HealthCheck, given, settings, strategies as st

from hub import login
from ops_hub import OpsHub

pytestmark = pytest.mark.integration

A100 = "a100-sxm4-80gb"
PROFILES = [
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2], "default": True},
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
]
H = 3600


@pytest.fixture(scope="module")
def hub(tmp_path_factory, fakenvml_libdir):
    hub = OpsHub(tmp_path_factory.mktemp("bookings"), fakenvml_libdir, PROFILES,
                 mixin={"gpu_booking_max_window": 4 * H, "gpu_booking_hours_per_week": 10},
                 groups={"class-ml": {"users": ["cat"]}})
    hub.start()
    hub.add_users("ann", "bob", "cat", "boss")
    hub.tokens = {name: user_token(hub, name) for name in ("ann", "bob", "cat", "boss")}
    try:
        yield hub
    finally:
        hub.close()


def user_token(hub, name: str) -> str:
    session = login(hub, name)
    xsrf = session.cookies.get("_xsrf", path="/hub/")
    r = session.post(f"{hub.url}/hub/api/users/{name}/tokens", json={"note": "test"},
                     headers={"X-XSRFToken": xsrf, "Referer": hub.url + "/hub/token"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def call(hub, who: str, method: str, path: str = "", **kwargs) -> requests.Response:
    return requests.request(method, f"{hub.url}/hub/api/gpus/bookings{path}", timeout=60,
                            headers={"Authorization": f"token {hub.tokens[who]}"}, **kwargs)


def listed(hub, who: str) -> list[dict]:
    r = call(hub, who, "GET")
    assert r.status_code == 200, r.text
    return r.json()["bookings"]


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def test_a_user_books_sees_and_cancels_their_booking_and_others_cannot(hub):
    start = time.time() + 2 * H
    r = call(hub, "ann", "POST", json={"model": "a100", "count": 2, "start": iso(start), "end": start + H,
                                       "note": "deadline run"})
    assert r.status_code == 201, r.text
    b = r.json()
    assert (b["user"], b["booked_by"], b["model"], b["count"], b["status"]) == ("ann", "ann", A100, 2, "upcoming")
    assert b["windows"] == [{"start": int(start), "end": start + H}] and b["note"] == "deadline run"
    assert r.headers["Location"].endswith(f"/hub/api/gpus/bookings/{b['id']}")
    assert b["id"] in [x["id"] for x in listed(hub, "ann")]
    assert b["id"] in [x["id"] for x in listed(hub, "boss")]  # an administrator sees every booking
    assert b["id"] not in [x["id"] for x in listed(hub, "bob")]
    assert call(hub, "bob", "GET", f"/{b['id']}").status_code == 403
    r = call(hub, "bob", "DELETE", f"/{b['id']}")
    assert r.status_code == 403 and "not yours" in r.json()["message"]

    # the A100s are booked then: bob's overlapping booking is refused with the booking named
    r = call(hub, "bob", "POST", json={"model": "a100", "count": 1, "start": start + H / 2, "end": start + 2 * H})
    assert r.status_code == 400
    assert r.json()["message"].startswith(f"count: Only 0 of the 2 {A100} GPUs are free to book")
    assert "for ann (booked by ann)" in r.json()["message"]

    assert call(hub, "ann", "DELETE", f"/{b['id']}").status_code == 204
    assert call(hub, "ann", "GET", f"/{b['id']}").json()["status"] == "cancelled"
    r = call(hub, "bob", "POST", json={"model": "a100", "count": 1, "start": start + H / 2, "end": start + 2 * H})
    assert r.status_code == 201, r.text
    assert call(hub, "bob", "DELETE", f"/{r.json()['id']}").status_code == 204


def test_group_bookings_are_for_administrators_and_seen_by_the_groups_members(hub):
    start = time.time() + 30 * H
    body = {"model": "t4", "count": 2, "start": start, "end": start + 2 * H, "group": "class-ml", "repeat_weeks": 3}
    r = call(hub, "ann", "POST", json=body)
    assert r.status_code == 400 and r.json()["message"] == "group: Only administrators book GPUs for a group."
    r = call(hub, "boss", "POST", json=body)
    assert r.status_code == 201, r.text
    b = r.json()
    assert (b["group"], b["user"], b["booked_by"], len(b["windows"])) == ("class-ml", "", "boss", 3)
    assert b["id"] in [x["id"] for x in listed(hub, "cat")]
    assert b["id"] not in [x["id"] for x in listed(hub, "ann")]
    r = call(hub, "cat", "DELETE", f"/{b['id']}")
    assert r.status_code == 403 and "only boss or an administrator may cancel it" in r.json()["message"]
    assert call(hub, "boss", "DELETE", f"/{b['id']}").status_code == 204


#: bodies that must be refused, each with the field the answer names
BAD_BODIES = [
    ("[1, 2]", "body"),
    ('{"model": "a100", "count": 1, "start": 1, "end": 2, "colour": "red"}', "colour"),
    ('{"count": 1, "start": "2030-01-01T10:00Z", "end": "2030-01-01T11:00Z"}', "model"),
    ('{"model": "h100", "count": 1, "start": "2030-01-01T10:00Z", "end": "2030-01-01T11:00Z"}', "model"),
    ('{"model": "a100", "count": "two", "start": "2030-01-01T10:00Z", "end": "2030-01-01T11:00Z"}', "count"),
    ('{"model": "a100", "count": 3, "start": "NOW+1h", "end": "NOW+2h"}', "count"),
    ('{"model": "a100", "count": 1, "start": "yesterday", "end": "NOW+2h"}', "start"),
    ('{"model": "a100", "count": 1, "start": "NOW-2h", "end": "NOW+2h"}', "start"),
    ('{"model": "a100", "count": 1, "start": "NOW+2h", "end": "NOW+1h"}', "end"),
    ('{"model": "a100", "count": 1, "start": "NOW+1h", "end": "NOW+6h"}', "end"),
    ('{"model": "a100", "count": 1, "start": "NOW+1h", "end": "NOW+2h", "user": "bob"}', "user"),
    ('{"model": "a100", "count": 1, "start": "NOW+1h", "end": "NOW+2h", "repeat_weeks": 99}', "repeat_weeks"),
    ('{"model": "a100", "count": 1, "start": "NOW+1h", "end": "NOW+2h", "note": 5}', "note"),
    ('{"model": "a100", "count": 1, "start": "NOW+1h", "end": "NOW+2h", "group": "nobody"}', "group"),
    ('{"model": "any", "count": 4, "start": "NOW+1h", "end": "NOW+4h", "repeat_weeks": 2}', "count"),  # 12 GPU-h
]


def fill(text: str, now: float) -> str:
    for mark, hours in (("NOW-2h", -2), ("NOW+1h", 1), ("NOW+2h", 2), ("NOW+4h", 4), ("NOW+6h", 6)):
        text = text.replace(f'"{mark}"', str(now + hours * H))
    return text


@pytest.mark.parametrize("body, field", BAD_BODIES)
def test_a_bad_body_is_a_400_naming_the_field_and_books_nothing(hub, body, field):
    before = listed(hub, "boss")
    r = call(hub, "ann", "POST", data=fill(body, time.time()))
    assert r.status_code == 400, r.text
    assert r.json()["message"].startswith(f"{field}: "), r.json()
    assert listed(hub, "boss") == before


values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**12), st.floats(allow_nan=False, width=32),
                   st.text(max_size=12), st.lists(st.integers(), max_size=2))
bodies = st.dictionaries(st.sampled_from(["model", "count", "start", "end", "user", "group", "repeat_weeks",
                                          "note", "extra"]), values, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies)
def test_any_body_is_booked_or_refused_with_a_400_naming_a_field(hub, body):
    before = len(listed(hub, "boss"))
    r = call(hub, "ann", "POST", data=json.dumps(body))
    if r.status_code == 201:  # (hardly ever: a body that happens to be a good booking)
        assert call(hub, "ann", "DELETE", f"/{r.json()['id']}").status_code == 204
        return
    assert r.status_code == 400, r.text
    field = r.json()["message"].split(":", 1)[0].split("[")[0]  # model[0]: a part of model
    assert field in (*body, "body", "model", "count", "start", "end"), r.json()
    assert len(listed(hub, "boss")) == before


def test_a_hub_killed_and_started_again_keeps_its_bookings(hub):
    start = time.time() + 50 * H
    r = call(hub, "ann", "POST", json={"model": "t4", "count": 1, "start": start, "end": start + H})
    assert r.status_code == 201, r.text
    kept = r.json()
    cancelled = call(hub, "ann", "POST", json={"model": "t4", "count": 1, "start": start + H, "end": start + 2 * H})
    assert call(hub, "ann", "DELETE", f"/{cancelled.json()['id']}").status_code == 204
    hub.stop(signal.SIGKILL)
    hub.start()
    found = {b["id"]: b for b in listed(hub, "ann")}
    assert found[kept["id"]] == kept
    assert found[cancelled.json()["id"]]["status"] == "cancelled"


def spawn(hub, name: str, gpus: int, model: str) -> requests.Response:
    return hub.spawn(name, {"profile": "gpu", "gpus": gpus, "gpu_model": model})


def test_in_a_window_the_booked_user_gets_the_gpus_and_another_is_refused_naming_the_booking(hub):
    now = time.time()
    r = call(hub, "ann", "POST", json={"model": "a100", "count": 2, "start": now - 60, "end": now + H})
    assert r.status_code == 201, r.text
    booking = r.json()
    try:
        assert booking["status"] == "active"
        r = spawn(hub, "bob", 1, A100)
        assert r.status_code == 409, r.text
        message = r.json()["message"]
        assert message.startswith(f"2 {A100} GPUs are booked ") and "for ann (booked by ann)" in message, message
        assert "Only 0 of 2" in message
        assert not hub.user("bob")["servers"]
        r = spawn(hub, "ann", 2, A100)
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("ann")
        held = hub.server_env("ann")["CUDA_VISIBLE_DEVICES"].split(",")
        assert len(held) == 2
        # a T4 is not booked: bob still gets one
        assert spawn(hub, "bob", 1, "any").status_code in (201, 202)
        hub.wait_ready("bob")
        hub.stop_server("bob")
    finally:
        hub.stop_server("ann") if hub.user("ann")["servers"] else None
        call(hub, "ann", "DELETE", f"/{booking['id']}")


def test_a_server_started_before_a_window_is_admitted_until_it_starts(hub):
    start = time.time() + H
    r = call(hub, "boss", "POST", json={"model": "t4", "count": 2, "start": start, "end": start + H,
                                        "group": "class-ml"})
    assert r.status_code == 201, r.text
    booking = r.json()
    try:
        assert spawn(hub, "bob", 1, "t4").status_code in (201, 202)
        hub.wait_ready("bob")
        admitted = call(hub, "bob", "GET").json()["admitted"]
        assert admitted == [{"owner": "bob/", "user": "bob", "server": "", "until": booking["start"],
                             "booking": booking["id"]}], admitted
        assert "will be stopped at" in hub.log()
        hub.restart()  # the condition outlives the hub's process
        assert call(hub, "bob", "GET").json()["admitted"] == admitted
        assert call(hub, "ann", "GET").json()["admitted"] == []  # someone else's server
        hub.stop_server("bob")
        assert call(hub, "bob", "GET").json()["admitted"] == []  # it gave its GPUs back
        assert spawn(hub, "bob", 1, "t4").status_code in (201, 202)
        hub.wait_ready("bob")
        assert len(call(hub, "bob", "GET").json()["admitted"]) == 1
        assert call(hub, "boss", "DELETE", f"/{booking['id']}").status_code == 204
        assert call(hub, "bob", "GET").json()["admitted"] == []  # no window to leave for: bob may stay
        hub.stop_server("bob")
        # a booked user's own server is not bound by the window
        r = call(hub, "boss", "POST", json={"model": "t4", "count": 2, "start": start, "end": start + H,
                                            "group": "class-ml"})
        assert r.status_code == 201, r.text
        booking = r.json()
        assert spawn(hub, "cat", 1, "t4").status_code in (201, 202)
        hub.wait_ready("cat")
        assert call(hub, "cat", "GET").json()["admitted"] == []
        hub.stop_server("cat")
    finally:
        call(hub, "boss", "DELETE", f"/{booking['id']}")


def test_a_window_nobody_uses_is_released_after_the_grace_and_that_is_recorded(tmp_path, fakenvml_libdir):
    quick = OpsHub(tmp_path, fakenvml_libdir, PROFILES, mixin={"gpu_booking_grace": 2})
    quick.start()
    try:
        quick.add_users("ann", "bob")
        quick.tokens = {name: user_token(quick, name) for name in ("ann", "bob")}
        now = time.time()
        unused = call(quick, "ann", "POST", json={"model": "t4", "count": 2, "start": now, "end": now + H}).json()
        used = call(quick, "bob", "POST", json={"model": A100, "count": 1, "start": now, "end": now + H}).json()
        assert spawn(quick, "bob", 1, A100).status_code in (201, 202)
        quick.wait_ready("bob")
        deadline = time.monotonic() + 60
        while call(quick, "ann", "GET", f"/{unused['id']}").json()["status"] != "released":
            assert time.monotonic() < deadline, quick.log()
            time.sleep(0.5)
        released = call(quick, "ann", "GET", f"/{unused['id']}").json()
        assert released["state"] == "released" and released["released_at"] >= now + 2
        assert call(quick, "bob", "GET", f"/{used['id']}").json()["status"] == "active"  # bob holds an A100
    finally:
        quick.close()
