"""Being told: a user's settings body, the admin's settings, and the notifier on real sockets (a
webhook receiver on loopback, a port that never answers) through the real Apprise."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client import Counter
from sqlalchemy import create_engine
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.backends.local.spawner import GPULocalProcessSpawner
from gpuspawner.backends.startup import refusal_at_start
from gpuspawner.bookings import WEEK, Booking
from gpuspawner.hub.browser_feed import BrowserFeed
from gpuspawner.hub.notify import Notifier, WebhookChannel, window_starts
from gpuspawner.hub.notify_store import NotifyStore
from gpuspawner.inputs import OptionsError
from gpuspawner.notifications import (
    CHANNELS,
    EVENTS,
    GPUNotifySettings,
    Preferences,
    Teller,
    defaults,
    job_told,
    parse_preferences,
    recipient_url,
    webhook_allowed,
)
from notify_parts import WebhookReceiver

PREFIXES = ["https://hooks.example.org/gpu/", "http://127.0.0.1:8099/hooks/"]
START = defaults(EVENTS, CHANNELS)


def parse(body, current=START, email_on=True):
    return parse_preferences(body, current, CHANNELS, email_on=email_on, prefixes=PREFIXES)


@pytest.mark.parametrize("url, allowed", [
    ("https://hooks.example.org/gpu/abc", True),
    ("https://HOOKS.example.org:443/gpu/abc?x=1", True),
    ("http://127.0.0.1:8099/hooks/me", True),
    ("https://hooks.example.org/other", False),  # outside the prefix's path
    ("https://hooks.example.org.evil.net/gpu/", False),
    ("https://hooks.example.org@evil.net/gpu/", False),  # userinfo: the host is evil.net
    ("https://me:pw@hooks.example.org/gpu/", False),  # no credentials in a webhook URL
    ("https://evil.net\\@hooks.example.org/gpu/", False),
    ("http://127.0.0.1:8098/hooks/me", False),  # another port
    ("http://127.0.0.1/hooks/me", False),
    ("http://hooks.example.org/gpu/abc", False),  # another scheme
    ("https://hooks.example.org/gpu/../admin", False),
    ("https://hooks.example.org/gpu/%2E%2E/admin", False),
    ("https://hooks.example.org/gpu/ a", False),
    ("https://hooks.example.org:99999/gpu/", False),
    ("json://hooks.example.org/gpu/", False),  # an Apprise scheme no prefix allows
])
def test_a_webhook_must_lie_under_an_allowed_prefix(url, allowed):
    assert webhook_allowed(url, PREFIXES) is allowed
    assert webhook_allowed(url, []) is False  # no prefixes: never


def test_a_settings_body_changes_what_it_names_and_keeps_the_rest():
    chosen = parse({"email": " bob@example.org ", "events": {"email": {"ready": False}, "jupyterlab": {"job": False}}})
    assert chosen.email == "bob@example.org" and chosen.webhook == ""
    assert not chosen.wants("email", "ready") and chosen.wants("email", "job")
    assert not chosen.wants("jupyterlab", "job") and chosen.wants("webhook", "job")
    again = parse({"webhook": "https://hooks.example.org/gpu/x"}, chosen)
    assert again.email == "bob@example.org" and again.events == chosen.events
    assert parse({"email": ""}, again).email == ""  # an empty address: no email


@pytest.mark.parametrize("body, field", [
    ([], "body"),
    ({"email": "bob"}, "email"),
    ({"email": "bob@example.org&smtp=evil.net"}, "email"),
    ({"email": 3}, "email"),
    ({"webhook": "https://evil.net/"}, "webhook"),
    ({"events": []}, "events"),
    ({"events": {"sms": {}}}, "events.sms"),
    ({"events": {"email": {"lunch": True}}}, "events.email.lunch"),
    ({"events": {"email": {"ready": "yes"}}}, "events.email.ready"),
    ({"events": {"email": []}}, "events.email"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_settings_body_is_refused_naming_the_field(body, field):
    with pytest.raises(OptionsError) as e:
        parse(body)
    assert e.value.field == field


def test_email_is_refused_where_the_hub_sends_none():
    with pytest.raises(OptionsError, match="sends no email"):
        parse({"email": "bob@example.org"}, email_on=False)
    assert parse({"email": ""}, email_on=False).email == ""
    # saved before the admin changed their settings: the user may still change the rest
    saved = replace(START, email="bob@example.org", webhook="https://old.example.org/x")
    assert not parse({"events": {"email": {"job": False}}}, saved, email_on=False).wants("email", "job")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=30),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner,
                                                                                        max_size=3), max_leaves=8)
events_bodies = st.dictionaries(st.sampled_from([*CHANNELS, "sms"]),
                                st.dictionaries(st.sampled_from([*EVENTS, "lunch"]), st.booleans() | json_values,
                                                max_size=6) | json_values, max_size=4)
bodies = st.fixed_dictionaries({}, optional={
    "email": st.sampled_from(["", "ann@example.org", "a+b@x.example.org", "nobody", "a@b"]) | json_values,
    "webhook": st.sampled_from(["", PREFIXES[0] + "x", "https://evil.net/", "ftp://x"]) | json_values,
    "events": events_bodies,
}) | json_values


@settings(max_examples=300, deadline=None)
@given(bodies)
def test_any_body_gives_settings_that_hold_or_a_refusal_naming_a_field(body):
    try:
        chosen = parse(body)
    except OptionsError as e:
        assert e.field.split(".")[0] in ("body", "email", "webhook", "events") or e.field in map(str, body)
        return
    assert set(chosen.events) == set(CHANNELS)
    assert all(events <= set(EVENTS) for events in chosen.events.values())
    assert not chosen.webhook or webhook_allowed(chosen.webhook, PREFIXES)
    # what the API answers reads back as the same settings
    assert parse(chosen.as_json(CHANNELS)) == chosen


def test_bad_admin_settings_stop_the_hub_naming_the_setting():
    for key, value, words in (
        ("gpu_notify_email", "smtp://mail.example.org", "gpu_notify_email"),
        ("gpu_notify_email", "mailto://mail.example.org?to=all@example.org", "must name no recipient"),
        ("gpu_notify_webhook_prefixes", ["hooks.example.org"], "gpu_notify_webhook_prefixes"),
        ("gpu_notify_webhook_prefixes", ["https://me@hooks.example.org/"], "gpu_notify_webhook_prefixes"),
        ("gpu_notify_default_events", ["ready", "lunch"], "gpu_notify_default_events"),
        ("gpu_notify_timeout", 0.0, "gpu_notify_timeout"),
    ):
        with pytest.raises(TraitError, match=words):
            GPUNotifySettings(**{key: value})
        config = Config()
        setattr(config.GPUSpawnerMixin, key, value)
        refusal = refusal_at_start(GPULocalProcessSpawner, config)
        assert refusal and key in refusal, (key, refusal)
    good = GPUNotifySettings(gpu_notify_email="mailtos://hub:pw@smtp.example.org:587?from=gpus@example.org",
                             gpu_notify_webhook_prefixes=PREFIXES)
    to = recipient_url(good.gpu_notify_email, "a+b@example.org")
    assert to.endswith("?from=gpus@example.org&to=a%2Bb@example.org")


def test_a_jobs_end_in_words_and_a_cancelled_job_is_not_told():
    assert job_told("report", "j1", "completed", "exit code 0") == (
        "Your GPU job is done", "Your notebook job 'report' (job j1) finished: exit code 0. Its GPUs are free again.")
    assert job_told("r", "j2", "timed_out", "stopped")[0] == "Your GPU job reached its time limit"
    assert job_told("r", "j3", "cancelled", "cancelled") is None


def test_booked_windows_are_told_once_when_they_start():
    b = Booking(id="b1", user="ann", group="", booked_by="ann", model="a100", count=2, start=1000.0, end=2000.0,
                repeat_weeks=3, created=0.0, state="booked")
    assert [w[1] for w in window_starts([b], 900, 1000)] == [1000.0]
    assert window_starts([b], 1000, 1100) == []  # told in the round before
    assert [w[1] for w in window_starts([b], 1000 + WEEK - 5, 1000 + WEEK)] == [1000.0 + WEEK]
    assert window_starts([replace(b, state="cancelled")], 900, 1000) == []


# ------------------------------------------------------------------ the notifier, on real sockets


def notifier(timeout: float, prefixes: list[str]) -> tuple[Notifier, Counter]:
    counter = Counter("gpuspawner_notifications", "test", ["channel", "event", "outcome"], registry=None)
    store = NotifyStore(create_engine("sqlite://"))
    n = Notifier(GPUNotifySettings(gpu_notify_timeout=timeout, gpu_notify_webhook_prefixes=prefixes), store,
                 counter)
    n.add(WebhookChannel(n.pool, n.preferences, prefixes))
    return n, counter


def counted(counter: Counter, outcome: str) -> float:
    return counter.labels(channel="webhook", event="ready", outcome=outcome)._value.get()


def test_the_notifier_posts_a_users_webhook_as_json_and_counts_it():
    receiver = WebhookReceiver()
    prefix = f"http://127.0.0.1:{receiver.port}/hooks/"
    n, counter = notifier(10, [prefix])
    try:
        n.store.put("ann", parse_preferences({"webhook": prefix + "ann"}, n.preferences("ann"), n.channels,
                                             email_on=False, prefixes=[prefix]))
        asyncio.run(n.tell("ann", "ready", "Your GPU server is ready", "It is running.", "/user/ann/"))
        asyncio.run(n.tell("bob", "ready", "Your GPU server is ready", "It is running."))  # no webhook: nothing
        ((path, body),) = receiver.received
        assert path == "/hooks/ann" and body["title"] == "Your GPU server is ready"
        assert body["message"] == "It is running."
        assert counted(counter, "sent") == 1 and counted(counter, "failed") == 0
        n.store.put("ann", replace(n.preferences("ann"), events={"webhook": frozenset({"job"})}))
        asyncio.run(n.tell("ann", "ready", "Your GPU server is ready", "It is running."))  # turned off
        # a URL saved under an admin's earlier prefixes is not posted to
        n.store.put("ann", Preferences(webhook=f"http://127.0.0.1:{receiver.port}/old/ann",
                                       events={"webhook": frozenset(EVENTS)}))
        asyncio.run(n.tell("ann", "ready", "Your GPU server is ready", "It is running."))
        assert len(receiver.received) == 1 and counted(counter, "sent") == 1
    finally:
        receiver.close()
        n.close()


def test_a_webhook_that_never_answers_is_given_up_in_time_and_counted(caplog):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts connections, never answers
    prefix = f"http://127.0.0.1:{silent.getsockname()[1]}/hooks/"
    n, counter = notifier(0.5, [prefix])
    try:
        n.store.put("ann", Preferences(webhook=prefix + "ann", events={"webhook": frozenset(EVENTS)}))
        asyncio.run(n.tell("ann", "ready", "Your GPU server is ready", "It is running."))
        assert "could not tell ann of ready by webhook: no answer in 0.5 s" in caplog.text  # not Apprise's timeout
        assert counted(counter, "failed") == 1 and counted(counter, "sent") == 0
    finally:
        silent.close()
        n.close()


def test_telling_before_the_hub_attached_its_notifier_does_nothing():
    async def tell() -> None:
        Teller().later("ann", "ready", "t", "x")

    asyncio.run(tell())


def test_settings_are_kept_in_the_hubs_database_across_a_restart(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'hub.sqlite'}")
    chosen = Preferences("ann@example.org", PREFIXES[0] + "ann", {"email": frozenset({"ready", "job"})})
    NotifyStore(engine).put("ann", chosen)
    engine.dispose()
    again = NotifyStore(create_engine(f"sqlite:///{tmp_path / 'hub.sqlite'}"))  # the hub started again
    assert again.get("ann") == chosen and again.get("bob") is None


def test_the_browser_feed_gets_what_the_spawn_pending_page_does_not_tell_itself():
    n, _ = notifier(10, [])
    feed = BrowserFeed()
    n.add(feed)
    try:
        asyncio.run(n.tell("ann", "ready", "Your GPU server is ready", "It is running."))  # the page's own
        asyncio.run(n.tell("ann", "job", "Your GPU job is done", "It finished."))
        assert [i["title"] for i in feed.read("ann")["items"]] == ["Your GPU job is done"]
    finally:
        n.close()
