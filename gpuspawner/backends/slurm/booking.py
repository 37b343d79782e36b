"""gpu-slurm's booking keeper: bookings held as Slurm advance reservations the hub makes and removes.

The hub asks its spawner class for a keeper (:meth:`GPUSpawnerMixin.booking_keeper
<gpuspawner.backends.base.GPUSpawnerMixin.booking_keeper>`); gpu-slurm's is a
:class:`SlurmBookingKeeper` over :class:`~.reservations.SlurmReservations`, whose ``scontrol`` and
``sinfo`` run through ``exec_prefix`` filled in for ``slurm_reservation_user`` (an account Slurm lets
create reservations: an operator or administrator), as every other Slurm command of the hub runs.
The commands run in a worker thread, so the hub's event loop never waits on Slurm.

- :meth:`~SlurmBookingKeeper.reserve`: every window's reservation, or none; what it holds in words;
- :meth:`~SlurmBookingKeeper.unreserve`: every reservation of a booking removed;
- :meth:`~SlurmBookingKeeper.holds`: what each booking's reservations hold now (``scontrol show
  reservation -o``, read at most every few seconds);
- :meth:`~SlurmBookingKeeper.reconcile`: this hub's reservations made to match its live bookings: one
  no live booking's held window wants is removed (a hub killed between reserving and saving a
  booking, a booking cancelled while Slurm did not answer, a window released unused), one a live
  booking misses is made again; why one cannot be is answered per booking.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import math
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence

from batchspawner import format_template

from ...bookings import ANY, Booking, held_windows, windows
from ...gpu import slug_matches
from .capacity import GresTypes
from .commands import prefixed
from .reservations import Reservation, SlurmReservations, held

log = logging.getLogger(__name__)

#: seconds a listing of the reservations answers :meth:`SlurmBookingKeeper.holds`
LISTING_TTL = 5.0


def wanted(b: Booking, r: Reservation, prefix: str, now: float) -> bool:
    """Whether reservation ``r`` (``PREFIX-ID-N``) is one of live booking ``b``'s windows that still holds."""
    found = re.fullmatch(re.escape(f"{prefix}-{b.id}-") + r"(\d+)", r.name)
    if not found:
        return False
    calendar = windows(b, -math.inf, math.inf)
    n = int(found[1])
    return n < len(calendar) and any(s == calendar[n][0] for s, _ in held_windows(b, now, math.inf))


def window_names(b: Booking, prefix: str, now: float) -> set[str]:
    """The reservation names of ``b``'s windows that hold GPUs from ``now`` on."""
    held_starts = {s for s, _ in held_windows(b, now, math.inf)}
    return {f"{prefix}-{b.id}-{n}" for n, (s, _) in enumerate(windows(b, -math.inf, math.inf)) if s in held_starts}


class SlurmBookingKeeper:
    """This hub's bookings as Slurm reservations (see the module's words)."""

    def __init__(self, prefix: str, exec_prefix: str = "", accounts: Callable[[str], str] = str,
                 gres_types: GresTypes | None = None, problem: str | None = None) -> None:
        """``prefix``: the reservations' names' start (``jupyterhub-<hub id>``); ``exec_prefix``: filled in;
        ``problem``: why no command can run (every call raises RuntimeError saying it)."""
        self.exec_prefix, self.problem = exec_prefix, problem
        self.types = gres_types or GresTypes()
        self.slurm = SlurmReservations(prefix, accounts=accounts, gres_types=dict(self.types.by_slug), run=self._run)
        self._listed: tuple[float, tuple[Reservation, ...]] | None = None

    @classmethod
    def of(cls, spawner) -> SlurmBookingKeeper:
        """The keeper of a gpu-slurm spawner's settings (one made with the hub's config, no user)."""
        prefix = f"jupyterhub-{spawner.gpu_hub_id}"
        account = spawner.slurm_reservation_user or getpass.getuser()
        kept = {"accounts": spawner.account_of, "gres_types": GresTypes(dict(spawner.slurm_gres_types))}
        try:
            filled = format_template(spawner.exec_prefix, username=account)
        except Exception as e:  # a site's template may want more than {username}
            return cls(prefix, problem=f"exec_prefix cannot be filled in for {account}: {e!r}", **kept)
        return cls(prefix, filled, **kept)

    @property
    def prefix(self) -> str:
        return self.slurm.prefix

    def _run(self, args: Sequence[str]) -> subprocess.CompletedProcess:
        if self.problem is not None:
            raise RuntimeError(self.problem)
        line = prefixed(self.exec_prefix, shlex.join(args))
        return subprocess.run(line, shell=True, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL, start_new_session=True)

    def _gres_type(self, model: str) -> None:
        """Map the hub's model slug (NVML's, e.g. ``a100-sxm4-80gb``) to the cluster's GRES type (``a100``)."""
        if model == ANY or model in self.slurm.gres_types:
            return
        found = {t for node in self.slurm.nodes() for t in node.gpus}
        exact = [t for t in found if self.types.slug(t) == model]
        near = [t for t in found if slug_matches(self.types.slug(t), model)]
        if exact or near:
            self.slurm.gres_types[model] = (exact or sorted(near))[0]

    def _models(self) -> list[dict]:
        types, out = self.types, {}
        for node in self.slurm.nodes():
            for t, n in node.gpus.items():
                entry = out.setdefault(types.slug(t), {"model": types.slug(t), "name": types.name(t), "total": 0})
                entry["total"] += n
        return sorted(out.values(), key=lambda m: m["model"])

    async def models(self) -> list[dict]:
        """The cluster's GPU models, as its form offers them: ``[{"model", "name", "total"}]`` (what may be
        booked: the hub host itself has no GPUs at a Slurm site). RuntimeError: Slurm does not answer."""
        return await asyncio.to_thread(self._models)

    def _reserve(self, b: Booking, only: set[str] | None = None) -> list[Reservation]:
        self._gres_type(b.model)
        self._listed = None
        return self.slurm.reserve(b, only)

    async def reserve(self, b: Booking) -> str:
        """Reserve every window of ``b`` (all or none); what it holds ("whole node gpu-1 (4 GPUs)").
        ValueError (:class:`~.reservations.ReservationError`): the cluster cannot hold it, the sentence
        says why; RuntimeError: Slurm refused or did not answer."""
        made = await asyncio.to_thread(self._reserve, b)
        return held(b, made)

    async def unreserve(self, booking_id: str) -> None:
        """Remove every reservation of the booking (RuntimeError: Slurm refused or did not answer)."""
        self._listed = None
        await asyncio.to_thread(self.slurm.unreserve, booking_id)

    def _listing(self) -> tuple[Reservation, ...]:
        if self._listed is None or time.monotonic() - self._listed[0] > LISTING_TTL:
            self._listed = (time.monotonic(), self.slurm.reservations())
        return self._listed[1]

    async def holds(self, bookings: Sequence[Booking]) -> dict[str, str]:
        """Booking id -> what its reservations hold now ("" for none); RuntimeError: Slurm does not answer."""
        listed = await asyncio.to_thread(self._listing)
        return {b.id: held(b, listed) for b in bookings}

    def _reconcile(self, live: Sequence[Booking], now: float) -> dict[str, str]:
        self._listed = None
        listed = self.slurm.reservations()
        by_id = {b.id: b for b in live}
        for r in listed:
            b = by_id.get(r.booking_id(self.prefix) or "")
            if b is None or not wanted(b, r, self.prefix, now):
                log.warning("gpu-slurm: removing Slurm reservation %s: no live booking of this hub holds it "
                            "(cancelled, released or never saved)", r.name)
                self.slurm.remove(r)
        names = {r.name for r in listed}
        unheld = {}
        for b in live:
            missing = window_names(b, self.prefix, now) - names
            if not missing:
                continue
            try:
                self._reserve(b, missing)
                log.warning("gpu-slurm: made Slurm reservations %s again for booking %s", ", ".join(sorted(missing)),
                            b.id)
            except (ValueError, RuntimeError) as e:
                unheld[b.id] = str(e)
        self._listed = None
        return unheld

    async def reconcile(self, live: Sequence[Booking]) -> dict[str, str]:
        """Make this hub's reservations those of ``live`` (bookings not cancelled, with windows to come):
        remove the others, make the missing ones; booking id -> why it cannot be held (only those).
        RuntimeError: Slurm does not answer (nothing is decided)."""
        return await asyncio.to_thread(self._reconcile, live, time.time())
