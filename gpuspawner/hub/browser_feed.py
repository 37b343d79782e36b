"""The ``browser`` notification channel: what the hub's pages show as browser notifications.

:class:`BrowserFeed` is a channel of the hub's notifier (``send(user, event, title, text, url)``,
as every channel): it keeps each user's recent notifications in memory (the last :data:`KEEP`,
none older than :data:`MAX_AGE`; a restarted hub starts empty) and serves them to that user only,
``GET /hub/api/gpus/notifications/feed?since=<id>`` (:class:`FeedHandler`). A script on the hub's
pages (``templates/gpuspawner_notify.html``, included by ``templates/page.html``) polls it while a
page is open and shows each new item as a browser ``Notification``, once the user allowed them.
The hub's one feed is ``feed_of(settings)``; the notifier registers it beside its other channels.

The spawn-pending page tells its user when their server is ready by itself (from the progress
stream, ``templates/spawn_pending.html``); :func:`ready_event_gpus` adds the GPUs the server holds
to the stream's ready event, for that notification's body.
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping

from jupyterhub.apihandlers import APIHandler
from tornado import web

from ..state import hub_state_of_app

#: how many notifications the feed keeps per user, and for how long (seconds)
KEEP = 50
MAX_AGE = 3600

#: the feed's sentences (the page's own are in templates/gpuspawner_notify.html)
WORDS = {
    "no_user": "Missing or invalid credentials: the notification feed is a logged-in user's own.",
    "no_scope": "Reading your notifications needs your own read:servers scope (a browser session has it).",
    "bad_since": "since must be the id of a notification this feed gave (a whole number, 0 or more); got {got!r}.",
}


class BrowserFeed:
    """The ``browser`` channel: each user's recent notifications, for their open hub pages to show.

    Ids grow with time (milliseconds, each larger than the last), so a page's ``since`` stays
    meaningful across a restart of the hub.
    """

    name = "browser"

    def __init__(self, keep: int = KEEP, max_age: float = MAX_AGE, clock: Callable[[], float] = time.time) -> None:
        self.keep, self.max_age, self.clock = keep, max_age, clock
        self._items: dict[str, deque[dict]] = {}
        self._last = 0

    async def send(self, user: str, event: str, title: str, text: str, url: str | None) -> None:
        """Keep one notification for ``user``'s pages (never fails: memory only)."""
        self.add(user, event, title, text, url)

    def add(self, user: str, event: str, title: str, text: str, url: str | None = None) -> dict:
        now = self.clock()
        self._last = max(self._last + 1, int(now * 1000))
        item = {"id": self._last, "time": now, "event": event, "title": title, "text": text, "url": url}
        self._items.setdefault(user, deque(maxlen=self.keep)).append(item)
        return item

    def read(self, user: str, since: int | None = None) -> dict:
        """``user``'s notifications newer than ``since`` (and than :attr:`max_age`), oldest first, and
        ``last``: the id to ask ``since`` next time (the newest id there is, also when none is new)."""
        oldest = self.clock() - self.max_age
        kept = self._items.get(user, ())
        items = [i for i in kept if i["time"] >= oldest and (since is None or i["id"] > since)]
        return {"items": items, "last": max(self._last if kept else 0, since or 0)}


def feed_of(settings: Mapping) -> BrowserFeed:
    """The hub's one browser feed (the channel to register in its notifier)."""
    return hub_state_of_app(settings).cache(BrowserFeed)


def parse_since(raw: str | None) -> int | None:
    """The ``since`` argument: None when absent; ValueError (with the sentence) when not a whole number >= 0."""
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise ValueError(WORDS["bad_since"].format(got=raw[:40]))
    return int(raw)


class FeedHandler(APIHandler):
    """``GET /hub/api/gpus/notifications/feed?since=<id>``: the requesting user's own notifications."""

    async def get(self) -> None:
        user = self.current_user
        if user is None or getattr(user, "kind", "") != "user":
            raise web.HTTPError(403, WORDS["no_user"])
        if not self.has_scope(f"read:servers!user={user.name}"):
            raise web.HTTPError(403, WORDS["no_scope"])
        try:
            since = parse_since(self.get_argument("since", None))
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from e
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(feed_of(self.settings).read(user.name, since)))


def handlers() -> list[tuple[str, type]]:
    """Routes for ``c.JupyterHub.extra_handlers`` (JupyterHub prefixes them with ``/hub``)."""
    return [(r"/api/gpus/notifications/feed", FeedHandler)]


def gpu_words(spawner) -> str:
    """What a server holds, in words: ``2 x NVIDIA A100-SXM4-80GB``, ``1 x a100`` (the cluster places),
    ``no GPU``; empty for a spawner that is not gpuspawner's."""
    held = getattr(spawner, "gpu_allocation", ())
    if held:
        return ", ".join(f"{n} x {name}" for name, n in sorted(Counter(g.name for g in held).items()))
    choice = getattr(spawner, "gpu_choice", None)
    if choice is None:
        return ""
    if not choice.gpus:
        return "no GPU"
    return f"{choice.gpus} x {'GPU' if choice.gpu_model == 'any' else choice.gpu_model}"


async def ready_event_gpus(spawner, event: dict) -> dict:
    """``c.Spawner.progress_ready_hook`` (set by ``configure`` where the site sets none): the progress
    stream's ready event names the server's GPUs (``gpus``), for the spawn-pending page's notification."""
    words = gpu_words(spawner)
    return {**event, "gpus": words} if words else event
