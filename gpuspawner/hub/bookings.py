"""GPU bookings over REST, and the hub's keeping of them (see the README's "Booking GPUs").

- ``GET /hub/api/gpus/bookings[?model=SLUG]``: the caller's own bookings (made by them or for
  them) and their groups'; administrators see all. ``{"bookings": [...], "admitted": [...]}``:
  ``admitted`` lists the servers let take GPUs before a window on condition that they give them
  back by ``until`` (epoch seconds), with the booking that needs them.
- ``GET /hub/api/gpus/bookings/ID``: one of those.
- ``POST /hub/api/gpus/bookings`` with ``{model, count, start, end, user?, group?, repeat_weeks?,
  note?}`` (times ISO 8601, UTC unless they say, or epoch seconds) -> 201 with the booking;
  400 naming the field and saying why (nothing is written then).
- ``DELETE /hub/api/gpus/bookings/ID`` (whoever it is for or was booked by, or an administrator)
  -> 204; the booking is kept, ``cancelled``, and the servers admitted until its window may stay.
  Anyone else: 403.

A booking answers as its fields (:class:`gpuspawner.bookings.Booking`) plus ``windows`` (the
next few, ``[{"start", "end"}]``), ``window`` (the first, in words), ``status``: ``upcoming``,
``active`` (a window holds its GPUs now), ``released`` (unused past the grace period),
``cancelled`` or ``ended``, and ``holds``: what the cluster holds for it where the backend keeps
bookings there (gpu-slurm's reservations: "whole node gpu-1 (4 GPUs)"; gpu-kube's: "2 of the cluster's
a100 GPUs, as counted by this hub; ..."; :mod:`.booking_keeper`), else "".

An unused window is released ``gpu_booking_grace`` seconds after it starts when none of the
booking's users holds GPUs of its model (on gpu-kube: the model their pods asked for, the keeper's
``held_models``); :func:`start_keeping` checks on a timer.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from jupyterhub.apihandlers import APIHandler
from tornado import web
from tornado.ioloop import PeriodicCallback

from ..bookings import (
    ANY,
    Booking,
    BookingError,
    BookingLimits,
    as_record,
    check_new,
    held_windows,
    holding,
    new_id,
    span,
    windows,
)
from ..db import BookingStore
from ..gpu import slug_matches
from ..inputs import OptionsError, dumps, read_json, shown
from ..owner import Owner, OwnerError
from ..state import HubState, hub_state_of_app, settings_for
from . import booking_keeper as keeping
from .handlers import ADMIN_SCOPE
from .usage import BadParameter, parse_time

#: the keys a new booking's body may have
BODY_KEYS = ("model", "count", "start", "end", "user", "group", "repeat_weeks", "note")
MAX_NOTE = 500
#: how many windows a booking's answer lists
SHOWN_WINDOWS = 5


def store_of(settings: Mapping) -> BookingStore:
    """The hub's bookings (read from its database on first use)."""
    state = hub_state_of_app(settings)
    return state.cache(BookingStore, lambda: BookingStore(settings["db"].get_bind()))


def limits_of(settings: Mapping) -> BookingLimits:
    """The ``gpu_booking_*`` settings of the hub's spawner class, read once."""
    def make() -> BookingLimits:
        s = settings_for(settings["config"], settings.get("spawner_class"))
        return BookingLimits(hours_per_week=s.gpu_booking_hours_per_week, max_ahead=s.gpu_booking_max_ahead,
                             max_window=s.gpu_booking_max_window, grace=s.gpu_booking_grace)

    return hub_state_of_app(settings).cache(BookingLimits, make)


def status(b: Booking, now: float) -> str:
    if b.state == "cancelled":
        return "cancelled"
    if holding(b, now):
        return "active"
    if held_windows(b, now, math.inf):
        return "upcoming"
    return "released" if b.state == "released" else "ended"


def booking_json(b: Booking, now: float, holds: str = "") -> dict:
    coming = windows(b, now, math.inf)[:SHOWN_WINDOWS]
    return {**as_record(b), "windows": [{"start": s, "end": e} for s, e in coming],
            "window": span(*(coming[0] if coming else (b.start, b.end))), "status": status(b, now), "holds": holds}


def resolve_model(model: str, slugs: Iterable[str]) -> str:
    """The hub's model slug a booking's ``model`` names: itself, or the one slug it selects as a
    profile's pattern does (``a100`` -> ``a100-sxm4-80gb``); 400 when it selects several."""
    slugs = set(slugs)
    if model == ANY or model in slugs:
        return model
    found = sorted(s for s in slugs if slug_matches(model, s))
    if len(found) > 1:
        raise OptionsError("model", f"{shown(model, 40)} names several models here ({', '.join(found)}); pick one")
    return found[0] if found else model


def _text(body: Mapping, key: str, most: int = 255) -> str:
    value = body.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise OptionsError(key, f"must be a text, not {shown(value)}")
    if len(value) > most:
        raise OptionsError(key, f"has at most {most} characters")
    return value.strip()


def _whole(body: Mapping, key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise OptionsError(key, f"must be a whole number, not {shown(value)}" if key in body else "is missing")
    return value


def _time(body: Mapping, key: str) -> float:
    if key not in body:
        raise OptionsError(key, "is missing: give ISO 8601 (2026-12-01T10:00:00Z) or seconds since the epoch")
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise OptionsError(key, f"must be ISO 8601 text or seconds since the epoch, not {shown(value)}")
    try:
        return parse_time(str(value), key)
    except BadParameter as e:
        raise OptionsError(key, str(e).split(" ", 1)[1] if str(e).startswith(f"{key}=") else str(e)) from None


def parse_body(body: Any, me: str, now: float) -> Booking:
    """A new booking from a POST body (:class:`OptionsError` names the first bad field); not yet checked
    against limits and GPUs (:func:`gpuspawner.bookings.check_new` does that)."""
    if not isinstance(body, Mapping):
        raise OptionsError("body", 'must be a JSON object {"model": "a100", "count": 2, "start": ..., "end": ...}')
    unknown = [k for k in body if k not in BODY_KEYS]
    if unknown:
        raise OptionsError(str(unknown[0])[:40], f"is not a booking field; fields: {', '.join(BODY_KEYS)}")
    model = _text(body, "model")
    if not model:
        raise OptionsError("model", "is missing: a GPU model as the form names it (e.g. a100), or any")
    group = _text(body, "group")
    user = _text(body, "user") or ("" if group else me)
    return Booking(id=new_id(), user=user, group=group, booked_by=me, model=model, count=_whole(body, "count"),
                   start=_time(body, "start"), end=_time(body, "end"),
                   repeat_weeks=_whole(body, "repeat_weeks", 0), created=now, note=_text(body, "note", MAX_NOTE))


async def capacity_of(settings: Mapping) -> Mapping[str, int]:
    """Model slug -> GPUs bookings may hold: the cluster's where a keeper holds them there, else the hub's."""
    found = await keeping.models(settings)
    if found is not None:
        return {m["model"]: m["total"] for m in found}
    reading = await hub_state_of_app(settings).inventory.read()
    return Counter(g.model for g in reading.gpus)


class _Bookings(APIHandler):
    @property
    def hub_state(self) -> HubState:
        return hub_state_of_app(self.settings)

    @property
    def store(self) -> BookingStore:
        return store_of(self.settings)

    def caller(self) -> tuple[str, set[str], bool]:
        """(name, groups, is administrator) of the caller; 403 without credentials."""
        user = self.current_user
        if not user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        admin = bool(getattr(user, "admin", False)) or ADMIN_SCOPE in self.expanded_scopes
        return user.name, {g.name for g in getattr(user, "groups", ())}, admin

    def visible(self, b: Booking, me: str, groups: set[str], admin: bool) -> bool:
        return admin or b.booked_by == me or b.is_for(me, groups)

    def mine(self, booking_id: str) -> tuple[Booking, bool]:
        me, groups, admin = self.caller()
        b = self.store.get(booking_id)
        if b is None:
            raise web.HTTPError(404, f"No booking {booking_id[:40]!r}.")
        if not self.visible(b, me, groups, admin):
            raise web.HTTPError(403, f"Booking {b.id} is not yours: it is for {b.holder}, booked by {b.booked_by}.")
        return b, admin or b.booked_by == me or b.user == me

    def answer(self, data: object, code: int = 200) -> None:
        self.set_status(code)
        self.set_header("Cache-Control", "no-store")
        self.finish(dumps(data))


class BookingsHandler(_Bookings):
    """``GET`` (list) and ``POST`` (book) ``/hub/api/gpus/bookings``."""

    async def get(self) -> None:
        me, groups, admin = self.caller()
        model = self.get_argument("model", "")
        now = time.time()
        seen_ = [b for b in self.store.all() if self.visible(b, me, groups, admin) and (not model or b.model == model)]
        held = await keeping.holds(self.settings, seen_)
        shown_ = [booking_json(b, now, held.get(b.id, "")) for b in seen_]
        seen = {b["id"] for b in shown_}
        admitted = []
        for owner, (until, booking_id) in sorted(self.store.admitted.items()):
            try:
                who = Owner.parse(owner)
            except OwnerError:
                continue
            if admin or who.user == me or booking_id in seen:
                admitted.append({"owner": owner, "user": who.user, "server": who.label, "until": until,
                                 "booking": booking_id})
        self.answer({"bookings": shown_, "admitted": admitted, "now": now})

    async def post(self) -> None:
        me, _, admin = self.caller()
        now = time.time()
        try:
            b = parse_body(read_json(self.request.body), me, now)
            self.check_names(b)
            capacity = await capacity_of(self.settings)
            b = replace(b, model=resolve_model(b.model, capacity))
        except OptionsError as e:
            raise web.HTTPError(400, "%s", str(e)) from e
        async with keeping.serial(self.settings):  # checked, held on the cluster (gpu-slurm), then saved
            try:
                check_new(b, self.store.all(), limits_of(self.settings), capacity, now, admin)
            except BookingError as e:
                raise web.HTTPError(400, "%s", f"{e.field}: {e}") from e
            holds = await keeping.reserve_then_save(keeping.keeper_of(self.settings), b, self.store.save)
        self.set_header("Location", f"{self.request.path.rstrip('/')}/{b.id}")
        self.answer(booking_json(b, now, holds), 201)

    def check_names(self, b: Booking) -> None:
        from jupyterhub import orm

        if b.user and b.user != b.booked_by and self.find_user(b.user) is None:
            raise OptionsError("user", f"no user {shown(b.user, 40)} on this hub")
        if b.group and orm.Group.find(self.db, b.group) is None:
            raise OptionsError("group", f"no group {shown(b.group, 40)} on this hub")


class BookingHandler(_Bookings):
    """``GET`` and ``DELETE`` ``/hub/api/gpus/bookings/ID``."""

    async def get(self, booking_id: str) -> None:
        b, _ = self.mine(booking_id)
        held = await keeping.holds(self.settings, [b])
        self.answer(booking_json(b, time.time(), held.get(b.id, "")))

    async def delete(self, booking_id: str) -> None:
        b, may = self.mine(booking_id)
        if not may:
            raise web.HTTPError(403, f"Booking {b.id} is for group {b.group}: only {b.booked_by} or an "
                                     "administrator may cancel it.")
        if b.state != "cancelled":
            async with keeping.serial(self.settings):
                await keeping.unreserve(self.settings, b)
                self.store.change(b, state="cancelled")
            for owner, (_, booking_id) in list(self.store.admitted.items()):
                if booking_id == b.id:  # a server told to leave for it may stay
                    self.store.forget(owner)
        self.set_status(204)
        self.finish()


# ------------------------------------------------------------------ releasing unused windows


def unused(bookings: list[Booking], holders: Mapping[str, set[str]], members: Mapping[str, set[str]],
           now: float, grace: float) -> list[tuple[Booking, float]]:
    """Bookings whose window on now started ``grace`` ago or more with none of their users holding GPUs
    of its model: (booking, when its window started). ``holders``: user -> models they hold;
    ``members``: group -> users."""
    out = []
    for b in bookings:
        on = holding(b, now)
        if on is None or now < on[0] + grace:
            continue
        users = members.get(b.group, set()) if b.group else {b.user}
        if not any(b.model == ANY or b.model in holders.get(u, set()) for u in users):
            out.append((b, on[0]))
    return out


def release_unused(settings: Mapping, now: float | None = None) -> list[Booking]:
    """Release the windows :func:`unused` finds (recorded: state ``released``, ``released_at``)."""
    from jupyterhub import orm

    now = time.time() if now is None else now
    state = hub_state_of_app(settings)
    store = store_of(settings)
    if not any(holding(b, now) for b in store.all()):
        return []
    reading = state.inventory.last_reading()
    model_of = {g.uuid: g.model for g in reading.gpus} if reading is not None else {}
    held_models = getattr(keeping.keeper_of(settings), "held_models", None)  # gpu-kube: the pod's model
    holders: dict[str, set[str]] = {}
    for owner, uuids in state.ledger.allocations().items():
        try:
            user = Owner.parse(owner).user
        except OwnerError:
            continue
        holders.setdefault(user, set()).update(model_of[u] if u in model_of else state.gpu_info(u)["model"]
                                               for u in uuids)
        if held_models is not None:
            holders[user].update(held_models(state, owner, tuple(uuids)))
    groups = {b.group for b in store.all() if b.group}
    db = settings["db"]
    members = {g: {u.name for u in found.users} for g in groups if (found := orm.Group.find(db, g)) is not None}
    released = []
    for b, _ in unused(store.all(), holders, members, now, limits_of(settings).grace):
        released.append(store.change(b, state="released", released_at=now))
    return released


def start_keeping(settings: Mapping) -> PeriodicCallback:
    """Read the bookings now (the hub's start), release unused windows on a timer, and reconcile them with
    the cluster where it holds them (:mod:`.booking_keeper`)."""
    keeping.start(settings, store_of(settings))
    grace = limits_of(settings).grace
    timer = PeriodicCallback(lambda: release_unused(settings), 1000 * min(60.0, max(1.0, grace / 4)))
    timer.start()
    return timer


def handlers() -> list[tuple[str, type]]:
    return [(r"/api/gpus/bookings", BookingsHandler), (r"/api/gpus/bookings/([^/]+)", BookingHandler)]
