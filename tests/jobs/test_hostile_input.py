"""Hostile input at a real hub's doors (gpu-local-simple, simulated 2 x A100 and 2 x T4): every generated body
is answered 400 with a short sentence naming a field, never 5xx, and leaves nothing behind.

One hub for the module. The doors: ``POST /hub/api/users/NAME/gpu-jobs``, ``POST
/hub/api/users/NAME/server``, the spawn form (``POST /hub/spawn``) and the culler's ``POST
/hub/api/gpus/usage/report``. After each answer the test reads what the user and an admin see:
``/hub/api/gpus`` holds nothing, the job list is unchanged and is JSON a browser parses, the
user has no server and their saved options are unchanged, the usage records are unchanged, and no
process carries the hub's marks. The bodies: valid ones with fields spoilt (tests/hostile.py), raw
bytes, and any JSON. A count no machine here has (4 x T4) is neither offered nor queued.
"""

from __future__ import annotations

import re
import time
from urllib.parse import unquote

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings, strategies as st

import fakenvml
from gpuspawner.simulation import simulated_config
from hostile import (
    FORM_BAD,
    JOB_BAD,
    JOB_KEYS,
    LONG,
    OPTION_BAD,
    REPORT_BAD,
    REPORT_KEYS,
    SURROGATE,
    VALID_FORMS,
    VALID_OPTIONS,
    VALID_REPORTS,
    echoes_too_much,
    encode,
    job_bodies,
    json_values,
    raw_bodies,
    spoilt,
    strict_json,
)
from hub import Hub
from jobnotebooks import JOBS_CONFIG, PROFILES, submit, wait_state, write

pytestmark = pytest.mark.integration

USER = "eve"
# "wide" offers 4 GPUs, more than this hub's one machine has of any model; it queues
WIDE = {"slug": "wide", "display_name": "Wide", "gpu_models": ["any"], "gpu_counts": [1, 4], "queue": True}
HOSTILE = settings(max_examples=60, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def hub(tmp_path_factory, fakenvml_libdir):
    tmp = tmp_path_factory.mktemp("hostile")
    fakenvml.write_config(tmp / "gpus.json", simulated_config(a100=2, t4=2))
    hub = Hub(tmp / "hub", fakenvml.env(fakenvml_libdir, tmp / "gpus.json"), [*PROFILES, WIDE],
              extra_config=JOBS_CONFIG)
    hub.start()
    hub.add_users(USER)
    write(hub.home(USER) / "ok.ipynb", "print('ok')")
    try:
        yield hub
    finally:
        hub.close()


@pytest.fixture(scope="module")
def web(hub):
    """USER's browser session (cookie and XSRF token), for the spawn form."""
    session = requests.Session()
    page = session.get(hub.url + "/hub/login", timeout=60).text
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
    r = session.post(hub.url + "/hub/login", timeout=60,
                     data={"_xsrf": xsrf, "username": USER, "password": "test-password"})
    assert r.ok and "/hub/login" not in r.url, r.text
    form = session.get(hub.url + "/hub/spawn", timeout=60).text  # the token the form posts (in its action URL)
    session.xsrf = unquote(re.search(r'[?&]_xsrf=([^"&]+)', form).group(1))
    return session


def seen(hub: Hub) -> dict:
    """What the user and an admin see, each answer parsed as a browser parses JSON."""
    gpus = strict_json(hub.api("GET", "/gpus").text)["gpus"]
    server = hub.api("GET", f"/users/{USER}/server")
    return {
        "held": {g["uuid"]: g["holder"] for g in gpus if g.get("holder")},
        "jobs": [j["id"] for j in strict_json(hub.api("GET", f"/users/{USER}/gpu-jobs").text)["jobs"]],
        "servers": strict_json(hub.api("GET", f"/users/{USER}").text)["servers"],
        # JupyterHub saves a spawn's options before checking them: a refused body must not stay there
        "saved options": (strict_json(server.text).get("user_options") or {}) if server.status_code == 200 else {},
        "usage": strict_json(hub.api("GET", "/gpus/usage", params={"by": "allocation"}).text)["rows"],
        "marked processes": hub.marked_pids(),
    }


@pytest.fixture
def before(hub):
    """The hub as every hostile body must leave it: measured once per test, after a settled start."""
    state = seen(hub)
    assert not state["held"] and not state["servers"] and not state["marked processes"], state
    return state


def assert_refused(r: requests.Response, body: object, *, names_field: bool = True) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    message = strict_json(r.text)["message"]
    assert len(message) <= 300, message
    assert echoes_too_much(message, body) is None, message[:200]
    if names_field:
        assert re.match(r"^.{1,70}?: ", message), message  # "field: what is wrong" (a key may hold ':')


def truthy_non_object(raw: bytes) -> bool:
    """Whether JupyterHub takes ``raw`` as a server body it refuses itself (an empty or false body, or
    an empty object, means "the saved options" to it, a valid request)."""
    try:
        value = strict_json(raw.decode("utf-8", "replace").strip() or "null")
    except (ValueError, RecursionError):
        return True
    return bool(value) and not isinstance(value, dict)


# ------------------------------------------------------------------ the job API


@HOSTILE
@given(st.one_of(
    spoilt(job_bodies(), {**JOB_BAD, **OPTION_BAD}, JOB_KEYS, drop=("notebook",)).map(lambda case: case[0]),
    raw_bodies, json_values,
))
@example({"profile": "gpu", "gpus": 1, "gpu_model": "t4", "notebook": "ok.ipynb", "time_limit": float("nan")})
@example({"profile": "gpu", "gpus": 1, "gpu_model": "t4", "notebook": "ok.ipynb", "time_limit": 10**300})
@example({"profile": "gpu", "gpus": 1, "gpu_model": "t4", "notebook": f"{SURROGATE}.ipynb"})
@example({"profile": "gpu", "gpus": 1, "gpu_model": "t4", "notebook": "ok.ipynb", "name": SURROGATE})
@example({"profile": "gpu", "gpus": 1, "gpu_model": "t4", "notebook": "ok.ipynb", "outputs": {"ipynb": "./"}})
@example({"profile": "gpu", "gpus": 1, "gpu_model": "t4", "notebook": "ok.ipynb", LONG: 1})
@example(b"[" * 5000 + b"]" * 5000)
def test_hostile_job_bodies_are_refused_and_change_nothing(hub, before, body):
    raw = body if isinstance(body, bytes) else encode(body)
    r = hub.api("POST", f"/users/{USER}/gpu-jobs", data=raw)
    assert_refused(r, body)
    assert seen(hub) == before


# ------------------------------------------------------------------ the server API


@HOSTILE
@given(st.one_of(
    spoilt(VALID_OPTIONS, OPTION_BAD, set(OPTION_BAD)).map(lambda case: case[0]),
    spoilt(VALID_OPTIONS, OPTION_BAD, set(OPTION_BAD)).map(lambda case: {"user_options": case[0]}),
    raw_bodies.filter(truthy_non_object),
))
@example({"gpus": float("nan")})
@example({"profile": "gpu", LONG: 1})
@example({"user_options": {"gpu_model": SURROGATE}})
def test_hostile_server_bodies_are_refused_and_change_nothing(hub, before, body):
    raw = body if isinstance(body, bytes) else encode(body)
    r = hub.api("POST", f"/users/{USER}/server", data=raw)
    assert_refused(r, body, names_field=isinstance(body, dict))
    assert seen(hub) == before


@HOSTILE
@given(spoilt(VALID_FORMS, FORM_BAD, set(), extra=False).map(lambda case: case[0]))
def test_hostile_spawn_forms_are_refused_and_change_nothing(hub, web, before, form):
    fields = [("_xsrf", web.xsrf), *((k, v) for k, values in form.items() for v in values)]
    r = web.post(hub.url + "/hub/spawn", data=fields, timeout=60, allow_redirects=False)
    assert r.status_code == 400, (r.status_code, r.text[-500:])
    assert seen(hub) == before


# ------------------------------------------------------------------ the culler's usage report


@HOSTILE
@given(st.one_of(
    spoilt(VALID_REPORTS, REPORT_BAD, REPORT_KEYS, drop=("owner",)).map(lambda case: (case[0], 400)),
    raw_bodies.map(lambda raw: (raw, 400)),
    VALID_REPORTS.map(lambda report: (report, 200)),
))
def test_hostile_usage_reports_are_refused_and_change_nothing(hub, before, case):
    body, status = case
    raw = body if isinstance(body, bytes) else encode(body)
    r = hub.api("POST", "/gpus/usage/report", data=raw)
    if status == 200:
        assert r.status_code == 200 and strict_json(r.text)["recorded"] is False, r.text  # no such allocation
    else:
        assert_refused(r, body)
    assert seen(hub) == before


# ------------------------------------------------------------------ counts no machine here has


def test_a_count_no_machine_has_is_never_offered_queued_or_started(hub, before):
    labels = [t["label"] for t in strict_json(hub.api("GET", f"/users/{USER}/gpu-job-options").text)["compute_types"]]
    assert "1 x Tesla T4" in labels and "2 x Tesla T4" in labels
    assert not [label for label in labels if label.startswith("4 x")], labels
    sentence = "4 x Tesla T4 were requested but no machine here has more than 2 Tesla T4. Ask for 2 or fewer."
    asked = time.monotonic()
    job = submit(hub, USER, {"profile": "wide", "gpus": 4, "gpu_model": "t4", "notebook": "ok.ipynb"})
    assert (job.status_code, strict_json(job.text)["message"]) == (409, sentence)
    server = hub.spawn(USER, {"profile": "wide", "gpus": 4, "gpu_model": "t4"})
    assert (server.status_code, strict_json(server.text)["message"]) == (409, sentence)
    assert time.monotonic() - asked < 30, "refused at once, not after the queue's wait"
    after = seen(hub)
    assert after.pop("saved options") == {"profile": "wide", "gpus": 4, "gpu_model": "t4"}  # a valid request
    assert after == {k: v for k, v in before.items() if k != "saved options"}


def test_a_valid_job_still_runs_and_its_record_can_be_forgotten(hub, before):
    r = submit(hub, USER, {"profile": "gpu", "gpus": 1, "gpu_model": "t4", "notebook": "ok.ipynb",
                           "parameters": {"n": 2**53, "x": 1.5, "s": "\u00e9"}, "time_limit": 60, "name": "fine"})
    assert r.status_code == 201, r.text
    done = wait_state(hub, USER, r.json()["id"], ("completed", "failed"))
    assert done["state"] == "completed" and done["parameters"] == {"n": 2**53, "x": 1.5, "s": "\u00e9"}, done
    assert hub.api("DELETE", f"/users/{USER}/gpu-jobs/{done['id']}", params={"forget": "1"}).status_code == 200
    after = seen(hub)
    for key in ("held", "jobs", "servers", "marked processes"):
        assert after[key] == before[key], key
