"""Being told: what the hub may tell a user, how an admin configures it, and what a user chose.

Pure, below the hub's layer, so that spawners, the job manager and the hub's pages share it:

- :data:`EVENTS`: what a user is told of (a queued server is ready, a server is about to be
  culled, a notebook job ended, a booked window starts, a GPU budget runs low);
- :class:`GPUNotifySettings`: the admin's settings (a base of the spawner mixin, so they are set
  as ``c.GPUSpawnerMixin.gpu_notify_*`` and checked when the hub starts);
- :class:`Preferences` and :func:`parse_preferences`: one user's own choices (their email address,
  webhook URL, and which events each channel tells them of), checked field by field;
- :func:`webhook_allowed`: whether a webhook URL lies under one of the admin's allowed prefixes;
- :class:`Teller`: the hub's notifier as the layers below the hub reach it (``state.cache(Teller)``):
  :meth:`Teller.later` tells in the background and never fails its caller. The hub attaches its
  notifier (:mod:`gpuspawner.hub.notify`) once it is up; before that, telling does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, urlsplit

from traitlets import Float, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from .inputs import OptionsError, shown

log = logging.getLogger("gpuspawner.notify")

#: event -> what it is, in words (the settings page's rows)
EVENTS: dict[str, str] = {
    "ready": "A queued server is ready",
    "cull": "A server is about to be stopped because its GPUs are idle",
    "job": "A notebook job ended (done, failed or stopped at its time limit)",
    "booking": "A booked window starts",
    "budget": "A GPU budget runs low",
}
#: the channels this hub always has (others, such as the browser's, are added by their modules)
CHANNELS = ("email", "webhook", "jupyterlab")
#: (channel, event) the notifier leaves alone, because something else always tells it there: why
TOLD_ELSEWHERE = {
    ("jupyterlab", "cull"): "The GPU idle culler's own warning always shows in JupyterLab",
    ("browser", "ready"): "The spawn-pending page tells it itself, also while its tab is in the background",
}
#: the keys of a settings body (``PUT /hub/api/gpus/notifications``)
BODY_KEYS = ("email", "webhook", "events")
MAX_ADDRESS = 254
MAX_URL = 2000

_EMAIL = re.compile(r"[A-Za-z0-9._+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})+")
_URL_CHARS = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space: what a webhook URL may hold
_HTTP = ("http", "https")
_DOTS = re.compile(r"/(\.|%2e){2}(/|$|\?|#)", re.IGNORECASE)  # a path that climbs out of the prefix's


class GPUNotifySettings(Configurable):
    """How the hub tells users of what happened while they were away (see the README's "Being told")."""

    gpu_notify_email = Unicode(
        "",
        help="""The email sender, as an Apprise URL: ``mailto://`` (plain SMTP) or ``mailtos://``
        (TLS), with the SMTP host, port, login and the ``from`` address, e.g.
        ``mailtos://hub:PASSWORD@smtp.example.org:587?from=gpus@example.org``; see Apprise's
        email documentation for more (``smtp=``, ``mode=``, ``name=``). Each user's own address
        (their settings page) is added as the recipient: the URL must name none (no ``to=``).
        Empty (the default): no email is sent, and the settings page offers none.""",
    ).tag(config=True)

    gpu_notify_webhook_prefixes = List(
        Unicode(),
        help="""The webhook targets users may choose: URL prefixes such as
        ``https://hooks.slack.com/services/`` or ``https://chat.example.org/hooks/``. A user's
        webhook URL must have a prefix's scheme, host and port, and its path must begin with the
        prefix's path; an ``http(s)`` URL is posted JSON (title, message, type) through Apprise.
        A prefix of another Apprise scheme (``slack://``, ``msteams://``, ...) lets users give such
        Apprise URLs. Empty (the default): no webhooks, so a user can never make the hub post to
        a host the admin did not allow.""",
    ).tag(config=True)

    gpu_notify_default_events = List(
        Unicode(), default_value=list(EVENTS),
        help=f"""The events each channel tells a user of until they choose otherwise on their
        settings page (``/hub/gpus/notifications``): any of {', '.join(repr(e) for e in EVENTS)}.
        Email and webhooks need the user's address or URL as well.""",
    ).tag(config=True)

    gpu_notify_timeout = Float(
        30.0,
        help="""Seconds one notification may take on one channel (an SMTP server or a webhook that
        does not answer); then it is given up, logged and counted as failed in Prometheus
        (``gpuspawner_notifications_total``). Nothing waits on it: spawns, stops and jobs go on.
        A finite number above 0.""",
    ).tag(config=True)

    @validate("gpu_notify_email")
    def _check_email(self, proposal):
        value = proposal["value"].strip()
        if value:
            problem = sender_problem(value)
            if problem:
                raise TraitError(f"gpu_notify_email: {problem}")
        return value

    @validate("gpu_notify_webhook_prefixes")
    def _check_prefixes(self, proposal):
        for prefix in proposal["value"]:
            parts = urlsplit(prefix) if _URL_CHARS.fullmatch(prefix) else None
            if parts is None or not parts.scheme or not parts.netloc or (
                    parts.scheme in _HTTP and (not parts.hostname or parts.username is not None)):
                raise TraitError(f"gpu_notify_webhook_prefixes: {prefix!r} is not a URL prefix with a scheme "
                                 "and a host, such as 'https://hooks.example.org/'")
        return proposal["value"]

    @validate("gpu_notify_default_events")
    def _check_events(self, proposal):
        unknown = [e for e in proposal["value"] if e not in EVENTS]
        if unknown:
            raise TraitError(f"gpu_notify_default_events: unknown event(s) {unknown}; known: {list(EVENTS)}")
        return proposal["value"]

    @validate("gpu_notify_timeout")
    def _check_timeout(self, proposal):
        if not 0 < proposal["value"] < float("inf"):
            raise TraitError(f"gpu_notify_timeout must be a finite number > 0, not {proposal['value']}")
        return proposal["value"]


def sender_problem(url: str) -> str | None:
    """Why ``url`` cannot be the email sender (``gpu_notify_email``), or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("mailto", "mailtos") or not parts.netloc:
        return f"{url.split('?')[0][:60]!r} is not an Apprise mailto:// or mailtos:// URL with an SMTP host"
    if "to" in parse_qs(parts.query):
        return "must name no recipient (to=): each user's own address is added"
    import apprise

    if apprise.Apprise.instantiate(recipient_url(url, "user@example.org")) is None:
        return "Apprise cannot read this mailto URL (see the hub's log for Apprise's reason)"
    return None


def recipient_url(sender: str, address: str) -> str:
    """The sender's Apprise URL with ``address`` added as the recipient."""
    return f"{sender}{'&' if '?' in sender else '?'}to={quote(address, safe='@')}"


#: a notebook job's end (its state) -> (title, what happened), as a user is told it
JOB_ENDS = {
    "completed": ("Your GPU job is done", "finished"),
    "failed": ("Your GPU job failed", "failed"),
    "timed_out": ("Your GPU job reached its time limit", "was stopped at its time limit"),
}


def job_told(name: str, job_id: str, state: str, reason: str) -> tuple[str, str] | None:
    """(title, text) a user is told when their job ended in ``state``; None for a job they cancelled."""
    if state not in JOB_ENDS:
        return None
    title, what = JOB_ENDS[state]
    return title, f"Your notebook job {name!r} (job {job_id}) {what}: {reason}. Its GPUs are free again."


# ------------------------------------------------------------------ a user's own choices


@dataclass(frozen=True)
class Preferences:
    """One user's choices: where to be told (``email``, ``webhook``: "" for none) and, per channel,
    the events it tells them of."""

    email: str = ""
    webhook: str = ""
    events: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def wants(self, channel: str, event: str) -> bool:
        return event in self.events.get(channel, frozenset())

    def as_json(self, channels: Collection[str]) -> dict:
        return {"email": self.email, "webhook": self.webhook,
                "events": {c: {e: self.wants(c, e) for e in EVENTS} for c in channels}}


def defaults(events: Collection[str], channels: Collection[str]) -> Preferences:
    """What a user who never chose is told: ``events`` on every channel."""
    return Preferences(events={c: frozenset(events) for c in channels})


def webhook_allowed(url: str, prefixes: Collection[str]) -> bool:
    """Whether ``url`` lies under one of ``prefixes`` (same scheme, host and port; path under the prefix's)."""
    if not _URL_CHARS.fullmatch(url) or "\\" in url or _DOTS.search(url):
        return False
    try:
        got = urlsplit(url)
        port = got.port
    except ValueError:
        return False
    for prefix in prefixes:
        want = urlsplit(prefix)
        if got.scheme.lower() != want.scheme.lower():
            continue
        if got.scheme.lower() not in _HTTP:  # another Apprise scheme: its text begins so
            if url.startswith(prefix):
                return True
            continue
        default = 443 if got.scheme.lower() == "https" else 80
        if got.username is not None or got.hostname != want.hostname or (port or default) != (want.port or default):
            continue
        if got.path.startswith(want.path or "/") or (not want.path and not got.path):
            return True
    return False


def _text(body: Mapping, key: str, current: str, most: int) -> str:
    value = body.get(key, current)
    if not isinstance(value, str):
        raise OptionsError(key, f"must be a string, not {shown(value, 40)}")
    value = value.strip()
    if len(value) > most:
        raise OptionsError(key, f"is longer than {most} characters")
    return value


def parse_preferences(body: Any, current: Preferences, channels: Collection[str], *, email_on: bool,
                      prefixes: Collection[str]) -> Preferences:
    """``current`` changed by a settings body (``{"email"?, "webhook"?, "events"?}``; a key left out
    stays as it is; ``events``: ``{channel: {event: true|false}}``, the events named changed).

    Raises :class:`~gpuspawner.inputs.OptionsError` naming the field given: an address that is not one, a
    webhook URL outside the admin's ``prefixes`` (or any, with none), email while the hub sends
    none (``email_on``), an unknown channel or event, a value that is not true or false.
    """
    if not isinstance(body, Mapping):
        raise OptionsError("body", "must be a JSON object such as {\"email\": \"me@example.org\"}")
    unknown = [k for k in body if k not in BODY_KEYS]
    if unknown:
        raise OptionsError(str(unknown[0])[:40], f"is not a setting; the settings are {', '.join(BODY_KEYS)}")
    email = _text(body, "email", current.email, MAX_ADDRESS)  # checked where given: a change of the admin's
    if email and "email" in body and not email_on:  # settings never locks a user out of theirs
        raise OptionsError("email", "this hub sends no email (its admin configured no sender)")
    if email and "email" in body and not _EMAIL.fullmatch(email):
        raise OptionsError("email", f"{shown(email, 60)} is not an email address such as ann@example.org")
    webhook = _text(body, "webhook", current.webhook, MAX_URL)
    if webhook and "webhook" in body and not webhook_allowed(webhook, prefixes):
        allowed = ", ".join(prefixes) if prefixes else "none: this hub's admin allowed no webhooks"
        raise OptionsError("webhook", f"{shown(webhook, 60)} is not under an allowed prefix ({allowed})")
    events = {c: set(current.events.get(c, ())) for c in channels}
    chosen = body.get("events", {})
    if not isinstance(chosen, Mapping):
        raise OptionsError("events", "must be an object: {channel: {event: true or false}}")
    for channel, per in chosen.items():
        if channel not in events:
            raise OptionsError(f"events.{channel}", f"is not a channel here; the channels are {', '.join(channels)}")
        if not isinstance(per, Mapping):
            raise OptionsError(f"events.{channel}", "must be an object: {event: true or false}")
        for event, on in per.items():
            if event not in EVENTS:
                raise OptionsError(f"events.{channel}.{event}", f"is not an event; the events are {', '.join(EVENTS)}")
            if not isinstance(on, bool):
                raise OptionsError(f"events.{channel}.{event}", f"must be true or false, not {shown(on, 20)}")
            (events[channel].add if on else events[channel].discard)(event)
    return Preferences(email, webhook, {c: frozenset(e) for c, e in events.items()})


# ------------------------------------------------------------------ the notifier, as the layers below the hub see it


class Notifier(Protocol):
    async def tell(self, user: str, event: str, title: str, text: str, url: str | None = None) -> None: ...


class Teller:
    """The hub's notifier for spawners and jobs: ``state.cache(Teller)``; :meth:`later` never blocks or fails."""

    def __init__(self) -> None:
        self.notifier: Notifier | None = None  # set by the hub once it is up (gpuspawner.hub.notify.attach)
        self._tasks: set[asyncio.Task] = set()

    def later(self, user: str, event: str, title: str, text: str, url: str | None = None) -> None:
        """Tell ``user`` of ``event`` in the background (nothing before the hub attached its notifier)."""
        if self.notifier is None:
            return
        task = asyncio.get_running_loop().create_task(self.notifier.tell(user, event, title, text, url))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("telling failed", exc_info=task.exception())
