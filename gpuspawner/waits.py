"""The hub's wait estimates: what :mod:`gpuspawner.estimate` is given for a request in the hub's queue.

:class:`WaitHistory` (one per hub, ``state.cache(WaitHistory, ...)``, see :func:`wait_history`)
holds the lengths of ended sessions: read once from the usage table (``gpuspawner_allocations``,
the newest :data:`HISTORY_ROWS` closed rows) the first time an estimate needs them, then kept up
to date from the ledger's releases, never read again per estimate. A session's "profile" there is
its kind and GPU model (``server/a100-sxm4-80gb``): the usage table records those, not the spawn
form's profile. The same reading feeds fair-share queueing: each user's recent GPU use
(:meth:`WaitHistory.recent_use`, :mod:`gpuspawner.fairshare`), kept up to date by the same releases.

:func:`queue_estimate` estimates a waiting request from the ledger's holders of the GPUs it could
use (each holder's latest end: a notebook job's start + the hub's ``gpu_job_time_limit``; a server whose
GPUs the culler reported idle, when the culler stops it: idle since + ``gpu_culler_idle_timeout``), the
requests ahead of it in the queue (each gives up at its join + the queue's limit) and the history.
The queue calls it when a request joins, whenever the queue is woken (a release, a leave) and at
each recheck; the REST API, the progress page and the job list read the waiter's last estimate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import select

from .estimate import WORDS, Ask, Estimate, History, Holding, for_gpus, latest_end
from .fairshare import RecentUse
from .gpu import GPU, model_slug, per_gpus
from .owner import Owner, OwnerError
from .queue import GPUQueue, Waiter, _Wanted
from .usage import Allocation

if TYPE_CHECKING:
    from .state import HubState

__all__ = ["HISTORY_ROWS", "Ended", "WaitHistory", "if_queued_now", "queue_estimate", "session_key", "wait_history"]

#: the newest closed usage rows read into the history at the first estimate
HISTORY_ROWS = 20000


def session_key(kind: str, model: str) -> str:
    """The history's "profile" of a session: its kind (server or job) and GPU model slug."""
    return f"{kind}/{model}" if model else kind


class Ended(NamedTuple):
    """One ended holding as the history keeps it: its "profile" (:func:`session_key`), user and length
    (seconds); for fair share also its GPU count, model slug and end (seconds since the epoch; None: unknown)."""

    profile: str
    user: str
    seconds: float
    gpus: int = 1
    model: str = ""
    ended: float | None = None


class WaitHistory:
    """Lengths of ended GPU sessions on this hub: the usage table once, then each release as it happens."""

    def __init__(self, read: Callable[[], list[tuple] | None],
                 model_of: Callable[[str], str], clock: Callable[[], float] = time.time) -> None:
        self._read, self._model_of, self._clock = read, model_of, clock  # read: rows of :class:`Ended`'s fields
        self.history = History(())
        self.loaded = False
        self.ended: list[Ended] = []
        self._recent: dict[float, RecentUse] = {}  # half-life -> each user's recent use
        #: owner -> since when all its GPUs have stayed below the culler's threshold (the samples it reported)
        self.idle_since: dict[str, float] = {}

    def current(self) -> History:
        """The history, reading the usage table the first time it can (once the hub's database is there)."""
        if not self.loaded:
            rows = self._read()
            if rows is not None:
                self.ended = [Ended(*row) for row in rows]
                self.history = History(row[:3] for row in self.ended)
                self.loaded = True
        return self.history

    def recent_use(self, half_life: float) -> RecentUse:
        """Each user's recent GPU use from the ended holdings, decayed with ``half_life`` (seconds): made
        from the history's reading the first time, then told of each release."""
        self.current()
        found = self._recent.get(half_life)
        if found is None:
            found = RecentUse(half_life)
            if self.loaded:  # else nothing is known yet, and nothing kept
                self._recent[half_life] = found
            for row in self.ended:
                if row.ended is not None:
                    found.add(row.user, row.gpus, row.model, row.ended - row.seconds, row.ended)
        return found

    def samples(self, owner: str, samples: list[tuple[float, float | None]], threshold: float) -> None:
        """The culler's samples of ``owner``'s GPUs (time, highest utilisation %): idle since the first
        of the latest run below ``threshold``; a busy or unknown sample ends the run (the culler's rule)."""
        for at, utilization in sorted(samples, key=lambda s: s[0]):
            if utilization is None or utilization >= threshold:
                self.idle_since.pop(owner, None)
            else:
                self.idle_since.setdefault(owner, at)

    def observe(self, event: str, owner: str, uuids: tuple[str, ...], since: float) -> None:
        """The ledger's observer: a release closes a session (the usage table's row) of this length."""
        if event == "release":
            self.idle_since.pop(owner, None)
        if event != "release" or not self.loaded:
            return  # before the table is read, the release is read with it
        try:
            kind, user = (parsed := Owner.parse(owner)).kind, parsed.user
        except OwnerError:
            return
        model = self._model_of(uuids[0]) if uuids else ""
        now = self._clock()
        row = Ended(session_key(kind, model), user, max(0.0, now - since), len(uuids), model, now)
        self.ended.append(row)
        self.history.add(row.profile, user, row.seconds)
        for recent in self._recent.values():
            recent.add(user, row.gpus, model, now - row.seconds, now)


def _read_rows(state: HubState) -> list[Ended] | None:
    session = state.usage.session
    if session is None:
        return None
    query = (select(Allocation.kind, Allocation.model, Allocation.user, Allocation.started, Allocation.ended,
                    Allocation.gpu_count)
             .where(Allocation.ended.isnot(None)).order_by(Allocation.id.desc()).limit(HISTORY_ROWS))
    return [Ended(session_key(kind, model), user, max(0.0, ended - started), count, model, ended)
            for kind, model, user, started, ended, count in session.execute(query)]


def wait_history(state: HubState) -> WaitHistory:
    """This hub's :class:`WaitHistory`, made (and told of the ledger's releases) on first use."""
    def make() -> WaitHistory:
        found = WaitHistory(lambda: _read_rows(state), lambda uuid: state.gpu_info(uuid)["model"])
        state.ledger.observe(found.observe)
        return found

    return state.cache(WaitHistory, make)


def _ask_key(kind: str, slugs: frozenset[str]) -> str:
    return session_key(kind, next(iter(slugs)) if len(slugs) == 1 else "")


def queue_estimate(
    waiter: Waiter, gpus: tuple[GPU, ...], queue: GPUQueue, allocations: Mapping[str, tuple[str, ...]],
    since: Callable[[str], float | None], history: WaitHistory, *, job_time_limit: float | None,
    queue_timeout: float, quota: int | None = None, idle_timeout: float | None = None, now: float | None = None,
    backfill: str = "off",
) -> Estimate:
    """``waiter``'s estimate from the ledger's ``allocations`` (owner -> GPU UUIDs), when each holding
    began (``since``), the requests ahead of it in ``queue`` and the ``history``; a holder idle since
    some time (``history.idle_since``) ends by then + ``idle_timeout`` (the culler's stop) at the latest;
    the requests start as the queue's ``backfill`` rule (``gpu_queue_backfill``) lets them."""
    now = time.time() if now is None else now
    wanted = _Wanted(gpus)
    ahead_of = queue.ahead(waiter.models, gpus, before=waiter)
    if quota is None:  # only the GPUs these requests could use matter (with a quota, the user's others too)
        gpus = _of_models(gpus, frozenset().union(*(wanted(w.models) for w in (*ahead_of, waiter))))
    by_uuid = {g.uuid: g for g in gpus}
    holders, holdings = {}, {}
    for owner, uuids in allocations.items():
        mine = [by_uuid[u] for u in uuids if u in by_uuid]
        if not mine:
            continue  # cluster tokens, or GPUs gone from the inventory
        for g in mine:
            holders[g.uuid] = owner
        try:
            parsed = Owner.parse(owner)
        except OwnerError:
            continue  # counts as just started
        start = since(owner)
        start = now if start is None else start
        idle = None if parsed.is_job else history.idle_since.get(owner)  # the culler never stops a job
        latest, bound = latest_end(start, job_time_limit if parsed.is_job else None, "job", idle, idle_timeout)
        holdings[owner] = Holding(start, parsed.user, session_key(parsed.kind, mine[0].model), latest, bound)
    ahead = [Ask(w.owner, w.count, w.user, _ask_key(_kind(w.owner), wanted(w.models)), w.joined + queue_timeout,
                 models=w.models) for w in ahead_of]
    ask = Ask(waiter.owner, waiter.count, waiter.user, _ask_key(_kind(waiter.owner), wanted(waiter.models)),
              models=waiter.models)
    return for_gpus(ask, now, gpus, holders, holdings, ahead, history.current(), quota=quota, backfill=backfill)


def _of_models(gpus: tuple[GPU, ...], slugs: frozenset[str]) -> tuple[GPU, ...]:
    """The GPUs of ``gpus`` whose model is one of ``slugs``, worked out once per inventory reading
    (:func:`gpuspawner.gpu.per_gpus`, the one memo of what is derived from a reading)."""
    def pick(every) -> tuple[GPU, ...]:
        every = tuple(every)
        names = {name for name in {g.name for g in every} if model_slug(name) in slugs}
        return tuple(g for g in every if g.name in names)

    return per_gpus(gpus, ("of_models", slugs), pick)


def if_queued_now(estimate: Estimate, now: float | None = None) -> str:
    """What a ``queue: true`` profile's card says: "If you queue now: about 10:40 UTC, likely between ..."."""
    when = estimate.when(now)
    return WORDS["if_queued"].format(when=when[:1].lower() + when[1:], basis=estimate.basis)


def _kind(owner: str) -> str:
    try:
        return Owner.parse(owner).kind
    except OwnerError:
        return "server"

