"""The hub's notifier: one per hub, on its :class:`~gpuspawner.state.HubState` (:func:`notifier_of`).

``await notifier.tell(user, event, title, text, url=None)`` tells ``user`` of ``event`` (one of
:data:`gpuspawner.notifications.EVENTS`) on every channel they want it on (their settings,
:mod:`.notify_api`; until they choose, the admin's ``gpu_notify_default_events``). Every channel
implements :class:`Channel`:

- ``email``: through Apprise, to the user's address, from the admin's ``gpu_notify_email`` sender;
- ``webhook``: through Apprise, to the user's webhook URL (JSON for an ``http(s)`` URL), which must
  lie under one of the admin's ``gpu_notify_webhook_prefixes``;
- ``jupyterlab``: a notice on each of the user's running servers (their GPU monitor's notice board,
  :func:`~gpuspawner.hub.judging.post_notice`), which JupyterLab shows in its notification centre;
- ``browser``: the hub's pages show it with the browser's Notification API (:mod:`.browser_feed`).

Where something else always tells an event on a channel (the culler's own warning in JupyterLab, the
spawn-pending page's own "ready"), the notifier leaves it alone (:data:`~gpuspawner.notifications.TOLD_ELSEWHERE`).

Other channels may be added with :meth:`Notifier.add`. A
failing channel never blocks or fails its caller: Apprise runs in the notifier's own worker
threads, each send is given up after ``gpu_notify_timeout`` seconds, and every outcome is logged
and counted (``gpuspawner_notifications_total{channel,event,outcome}``).

Where events are told: a queued server is ready (:mod:`gpuspawner.backends.telling`); before a cull
(the culler reports its warning to ``POST /hub/api/gpus/notifications/events``, :mod:`.notify_api`);
a notebook job ended (the job manager); a booked window starts (:func:`tell_window_starts`, every
:data:`WINDOW_PERIOD` seconds); a budget runs low (:func:`tell_budget_low`: a listener of the hub's
budget keeper, ``on_low``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol

from ..bookings import Booking, windows
from ..notifications import (
    TOLD_ELSEWHERE,
    GPUNotifySettings,
    Preferences,
    Teller,
    defaults,
    recipient_url,
    webhook_allowed,
)
from ..state import HubState, hub_state_of_app, settings_for
from .browser_feed import feed_of
from .judging import HubHTTP, post_notice
from .notify_store import NotifyStore

log = logging.getLogger("gpuspawner.notify")

#: seconds between looks for booked windows that started
WINDOW_PERIOD = 30.0
#: worker threads for Apprise (a slow SMTP server or webhook holds one until its own socket timeout)
WORKERS = 4


class Channel(Protocol):
    name: str  # "email", "webhook", "jupyterlab", "browser"

    async def send(self, user: str, event: str, title: str, text: str, url: str | None) -> None: ...


class NotSent(RuntimeError):
    """A channel could not deliver; its text says why."""


def webhook_target(url: str) -> str:
    """The Apprise URL for a user's webhook: ``http(s)://`` becomes Apprise's JSON post (``json(s)://``)."""
    for scheme, apprise_scheme in (("https://", "jsons://"), ("http://", "json://")):
        if url.lower().startswith(scheme):
            return apprise_scheme + url[len(scheme):]
    return url


class _Apprise:
    """Sending through Apprise in the notifier's worker threads."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool

    async def deliver(self, target: str, title: str, text: str) -> None:
        ok = await asyncio.get_running_loop().run_in_executor(self._pool, _notify, target, title, text)
        if not ok:
            raise NotSent("Apprise could not deliver it (its log line above says why)")


def _notify(target: str, title: str, text: str) -> bool:
    import apprise

    sender = apprise.Apprise(asset=apprise.AppriseAsset(app_id="gpuspawner", app_desc="JupyterHub GPUs"))
    if not sender.add(target):
        raise NotSent("Apprise cannot read the target URL")
    return bool(sender.notify(title=title, body=text))


class EmailChannel(_Apprise):
    name = "email"

    def __init__(self, pool: ThreadPoolExecutor, sender: str, preferences: Callable[[str], Preferences]) -> None:
        super().__init__(pool)
        self.sender, self.preferences = sender, preferences

    def reaches(self, user: str, event: str) -> bool:
        return bool(self.preferences(user).email)

    async def send(self, user: str, event: str, title: str, text: str, url: str | None) -> None:
        await self.deliver(recipient_url(self.sender, self.preferences(user).email), title, text)


class WebhookChannel(_Apprise):
    name = "webhook"

    def __init__(self, pool: ThreadPoolExecutor, preferences: Callable[[str], Preferences],
                 prefixes: Iterable[str]) -> None:
        super().__init__(pool)
        self.preferences, self.prefixes = preferences, list(prefixes)

    def reaches(self, user: str, event: str) -> bool:
        """Only a URL under today's prefixes (one saved under an admin's earlier ones is not posted to)."""
        url = self.preferences(user).webhook
        return bool(url) and webhook_allowed(url, self.prefixes)

    async def send(self, user: str, event: str, title: str, text: str, url: str | None) -> None:
        await self.deliver(webhook_target(self.preferences(user).webhook), title, text)


class JupyterLabChannel:
    """A notice on each of the user's running servers (JupyterLab's notification centre shows it)."""

    name = "jupyterlab"
    SOURCE = "gpu-notifications"

    def __init__(self, users: Any, call: HubHTTP) -> None:
        self.users, self.call = users, call

    def _servers(self, user: str) -> list[str]:
        try:
            found = self.users[user]
        except KeyError:
            return []
        return [s.server.url.rstrip("/") for s in found.spawners.values() if s.ready and s.server is not None]

    def reaches(self, user: str, event: str) -> bool:
        return bool(self._servers(user))

    async def send(self, user: str, event: str, title: str, text: str, url: str | None) -> None:
        for server in self._servers(user):
            code = await post_notice(self.call, server, f"{title}: {text}", source=self.SOURCE,
                                     notice_id=f"gpu-notify-{event}", level="info")
            if not 200 <= code < 300:
                raise NotSent(f"the server at {server} did not take the notice (HTTP {code}; no GPU monitor?)")


class Notifier:
    """One hub's notifier (see the module's docstring)."""

    def __init__(self, settings: GPUNotifySettings, store: NotifyStore, counter: Any) -> None:
        self.settings, self.store, self.counter = settings, store, counter
        self.channels: dict[str, Channel] = {}
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="gpuspawner-notify")

    def add(self, channel: Channel) -> None:
        """Tell through ``channel`` as well (its ``name`` is its column on the settings page)."""
        self.channels[channel.name] = channel

    @property
    def email_on(self) -> bool:
        return bool(self.settings.gpu_notify_email)

    def preferences(self, user: str) -> Preferences:
        """``user``'s choices, or the admin's defaults for a user who never chose."""
        base = defaults(self.settings.gpu_notify_default_events, self.channels)
        chosen = self.store.get(user)  # a channel added since they chose tells them the defaults
        return base if chosen is None else replace(chosen, events={**base.events, **chosen.events})

    async def tell(self, user: str, event: str, title: str, text: str, url: str | None = None) -> None:
        """Tell ``user`` of ``event`` on every channel they want it on; never raises."""
        chosen = self.preferences(user)
        await asyncio.gather(*(self._send(channel, user, event, title, text, url)
                               for channel in list(self.channels.values())
                               if chosen.wants(channel.name, event) and (channel.name, event) not in TOLD_ELSEWHERE))

    async def _send(self, channel: Channel, user: str, event: str, title: str, text: str, url: str | None) -> None:
        try:
            reaches = getattr(channel, "reaches", None)  # optional: whether the user has an address there
            if reaches is not None and not reaches(user, event):
                return
            await asyncio.wait_for(channel.send(user, event, title, text, url), self.settings.gpu_notify_timeout)
        except Exception as e:
            why = f"no answer in {self.settings.gpu_notify_timeout:g} s" if isinstance(e, asyncio.TimeoutError) else e
            log.warning("could not tell %s of %s by %s: %s", user, event, channel.name, why)
            self.counter.labels(channel=channel.name, event=event, outcome="failed").inc()
        else:
            log.info("told %s of %s by %s", user, event, channel.name)
            self.counter.labels(channel=channel.name, event=event, outcome="sent").inc()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def notifier_of(settings: Mapping) -> Notifier:
    """The hub's notifier (made on first use, with its channels; found by :class:`Teller` too)."""
    state = hub_state_of_app(settings)

    def make() -> Notifier:
        from .handlers import SETTINGS_KEY

        config = settings_for(settings["config"], settings.get("spawner_class"), GPUNotifySettings)
        store = state.cache(NotifyStore, lambda: NotifyStore(settings["db"].get_bind()))
        notifier = Notifier(config, store, state.metrics.notifications)
        if config.gpu_notify_email:
            notifier.add(EmailChannel(notifier.pool, config.gpu_notify_email, notifier.preferences))
        if config.gpu_notify_webhook_prefixes:
            notifier.add(WebhookChannel(notifier.pool, notifier.preferences, config.gpu_notify_webhook_prefixes))
        token = (settings.get(SETTINGS_KEY) or {}).get("token", "")  # the overview's: access:servers
        notifier.add(JupyterLabChannel(settings["users"], HubHTTP(token)))
        notifier.add(feed_of(settings))  # "browser": the hub's pages show it (Notification API)
        state.cache(Teller).notifier = notifier
        return notifier

    return state.cache(Notifier, make)


# ------------------------------------------------------------------ booked windows


def window_starts(bookings: Iterable[Booking], since: float, now: float) -> list[tuple[Booking, float, float]]:
    """The windows of ``bookings`` (not cancelled) that started in ``(since, now]``: (booking, start, end)."""
    found = []
    for b in bookings:
        if b.state == "cancelled":
            continue
        for start, end in windows(b, since, now + 1e-6):
            if since < start <= now:
                found.append((b, start, end))
    return found


def window_text(b: Booking, end: float) -> str:
    from .usage import iso

    what = f"{b.count} x {b.model if b.model != 'any' else 'GPU'}"
    return (f"Your booked window has started: {what} are held for {b.holder} until {iso(end)} (booking {b.id}). "
            "Start a server on them from the hub's home page; unused, the window is released after a while.")


def tell_window_starts(settings: Mapping, state: HubState, notifier: Notifier) -> None:
    """Every :data:`WINDOW_PERIOD` seconds, tell each booking's users that its window started."""
    from jupyterhub import orm

    from .bookings import store_of

    seen = {"until": time.time()}

    async def round_() -> None:
        now = time.time()
        since, seen["until"] = seen["until"], now
        for b, _start, end in window_starts(store_of(settings).all(), since, now):
            users = [b.user] if b.user else []
            if b.group:
                group = orm.Group.find(settings["db"], b.group)
                users += [u.name for u in group.users] if group is not None else []
            for user in dict.fromkeys(users):
                await notifier.tell(user, "booking", "Your GPU booking starts", window_text(b, end))

    state.every("notify-booking-windows", WINDOW_PERIOD, round_)


def budget_text(standing: Any) -> str:
    """What a user is told when their GPU budget runs low (``standing``: :class:`gpuspawner.budgets.Standing`)."""
    return (f"Your GPU budget runs low: {standing.summary()}. Stop servers you do not use, so that what is "
            "left lasts; the GPU usage page shows where it went.")


def tell_budget_low(state: HubState) -> None:
    """Tell a user when their budget runs low: a listener of the hub's budget keeper (``on_low``)."""
    from ..backends.budgets import budget_keeper

    teller = state.cache(Teller)
    budget_keeper(state).on_low(lambda user, standing: teller.later(
        user, "budget", "Your GPU budget runs low", budget_text(standing)))


def attach(settings: Mapping) -> Notifier:
    """In a running hub: make its notifier (spawners and jobs reach it through :class:`Teller`), watch
    booked windows and listen for budgets running low."""
    notifier = notifier_of(settings)
    state = hub_state_of_app(settings)
    tell_window_starts(settings, state, notifier)
    tell_budget_low(state)
    return notifier


__all__ = ["Channel", "Notifier", "attach", "notifier_of"]
