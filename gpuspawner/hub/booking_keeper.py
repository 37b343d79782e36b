"""Bookings held on the cluster: the hub's side of a backend's booking keeper.

The hub's spawner class may offer a keeper (``booking_keeper(config)``, a classmethod of
:class:`~gpuspawner.backends.base.GPUSpawnerMixin`; None: the hub's own placement keeps bookings).
gpu-slurm's holds each booking as Slurm advance reservations
(:mod:`gpuspawner.backends.slurm.booking`). A keeper has these coroutines:

- ``reserve(booking) -> str``: hold every window (all or none); what it holds, in words. ValueError:
  the cluster cannot hold it or refuses to (its sentence is the HTTP 400); RuntimeError: the cluster
  did not answer (HTTP 503);
- ``unreserve(booking_id)``: hold nothing for it any more;
- ``holds(bookings) -> {id: words}``: what each holds now;
- ``models() -> [{"model", "name", "total"}]``: the cluster's GPU models, which bookings are for;
- ``reconcile(live) -> {id: why}``: hold exactly the live bookings' windows: remove what no live
  booking wants, make again what one misses; why those it cannot hold are not held.
- optionally ``held_models(state, owner, keys) -> [model]``: the model of each GPU a ledger owner holds
  where the ledger's keys do not say it (gpu-kube's cluster tokens), for the release of unused windows.

gpu-kube's keeper (:mod:`gpuspawner.backends.kube.booking`) makes nothing on the cluster: its bookings are
for the cluster's models and this hub's placement keeps them.

Here: one keeper per hub (:func:`keeper_of`), one booking change or reconciliation at a time
(:func:`serial`), so a booking reserved but not yet saved is never taken for a stray reservation;
:func:`reserve_then_save` (the reservation exists before the row is committed, and is removed if
the commit fails), and :func:`reconcile` at hub start and every ``gpu_reconcile_interval`` seconds:
a live booking the cluster cannot hold any more says so in its note (and the log).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tornado import web

from ..bookings import Booking, held_windows, moment
from ..db import BookingStore
from ..state import hub_state_of_app

log = logging.getLogger(__name__)

#: what a live booking's note says while the cluster does not hold it (removed once it does again)
UNHELD = " [not held by the cluster since {at}: {why}]"
_UNHELD_MARK = " [not held by the cluster since "


@dataclass
class _Keeping:
    keeper: Any | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _keeping(settings: Mapping) -> _Keeping:
    def make() -> _Keeping:
        hook = getattr(settings.get("spawner_class"), "booking_keeper", None)
        return _Keeping(hook(settings["config"]) if hook is not None else None)

    return hub_state_of_app(settings).cache(_Keeping, make)


def keeper_of(settings: Mapping) -> Any | None:
    """The hub's booking keeper (made once from the spawner class and the config), or None."""
    return _keeping(settings).keeper


def serial(settings: Mapping) -> asyncio.Lock:
    """Held while a booking is checked, reserved and saved, cancelled, or reconciled."""
    return _keeping(settings).lock


async def reserve_then_save(keeper: Any | None, b: Booking, save: Callable[[Booking], Booking]) -> str:
    """Hold ``b`` on the cluster (``keeper``: :func:`keeper_of`), then save it; what it holds ("" without a
    keeper). HTTP 400 with the keeper's sentence when the cluster cannot hold it, 503 when it does not
    answer: nothing is written. Where the save fails, the reservation is removed."""
    if keeper is None:
        save(b)
        return ""
    try:
        holds = await keeper.reserve(b)
    except ValueError as e:
        raise web.HTTPError(400, "%s", str(e)) from e
    except RuntimeError as e:
        raise web.HTTPError(503, "%s", str(e)) from e
    try:
        save(b)
    except BaseException:
        log.error("gpuspawner: booking %s could not be saved; removing its reservations", b.id)
        await keeper.unreserve(b.id)
        raise
    return holds


async def unreserve(settings: Mapping, b: Booking) -> None:
    """Hold nothing more for ``b`` (cancelled); where the cluster does not answer, the next reconciliation
    removes what it holds (logged)."""
    keeper = keeper_of(settings)
    if keeper is None:
        return
    try:
        await keeper.unreserve(b.id)
    except RuntimeError as e:
        log.warning("gpuspawner: cancelled booking %s is still held on the cluster (%s); the next reconciliation "
                    "removes it", b.id, e)


async def holds(settings: Mapping, bookings: Sequence[Booking]) -> dict[str, str]:
    """Booking id -> what the cluster holds for it now (empty without a keeper, or when it does not answer)."""
    keeper = keeper_of(settings)
    if keeper is None or not bookings:
        return {}
    try:
        return await keeper.holds(bookings)
    except RuntimeError as e:
        log.warning("gpuspawner: cannot read what the cluster holds for bookings: %s", e)
        return {}


async def models(settings: Mapping) -> list[dict] | None:
    """The GPU models bookings are for where the cluster has them (``[{"model", "name", "total"}]``); None
    without a keeper (the hub's own GPUs), or when the cluster does not answer (logged)."""
    keeper = keeper_of(settings)
    if keeper is None:
        return None
    try:
        return await keeper.models()
    except RuntimeError as e:
        log.warning("gpuspawner: cannot read the cluster's GPU models for bookings: %s", e)
        return None


def live(bookings: Sequence[Booking], now: float) -> list[Booking]:
    """Bookings with a window that holds GPUs from ``now`` on (not cancelled, not released, not over)."""
    return [b for b in bookings if held_windows(b, now, math.inf)]


def _noted(b: Booking, why: str | None, now: float) -> str:
    """``b``'s note saying the cluster does not hold it (``why``), or no longer saying so (None)."""
    plain = b.note.split(_UNHELD_MARK, 1)[0]
    if why is None:
        return plain
    if _UNHELD_MARK in b.note:
        return b.note  # said already, since the first pass that found it
    return plain + UNHELD.format(at=moment(now), why=why)


async def reconcile(settings: Mapping, store: BookingStore) -> None:
    """Make the cluster hold exactly the live bookings (see the module's words)."""
    keeper = keeper_of(settings)
    if keeper is None:
        return
    async with serial(settings):
        now = time.time()
        current = live(store.all(), now)
        try:
            unheld = await keeper.reconcile(current)
        except RuntimeError as e:
            log.warning("gpuspawner: bookings not reconciled with the cluster: %s", e)
            return
        for b in current:
            note = _noted(b, unheld.get(b.id), now)
            if note != b.note:
                if b.id in unheld:
                    log.error("gpuspawner: booking %s is not held by the cluster: %s", b.id, unheld[b.id])
                store.change(b, note=note)


def start(settings: Mapping, store: BookingStore) -> None:
    """Reconcile now (the hub's start) and every ``gpu_reconcile_interval`` seconds."""
    if keeper_of(settings) is None:
        return
    state = hub_state_of_app(settings)

    async def again() -> None:
        await reconcile(settings, store)

    first = asyncio.ensure_future(again())
    first.add_done_callback(lambda f: f.cancelled() or f.exception() is None or log.error(
        "gpuspawner: reconciling bookings at start failed", exc_info=f.exception()))
    state.every(("bookings", "keeper"), state.reconcile_interval, again)
