"""Servers admitted "until" a booking's window: told, warned, and stopped when it starts.

Before a booking's window, placement lets a server take the booked GPUs only if it gives
them back in time (:func:`gpuspawner.bookings.rule` answers ``until``): the server is told so
when it starts (placement's progress message, and a notice: :func:`told`), warned again
its spawner's ``gpu_booking_warn_before`` seconds before the window, and stopped at the window's start,
its usage record ending with the reason ``"booking"``.

The notices go where the GPU idle culler's go, through the same function
(:func:`gpuspawner.hub.judging.post_notice`): the server's monitor
(``POST {server}/api/gpus/notices``, :mod:`gpuspawner.monitor.notices`), which JupyterLab
shows as a notification and in its GPU panel, under their own id (:data:`NOTICE_ID`) so
that they never replace the culler's. The hub posts them with its overview service's
token (scope ``access:servers``), every :data:`PERIOD` seconds (:meth:`HubState.every`):

- :func:`due` decides, from the time and what this server was already told, what to do;
- :class:`BookingNotices` keeps what each start of each server was told, and acts; what a server
  already shows is read from it once (:func:`shown`), so a restarted hub does not tell it again;
- :func:`watch` starts it in a running hub, reading the servers admitted with an ``until``
  from the booking store (``BookingStore.admitted``, which placement fills: :func:`servers_until`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from ..bookings import ANY
from ..db import BookingStore
from ..owner import Owner
from ..state import HubState, hub_state_of_app
from .judging import HubHTTP, post_notice

log = logging.getLogger("gpuspawner.bookings")

NOTICE_ID = "gpu-booking"
PERIOD = 5.0  # seconds between rounds: a server is stopped at most this late
END_REASON = "booking"
WARN_BEFORE = 600.0  # gpu_booking_warn_before's default

#: the sentences of this part, in one place
WORDS = {
    "told": ("This server may keep its GPUs until {until} UTC: from then {what} are booked by {by} "
             "(booking {booking}). It will be stopped then; save your work before."),
    "warned": ("This server will be stopped in {left}, at {until} UTC: its GPUs are booked from then by {by} "
               "(booking {booking}). Save your work now."),
    "stopped": "stopping {owner} at {until} UTC: its GPUs are booked from then by {by} (booking {booking})",
}


def _hhmm(epoch: float, now: float) -> str:
    """10:00, or 2026-11-27 10:00 when not today (UTC)."""
    at, today = datetime.fromtimestamp(epoch, timezone.utc), datetime.fromtimestamp(now, timezone.utc)
    return at.strftime("%H:%M" if at.date() == today.date() else "%Y-%m-%d %H:%M")


def _left(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return f"{minutes} minute{'s' if minutes != 1 else ''}" if minutes < 120 else f"{minutes / 60:.1f} hours"


@dataclass(frozen=True)
class Until:
    """A running server that must give its GPUs back at ``until`` (a booking's window starts)."""

    owner: str  # the ledger's key: user/server
    user: str
    server: str
    since: float  # when this start took its GPUs: what it was told belongs to this start only
    until: float
    booking: str  # the booking's id
    by: str  # whom the GPUs are booked for: a user, or "group NAME"
    what: str  # what is booked, in words: "2 x a100"
    url: str | None = None  # the server's own URL (its monitor), None while it is not up
    warn_before: float = WARN_BEFORE  # its spawner's gpu_booking_warn_before


def told(s: Until, now: float) -> str:
    """What a server admitted until a window is told at its start (progress message and notice)."""
    return WORDS["told"].format(until=_hhmm(s.until, now), what=s.what, by=s.by, booking=s.booking)


def warned(s: Until, now: float) -> str:
    """The warning ``warn_before`` seconds before the window."""
    return WORDS["warned"].format(left=_left(s.until - now), until=_hhmm(s.until, now), by=s.by, booking=s.booking)


def due(now: float, until: float, warn_before: float, was_told: bool, was_warned: bool) -> str | None:
    """What to do now for a server that must give its GPUs back at ``until``.

    ``"stop"`` from ``until`` on; ``"warn"`` from ``until - warn_before`` on, once; ``"tell"``
    before that, once; else None. A server that starts inside the warning time is warned
    (which tells it everything) and never told separately.
    """
    if now >= until:
        return "stop"
    if now >= until - warn_before:
        return None if was_warned else "warn"
    return None if was_told else "tell"


def shown(notices: object, s: Until) -> set[str]:
    """What ``s``'s server already shows of this booking (``notices``: its ``GET /api/gpus/notices``
    body): ``{"tell"}`` for the notice it was told, ``{"tell", "warn"}`` for the warning, none else.
    The notice names the booking and the window's time of day (a server is stopped at its window,
    so the one it shows is for this start's window)."""
    listed = notices.get("notices") if isinstance(notices, dict) else None
    for n in listed if isinstance(listed, list) else ():
        if (isinstance(n, dict) and n.get("id") == NOTICE_ID and isinstance(n.get("message"), str)
                and f"(booking {s.booking})" in n["message"] and _hhmm(s.until, s.until) in n["message"]):
            return {"tell", "warn"} if n.get("level") == "warning" else {"tell"}
    return set()


Post = Callable[[Until, str, str], Awaitable[bool]]  # posts (message, level) to the server: whether it took it
Stop = Callable[[Until], Awaitable[None]]  # records the end reason and stops the server
Shown = Callable[[Until], Awaitable[set[str]]]  # what the server shows already (:func:`shown`)


class BookingNotices:
    """What each start of each server admitted "until" was told; one :meth:`round` acts on it.

    ``shown``: what a server shows already, asked once per start when it is up (a hub that restarts
    starts with nothing told, while its servers still show what they were told before)."""

    def __init__(self, post: Post, stop: Stop, clock: Callable[[], float] = time.time,
                 shown: Shown | None = None) -> None:
        self._post, self._stop, self._clock, self._shown = post, stop, clock, shown
        self._told: dict[tuple, set[str]] = {}  # (owner, since, until) -> {"tell", "warn"} done

    async def round(self, servers: Iterable[Until]) -> None:
        now = self._clock()
        seen = set()
        for s in servers:
            key = (s.owner, s.since, s.until)
            seen.add(key)
            done = self._told.setdefault(key, set())
            if s.url and self._shown is not None and "read" not in done:
                done |= await self._shown(s) | {"read"}
            action = due(now, s.until, s.warn_before, "tell" in done, "warn" in done)
            if action == "stop":
                log.warning(WORDS["stopped"].format(owner=s.owner, until=_hhmm(s.until, now), by=s.by,
                                                    booking=s.booking))
                await self._stop(s)
            elif action is not None and s.url:  # notices wait until the server is up
                message = told(s, now) if action == "tell" else warned(s, now)
                if await self._post(s, message, "warning" if action == "warn" else "info"):
                    done.add(action)
        for key in set(self._told) - seen:  # that start is over
            del self._told[key]


# ------------------------------------------------------------------ in a running hub


def servers_until(store: BookingStore, users: Mapping, state: HubState) -> list[Until]:
    """The running servers admitted until a booking's window (``store.admitted``: owner -> (until,
    booking id)), looked up in ``users`` (JupyterHub's users by name); not those whose booking was
    cancelled since (they keep their GPUs)."""
    found = []
    for owner, (until, booking_id) in list(store.admitted.items()):
        b = store.get(booking_id)
        parsed = Owner.parse(owner)
        if parsed.is_job:  # a job ends by its time limit, before the window
            continue
        try:
            spawner = users[parsed.user].spawners.get(parsed.server)
        except KeyError:
            continue
        if b is None or b.state == "cancelled" or spawner is None or not spawner.active:
            continue
        url = spawner.server.url if spawner.ready and spawner.server is not None else None
        found.append(Until(owner, parsed.user, parsed.server, state.ledger.since(owner) or 0.0, until, b.id,
                           b.holder, f"{b.count} x {b.model if b.model != ANY else 'GPU'}", url,
                           getattr(spawner, "gpu_booking_warn_before", WARN_BEFORE)))
    return found


async def stop_server(settings: dict, s: Until, reason: str = END_REASON) -> None:
    """Stop ``s``'s server (``s``: anything with ``user``, ``server`` and ``owner``) as JupyterHub's own stop
    does (the proxy's route, then the spawner), its usage record ending with ``reason``."""
    user = settings["users"][s.user]
    spawner = user.spawners.get(s.server) if user is not None else None
    if spawner is None or spawner.pending or not spawner.active:
        return  # gone, or starting or stopping already: looked at again next round
    hub_state_of_app(settings).usage.end_reason(s.owner, reason)
    spawner._stop_pending = True  # as JupyterHub's stop_single_user: before anything async
    try:
        await settings["proxy"].delete_user(user, s.server)
        await user.stop(s.server)
    finally:
        spawner._stop_pending = False


def watch(settings: dict) -> BookingNotices:
    """In a running hub (``settings``: its tornado settings): tell, warn and stop servers admitted
    until a booking's window, every :data:`PERIOD` seconds."""
    from .bookings import store_of
    from .handlers import SETTINGS_KEY

    state = hub_state_of_app(settings)
    call = HubHTTP((settings.get(SETTINGS_KEY) or {}).get("token", ""))  # the overview's: access:servers

    refused: set[tuple] = set()  # the starts whose server did not take a notice: said once in the log

    async def post(s: Until, message: str, level: str) -> bool:
        code = await post_notice(call, s.url.rstrip("/"), message, source="gpu-bookings", notice_id=NOTICE_ID,
                                 level=level)
        if not 200 <= code < 300 and (s.owner, s.since) not in refused:
            refused.add((s.owner, s.since))
            log.warning("%s: its server did not take the booking notice (HTTP %s; no GPU monitor?); "
                        "trying again every %g s", s.owner, code, PERIOD)
        return 200 <= code < 300

    async def showing(s: Until) -> set[str]:
        code, body = await call("GET", f"{s.url.rstrip('/')}/api/gpus/notices")
        return shown(body, s) if 200 <= code < 300 else set()

    notices = state.cache(BookingNotices, lambda: BookingNotices(post, lambda s: stop_server(settings, s),
                                                                  shown=showing))

    async def round_() -> None:
        await notices.round(servers_until(store_of(settings), settings["users"], state))

    state.every("booking-notices", PERIOD, round_)
    return notices
