"""Being told, on a real hub: a queued server's user gets an email (a real SMTP server, aiosmtpd)
and a webhook's JSON (a local receiver) once it is ready, an email when a notebook job ends; each
user reads and changes only their own settings; a dead SMTP server changes nothing for the spawn
and is counted in Prometheus; the GPU idle culler's warning and a budget running low reach the
user's webhook."""

from __future__ import annotations

import json
import time

import pytest
import requests

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import Hub, login
from jobnotebooks import GPU_REPORT, submit, wait_state, write
from notify_parts import SMTPServer, WebhookReceiver, text_of
from ops_hub import OpsHub
from test_local_hub import start
from test_ops_culler import notices
from test_ops_overview import user_token, wait_for

pytestmark = pytest.mark.integration

PROFILES = [
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1], "default": True},
    {"slug": "queued", "display_name": "Queued T4", "gpu_models": ["t4"], "gpu_counts": [1], "queue": True},
]
T4 = {"profile": "gpu", "gpus": 1, "gpu_model": "t4"}
QUEUED = {"profile": "queued", "gpus": 1, "gpu_model": "t4"}

CONFIG = """
from gpuspawner.hub.setup import configure
notify = json.loads(os.environ["GPUSPAWNER_TEST_NOTIFY"])
c.GPUSpawnerMixin.gpu_job_time_limit = 600
c.GPUSpawnerMixin.gpu_notify_email = notify["email"]
c.GPUSpawnerMixin.gpu_notify_webhook_prefixes = notify["webhooks"]
c.GPUSpawnerMixin.gpu_notify_timeout = 20
c.JupyterHub.load_roles[0]["scopes"] += ["tokens", "custom:gpus:read", "read:metrics"]
configure(c)
"""


@pytest.fixture(scope="module")
def parts(tmp_path_factory, fakenvml_libdir):
    tmp = tmp_path_factory.mktemp("notify")
    smtp = SMTPServer(tmp / "mail")
    smtp.start()
    receiver = WebhookReceiver()
    gpus = tmp / "gpus.json"
    fakenvml.write_config(gpus, simulated_config(a100=1, t4=1))
    hub = Hub(tmp / "hub", fakenvml.env(fakenvml_libdir, gpus), PROFILES, extra_config=CONFIG)
    hub.env["GPUSPAWNER_TEST_NOTIFY"] = json.dumps({
        "email": f"mailto://127.0.0.1:{smtp.port}?from=gpus@example.org",
        "webhooks": [f"http://127.0.0.1:{receiver.port}/hooks/"],
    })
    try:
        hub.start()
        hub.add_users("ann", "bob", "cat", "dan", "fay")
        yield hub, smtp, receiver
    finally:
        hub.close()
        smtp.stop()
        receiver.close()


def settings_api(hub: Hub, token: str, method: str = "GET", body: object = None, user: str | None = None):
    params = {"user": user} if user else None
    return requests.request(method, hub.url + "/hub/api/gpus/notifications", params=params, timeout=60,
                            headers={"Authorization": f"token {token}"},
                            data=None if body is None else json.dumps(body))


def metrics(hub: Hub) -> str:
    r = requests.get(hub.url + "/hub/metrics", headers={"Authorization": f"token {hub.token}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.text


def notifications_counted(hub: Hub) -> dict[tuple[str, str, str], float]:
    found = {}
    for line in metrics(hub).splitlines():
        if line.startswith("gpuspawner_notifications_total{"):
            labels, value = line[len("gpuspawner_notifications_total{"):].split("} ")
            pairs = dict(p.split("=", 1) for p in labels.split(","))
            found[tuple(pairs[k].strip('"') for k in ("channel", "event", "outcome"))] = float(value)
    return found


def queue_behind(hub: Hub, holder: str, waiter: str) -> None:
    """``holder`` takes the only T4; ``waiter`` asks for it in the queue; ``holder`` stops: ``waiter`` is served."""
    assert hub.spawn(holder, T4).status_code in (201, 202)
    hub.wait_ready(holder)
    assert hub.spawn(waiter, QUEUED).status_code in (201, 202)
    assert wait_for(lambda: "gpuspawner_queue_length 1.0" in metrics(hub), 30), hub.log()
    hub.stop_server(holder)
    hub.wait_ready(waiter)


def test_a_queued_server_that_becomes_ready_is_told_by_email_and_webhook(parts):
    hub, smtp, receiver = parts
    token = user_token(hub, login(hub, "bob"), "bob")
    r = settings_api(hub, token, "PUT", {"email": "bob@example.org",
                                         "webhook": f"http://127.0.0.1:{receiver.port}/hooks/bob"})
    assert r.status_code == 200, r.text
    assert r.json()["email"] == "bob@example.org" and r.json()["events"]["email"]["ready"] is True

    queue_behind(hub, "ann", "bob")

    mail = wait_for(lambda: smtp.messages("bob@example.org"), 60)
    assert mail, hub.log()
    assert mail[0]["Subject"] == "Your GPU server is ready"
    assert mail[0]["From"] == "gpus@example.org"
    assert "waited in the queue for GPUs and is now running" in text_of(mail[0])
    assert "/user/bob/" in text_of(mail[0])
    hooks = wait_for(lambda: [b for path, b in receiver.received if path == "/hooks/bob"], 60)
    assert hooks, hub.log()
    assert hooks[0]["title"] == "Your GPU server is ready" and "is now running" in hooks[0]["message"]
    assert smtp.messages("ann@example.org") == []  # ann got hers at once: nothing to tell
    lab = wait_for(lambda: [n for n in notices(hub, "bob", token) if n["source"] == "gpu-notifications"], 30)
    assert lab and lab[0]["message"].startswith("Your GPU server is ready: ")  # JupyterLab's notification centre
    counted = notifications_counted(hub)
    assert counted[("email", "ready", "sent")] >= 1 and counted[("webhook", "ready", "sent")] >= 1
    hub.stop_server("bob")


def test_a_notebook_jobs_end_is_told_by_email(parts):
    hub, smtp, _ = parts
    assert settings_api(hub, hub.token, "PUT", {"email": "cat@example.org"}, user="cat").status_code == 200
    write(hub.home("cat") / "report.ipynb", GPU_REPORT, parameters="seconds = 0")
    r = submit(hub, "cat", {**T4, "notebook": "report.ipynb"})
    assert r.status_code == 201, r.text
    done = wait_state(hub, "cat", r.json()["id"], ("completed", "failed"))
    assert done["state"] == "completed", done
    mail = wait_for(lambda: smtp.messages("cat@example.org"), 60)
    assert mail, hub.log()
    assert mail[0]["Subject"] == "Your GPU job is done"
    assert f"(job {done['id']}) finished" in text_of(mail[0])


def test_each_user_reads_and_changes_only_their_own_settings(parts):
    hub, _, receiver = parts
    tokens = {name: user_token(hub, login(hub, name), name) for name in ("ann", "dan")}
    before = settings_api(hub, tokens["ann"]).json()
    assert before["user"] == "ann" and before["channels"] == ["email", "webhook", "jupyterlab", "browser"]
    assert before["email"] == "" and all(before["events"]["jupyterlab"].values())  # the admin's defaults

    assert settings_api(hub, tokens["dan"], user="ann").status_code == 403
    r = settings_api(hub, tokens["dan"], "PUT", {"email": "dan@evil.example"}, user="ann")
    assert r.status_code == 403 and "only your own" in r.json()["message"]

    # bad input: 400 naming the field, nothing stored
    for body, field in (({"email": "not an address"}, "email"),
                        ({"webhook": "http://10.0.0.1/steal", "email": "ann@example.org"}, "webhook"),
                        ({"webhook": f"http://127.0.0.1:{receiver.port}@10.0.0.1/hooks/"}, "webhook"),
                        ({"events": {"email": {"lunch": True}}}, "events.email.lunch"),
                        ({"events": {"pager": {"ready": True}}}, "events.pager"),
                        ({"colour": "red"}, "colour")):
        r = settings_api(hub, tokens["ann"], "PUT", body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["message"].startswith(f"{field}: "), r.json()
    assert settings_api(hub, tokens["ann"]).json() == before

    r = settings_api(hub, tokens["ann"], "PUT", {"events": {"jupyterlab": {"job": False}}})
    assert r.status_code == 200 and r.json()["events"]["jupyterlab"]["job"] is False
    assert settings_api(hub, tokens["ann"]).json()["events"]["jupyterlab"]["ready"] is True

    # telling a user from outside the hub (the culler's way) needs the report scope, and a proper body
    events = hub.url + "/hub/api/gpus/notifications/events"
    told = {"user": "ann", "event": "budget", "title": "Budget", "text": "2 of 20 A100-hours left"}
    r = requests.post(events, json=told, headers={"Authorization": f"token {tokens['dan']}"}, timeout=60)
    assert r.status_code == 403
    for body, field in (({**told, "event": "lunch"}, "event"), ({**told, "text": ""}, "text"),
                        ({**told, "colour": "red"}, "colour")):
        r = requests.post(events, json=body, headers={"Authorization": f"token {hub.token}"}, timeout=60)
        assert r.status_code == 400 and r.json()["message"].startswith(f"{field}: "), r.text
    r = requests.post(events, json=told, headers={"Authorization": f"token {hub.token}"}, timeout=60)
    assert r.status_code == 202, r.text

    # the page: linked from the navigation bar, showing her own settings
    session = login(hub, "ann")
    page = session.get(hub.url + "/hub/gpus/notifications", timeout=60)
    assert page.status_code == 200
    assert 'id="gpuspawner-nav-notifications"' in page.text and "Tell me when" in page.text
    assert requests.get(hub.url + "/hub/gpus/notifications", timeout=60, allow_redirects=False).status_code == 302


def test_a_booked_windows_start_is_told_by_email(parts):
    hub, smtp, _ = parts
    token = user_token(hub, login(hub, "fay"), "fay")
    assert settings_api(hub, token, "PUT", {"email": "fay@example.org"}).status_code == 200
    start = time.time() + 3
    r = requests.post(hub.url + "/hub/api/gpus/bookings", headers={"Authorization": f"token {token}"}, timeout=60,
                      json={"model": "a100", "count": 1, "start": start, "end": start + 600})
    assert r.status_code == 201, r.text
    booking = r.json()["id"]
    try:
        mail = wait_for(lambda: smtp.messages("fay@example.org"), 90)  # the hub looks every 30 s
        assert mail, hub.log()
        assert mail[0]["Subject"] == "Your GPU booking starts"
        assert "1 x a100" in text_of(mail[0]) and f"(booking {booking})" in text_of(mail[0])
    finally:
        requests.delete(f"{hub.url}/hub/api/gpus/bookings/{booking}", headers={"Authorization": f"token {token}"},
                        timeout=60)


def test_a_dead_smtp_server_changes_nothing_for_the_spawn_and_is_counted(parts):
    hub, smtp, _ = parts
    assert settings_api(hub, hub.token, "PUT", {"email": "dan@example.org"}, user="dan").status_code == 200
    failed_before = notifications_counted(hub).get(("email", "ready", "failed"), 0)
    smtp.stop()
    try:
        queue_behind(hub, "ann", "dan")  # dan's queued server starts as ever
        assert hub.user("dan")["servers"][""]["ready"]
        assert wait_for(lambda: notifications_counted(hub).get(("email", "ready", "failed"), 0) == failed_before + 1,
                        60), hub.log()
        assert "could not tell dan of ready by email" in hub.log()
        hub.stop_server("dan")
    finally:
        smtp.start()


@pytest.fixture
def culled_hub(tmp_path, fakenvml_libdir):
    receiver = WebhookReceiver()
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, server_args=["--GPUMonitor.interval=0.5"],
                 culler={"period": 2, "threshold": 10, "idle_timeout": 14, "warn_before": 6},
                 mixin={"gpu_notify_webhook_prefixes": [f"http://127.0.0.1:{receiver.port}/hooks/"]})
    try:
        hub.start()
        yield hub, receiver
    finally:
        hub.close()
        receiver.close()


def test_the_culler_warning_reaches_the_users_webhook_with_how_to_keep_the_server(culled_hub):
    hub, receiver = culled_hub
    hub.set_utilization({device["uuid"]: 85 for device in hub.gpus_config["devices"]})  # busy until it is eve's
    hub.add_users("eve")
    token = user_token(hub, login(hub, "eve"), "eve")
    r = settings_api(hub, token, "PUT", {"webhook": f"http://127.0.0.1:{receiver.port}/hooks/eve"})
    assert r.status_code == 200, r.text
    hub.set_utilization(dict.fromkeys(start(hub, "eve", T4), 2))

    told = wait_for(lambda: [b for path, b in receiver.received if path == "/hooks/eve"], 120)
    assert told, hub.log()
    assert told[0]["title"] == "Your idle GPU server will be stopped"
    assert told[0]["message"].startswith("Your server will be stopped in 6 seconds because its GPUs are idle")
    assert "Use them, or stop the server yourself" in told[0]["message"]  # how to keep it


def test_a_budget_running_low_is_told_by_webhook(tmp_path, fakenvml_libdir):
    receiver = WebhookReceiver()
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, mixin={
        "gpu_budget_per_user": 0.02, "gpu_budget_unit": "GPU-hours", "gpu_budget_low": 0.9,  # 72 s; low after 7 s
        "gpu_budget_check_interval": 1, "gpu_notify_webhook_prefixes": [f"http://127.0.0.1:{receiver.port}/hooks/"]})
    try:
        hub.start()
        hub.add_users("ivy")
        token = user_token(hub, login(hub, "ivy"), "ivy")
        assert settings_api(hub, token, "PUT", {"webhook": f"http://127.0.0.1:{receiver.port}/hooks/ivy"}).ok
        start(hub, "ivy", T4)
        told = wait_for(lambda: [b for path, b in receiver.received if path == "/hooks/ivy"], 90)
        assert told, hub.log()
        assert told[0]["title"] == "Your GPU budget runs low"
        assert told[0]["message"].startswith("Your GPU budget runs low: ")
        assert "of 0.02 GPU-hours left" in told[0]["message"], told
    finally:
        hub.close()
        receiver.close()
