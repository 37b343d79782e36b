"""Operating policies every backend shares: group-only profiles, quotas, the queue, metrics.

:class:`GPUPolicyMixin` is a parent of ``GPUSpawnerMixin``, so its traits are
configured as ``c.GPUSpawnerMixin.gpu_quota_per_user`` etc. The mixin's
``claim`` (where the hub places) calls :meth:`GPUPolicyMixin.place_request` (quota
check and reservation as one step under the ledger's lock; waiting in the hub's
queue for ``queue: true`` profiles), and :meth:`gpu_released` runs after GPUs are
given back. The ``claim`` of backends whose cluster places the GPUs (gpu-kube,
gpu-slurm) calls :meth:`GPUPolicyMixin.claim_cluster_gpus` instead: the same quota
check, under the same lock, recording counts rather than exact GPUs; gpu-kube's
``queue: true`` profiles wait through :meth:`GPUPolicyMixin.wait_in_queue` as well.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from traitlets import Dict, Float, Int, TraitError, Unicode, validate
from traitlets.config import Configurable

from ..bookings import Verdict, kept, verdicts
from ..db import BookingStore
from ..gpu import GPU
from ..inventory import InventoryReading
from ..owner import Owner, OwnerError
from ..placement import GPURequest, PlacementError, never_fits
from ..profiles import Choice, Profile
from ..queue import BACKFILL, Known, Waiter, known_for, queue_alternatives
from ..quota import Quota, QuotaError, check
from ..refusals import WAITABLE, Refusal, refuse, words
from ..waits import if_queued_now, queue_estimate, wait_history
from .errors import user_error

T = TypeVar("T")
_log = logging.getLogger("gpuspawner.waits")


class GPUPolicyMixin(Configurable):
    """Quotas, the queue and group-only profiles (see the README's "Operating GPUs")."""

    gpu_quota_per_user = Int(
        None, allow_none=True,
        help="""At most this many GPUs held by all servers and notebook GPU jobs of one user together
        (None: no limit).
        On gpu-kube a server's GPUs are the GPU resources its pod asks for (a MIG slice or a
        time-sliced replica counts as one).""",
    ).tag(config=True)

    gpu_quota_per_group = Dict(
        Int(), help="""At most this many GPUs held by all servers and notebook GPU jobs of all members of a
        JupyterHub group together,
        e.g. ``{"students": 8}``. A user in several limited groups must fit in each.""",
    ).tag(config=True)

    gpu_queue_timeout = Float(
        600.0,
        help="""Seconds a spawn of a ``queue: true`` profile waits in the hub's queue for free GPUs
        before it is refused (HTTP 409, "No GPU became free within ..."); such a spawn's JupyterHub
        ``start_timeout`` grows by this much, so JupyterHub does not give up first. A finite
        number above 0.""",
    ).tag(config=True)

    gpu_queue_recheck = Float(
        5.0, help="""Seconds between re-checks of a waiting spawn when nothing was released meanwhile
        (a release anywhere in the hub wakes the queue at once). A finite number above 0."""
    ).tag(config=True)

    gpu_culler_idle_timeout = Float(
        None, allow_none=True,
        help="""Seconds the GPU idle culler lets a server's GPUs stay idle before it stops the server
        (its ``--idle-timeout``; ``configure(c, culler=...)`` in :mod:`gpuspawner.hub.setup` sets it).
        Wait estimates then count a holder whose GPUs are idle (by the samples the culler reports) as
        ending by the time it is stopped. None: no such end is assumed. A finite number above 0.""",
    ).tag(config=True)

    @validate("gpu_culler_idle_timeout")
    def _check_culler_idle_timeout(self, proposal):
        if proposal["value"] is not None and not 0 < proposal["value"] < float("inf"):
            raise TraitError(f"gpu_culler_idle_timeout must be a finite number of seconds > 0 or None, "
                             f"not {proposal['value']}")
        return proposal["value"]

    gpu_queue_backfill = Unicode(
        "off",
        help="""How a queued spawn behind others for the same GPU models may start (where the hub
        knows which GPUs are held: gpu-local, gpu-docker, gpu-swarm; on gpu-kube the order is
        always strict). ``"off"``: only with no spawn ahead of it for the same models (strict
        order). ``"first-fit"``: whichever waiting spawn fits the free GPUs now starts, in queue
        order among those that fit, so one that cannot fit yet (4 GPUs on one host while the free
        ones are spread) holds nobody back. ``"nearest-host"``: a spawn behind others starts only
        outside the hosts each spawn ahead of it is nearest to fitting (the most free GPUs of a
        model it takes), so a large spawn ahead keeps the host it waits for. In the replay of the
        documented day first fit cuts the waits over 20 minutes from 20 % to 9 % of the spawns
        served (README, "Choosing settings with the replay"); but the wait estimate assumes strict
        order and is much less accurate with either backfill. Any other value is refused at hub
        start.""",
    ).tag(config=True)

    @validate("gpu_queue_backfill")
    def _check_backfill(self, proposal):
        if proposal["value"] not in BACKFILL:
            raise TraitError(f"gpu_queue_backfill must be 'off', 'first-fit' or 'nearest-host', "
                             f"not {proposal['value']!r}")
        return proposal["value"]

    gpu_booking_warn_before = Float(
        600.0, help="""Seconds before a booking's window starts that a server admitted only until then (it took
        booked GPUs before the window) is warned again, by a notice JupyterLab shows, that it will be stopped
        when the window starts; it was told so at its start (progress message and notice). ``0``: no second
        warning. A finite number, 0 or more.""",
    ).tag(config=True)

    @validate("gpu_booking_warn_before")
    def _check_warn_before(self, proposal):
        if not 0 <= proposal["value"] < float("inf"):
            raise TraitError(f"gpu_booking_warn_before must be a finite number of seconds >= 0, "
                             f"not {proposal['value']}")
        return proposal["value"]

    @validate("gpu_quota_per_user")
    def _check_user_quota(self, proposal):
        if proposal["value"] is not None and proposal["value"] < 0:
            raise TraitError(f"gpu_quota_per_user must be >= 0 or None, not {proposal['value']}")
        return proposal["value"]

    @validate("gpu_quota_per_group")
    def _check_group_quota(self, proposal):
        bad = {g: n for g, n in proposal["value"].items() if n < 0}
        if bad:
            raise TraitError(f"gpu_quota_per_group limits must be >= 0: {bad}")
        return proposal["value"]

    @validate("gpu_queue_timeout", "gpu_queue_recheck")
    def _check_positive(self, proposal):
        if not 0 < proposal["value"] < float("inf"):
            raise TraitError(f"{proposal['trait'].name} must be a finite number of seconds > 0, "
                             f"not {proposal['value']}")
        return proposal["value"]

    # ------------------------------------------------------------ groups and profiles

    def user_group_names(self) -> set[str]:
        """The JupyterHub groups of this server's user (none when there is no hub user)."""
        return {getattr(g, "name", g) for g in _groups_of(getattr(self, "user", None))}

    def visible_profiles(self, profiles: tuple[Profile, ...]) -> tuple[Profile, ...]:
        """The profiles this user may see: without ``groups``, or sharing one of the user's groups."""
        groups = self.user_group_names()
        return tuple(p for p in profiles if p.visible_to(groups))

    def profiles_for_options(self, options: Any) -> tuple[Profile, ...]:
        """The profiles ``options`` are checked against; 403 when they name a profile of other groups."""
        every = self.all_profiles()
        visible = self.visible_profiles(every)
        slug = options.get("profile") if isinstance(options, Mapping) else None
        hidden = {p.slug: p for p in every if p not in visible}
        if isinstance(slug, str) and slug in hidden:
            groups = ", ".join(f"'{g}'" for g in hidden[slug].groups)
            raise user_error(403, f"profile: '{slug}' is only for members of the group(s) {groups}, "
                             "and you are not a member of any of them")
        if not visible:
            raise user_error(403, "profile: no profile is available to you; ask an administrator to add you to a group")
        return visible

    def apply_queue_policy(self, choice: Choice) -> None:
        """A queued spawn may wait ``gpu_queue_timeout`` on top of JupyterHub's ``start_timeout``."""
        base = getattr(self, "_gpu_base_start_timeout", None)
        if base is None:
            base = self._gpu_base_start_timeout = getattr(self, "start_timeout", 60)
        if hasattr(self, "start_timeout"):
            wait = self.gpu_queue_timeout if choice.profile.queue and choice.gpus else 0
            self.start_timeout = int(base + wait)

    # ------------------------------------------------------------ quotas

    def gpu_quota(self) -> Quota:
        """The limits that apply to this user now."""
        user = getattr(self, "user", None)
        name = getattr(user, "name", "")
        limited = {}
        members = {}
        for group in _groups_of(user):
            gname = getattr(group, "name", group)
            if gname in self.gpu_quota_per_group:
                limited[gname] = self.gpu_quota_per_group[gname]
                members[gname] = frozenset(u.name for u in getattr(group, "users", []))
        return Quota(name, self.gpu_quota_per_user, limited, members)

    # ------------------------------------------------------------ placing

    async def place_request(self, reading: InventoryReading, request: GPURequest, choice: Choice) -> tuple[GPU, ...]:
        """Reserve GPUs within the quotas; wait in the hub's queue for ``queue: true`` profiles."""
        state = self.hub_state
        ledger, inventory, metrics = state.ledger, state.inventory, state.metrics
        quota = self.gpu_quota()
        started = time.monotonic()

        def place(gpus: tuple[GPU, ...]) -> tuple[GPU, ...]:
            said = self.booking_verdicts(request, gpus)
            blocked = [v for v in said.values() if not v.ok]
            try:
                chosen = ledger.reserve(tuple(g for g in gpus if said.get(g.model, _OK).ok), request,
                                        admit=lambda held: check(quota, request.count, held, request.owner,
                                                                 self.queued_gpus(request.owner)))
            except PlacementError as e:
                if blocked and not isinstance(e, QuotaError) and e.code not in WAITABLE:  # booked GPUs would serve it
                    raise refuse("booked", {"sentence": blocked[0].message}, requested=request.count,
                                 models=request.models) from e
                raise
            self.note_verdict(said.get(chosen[0].model) if chosen else None)
            return chosen

        try:
            if request.count and self.within_booking(request, reading.gpus):
                chosen = place(reading.gpus)  # a booking's own users never queue for its GPUs
            elif request.count and choice.profile.queue:
                refusal = never_fits(reading.gpus, request)
                if refusal is not None:  # no wait can cure it: refused at once, never queued
                    raise refusal

                async def read() -> tuple[GPU, ...]:
                    return (await inventory.read()).gpus

                chosen = await self.wait_in_queue(request, choice.profile.slug, read, place, held=ledger.held)
            else:
                self.refuse_queue_jumping(request, reading.gpus)
                chosen = place(reading.gpus)
        except PlacementError as e:
            metrics.refused(e.code, time.monotonic() - started)
            raise
        if request.count:
            metrics.placed(time.monotonic() - started)
        return chosen

    def hold_exactly(self, gpus: tuple[GPU, ...]) -> tuple[GPU, ...]:
        """Hold exactly ``gpus`` for this server, within the quotas (a container restarted as it was made).

        Raises :class:`~gpuspawner.placement.PlacementError` when another server holds one
        of them (a :class:`~gpuspawner.quota.QuotaError` over a quota); nothing is held then.
        """
        request = GPURequest(owner=self.gpu_owner, count=len(gpus))
        quota = self.gpu_quota()
        return self.ledger.reserve(gpus, request, admit=lambda held: check(
            quota, request.count, held, request.owner, self.queued_gpus(request.owner)))

    def refuse_queue_jumping(self, request: GPURequest, gpus: tuple[GPU, ...]) -> None:
        """A request of a profile without ``queue`` never goes ahead of queued requests for the same models."""
        waiting = self.hub_state.queue.ahead(request.models, gpus) if request.count else []
        if waiting:
            users = len({w.user for w in waiting})
            raise refuse("queued_ahead", {"waiting": len(waiting), "users": users},
                         requested=request.count, models=request.models)

    async def wait_in_queue(
        self,
        request: GPURequest,
        profile: str,
        read: Callable[[], Awaitable[tuple[GPU, ...]]],
        place: Callable[[tuple[GPU, ...]], T],
        known: Callable[[Waiter, tuple[GPU, ...]], Known] | None = None,
        held: Callable[[], Collection[str]] | None = None,
    ) -> T:
        """Wait in the hub's queue until ``place`` succeeds (``queue: true`` profiles), progress in words.

        ``known``: what the progress says about the GPUs waited for (:meth:`queue_known`, the
        ledger's, unless the backend counts them otherwise). ``held``: the GPUs given out, where the
        hub places (then a request behind others may backfill: :meth:`GPUQueue.room`); ``place``
        must then place on the GPUs it is given.

        The quota is checked first, counting what this user's and group's queued requests
        ask for, so a request that could never be admitted is refused at once.
        """
        queue = self.hub_state.queue
        quota = self.gpu_quota()
        check(quota, request.count, self.ledger.allocations(), request.owner, self.queued_gpus(request.owner))
        last = getattr(self, "gpu_budget_last", False)  # a spent GPU-hour budget, "queue-last" (backends/budgets.py)
        waiter = queue.join(request.owner, quota.user, request.count, request.models, profile, last)

        def report(position: int, text: str) -> None:
            self.gpu_event(text, 20)

        return await queue.serve(waiter, read, place, self.gpu_queue_timeout, report, recheck=self.gpu_queue_recheck,
                                 known=known or self.queue_known, held=held, backfill=self.gpu_queue_backfill)

    def queue_known(self, waiter: Waiter, gpus: tuple[GPU, ...]) -> Known:
        """What the queue tells a waiting request about its GPUs (the hub's own, held in the ledger):
        how many are held, the earliest a notebook job holding one reaches its time limit, and the
        request's wait estimate (:func:`gpuspawner.waits.queue_estimate`)."""
        ledger = self.ledger
        allocations = ledger.allocations()
        holders = {uuid: owner for owner, uuids in allocations.items() for uuid in uuids}
        limits = {}
        for owner in set(holders.values()):
            since = ledger.since(owner)
            if since is not None and _is_job(owner):
                limits[owner] = since + self.gpu_job_time_limit
        known = known_for(waiter, gpus, holders, limits)
        state = self.hub_state
        try:
            estimate = queue_estimate(waiter, gpus, state.queue, allocations, ledger.since,
                                      wait_history(state), job_time_limit=self.gpu_job_time_limit,
                                      queue_timeout=self.gpu_queue_timeout, quota=self.gpu_quota_per_user,
                                      idle_timeout=self.gpu_culler_idle_timeout,
                                      backfill=self.gpu_queue_backfill)
        except Exception:  # an estimate must never break a wait: the queue's own words then
            _log.exception("wait estimate for %s failed", waiter.owner)
            return known
        return replace(known, estimate=estimate)

    def queue_form_estimates(self, profiles: tuple[Profile, ...], gpus: tuple[GPU, ...],
                             held: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, str]:
        """Profile slug -> when a request of each ``queue: true`` profile (its default count, any of its models)
        would likely start if this user queued it now, behind everyone (``held``: who holds ``gpus`` where the
        cluster places, in strict order; default: the ledger's); one per profile per form, none on failure."""
        backfill = self.gpu_queue_backfill if held is None else "off"
        found, held = {}, self.ledger.allocations() if held is None else held
        state = self.hub_state
        for profile in profiles:
            count = profile.default_gpus or min((n for n in profile.gpu_counts if n), default=0)
            if not profile.queue or not count:
                continue
            waiter = Waiter(self.gpu_owner, self.gpu_quota().user, count, tuple(profile.gpu_models), 0, -1,
                            profile.slug)
            try:
                estimate = queue_estimate(waiter, gpus, state.queue, held, self.ledger.since,
                                          wait_history(state), job_time_limit=self.gpu_job_time_limit,
                                          queue_timeout=self.gpu_queue_timeout, quota=self.gpu_quota_per_user,
                                          idle_timeout=self.gpu_culler_idle_timeout, backfill=backfill)
            except Exception:
                _log.exception("wait estimate for the form of %s failed", self.gpu_owner)
                continue
            found[profile.slug] = if_queued_now(estimate)
        return found

    async def queue_pointer(self, choice: Choice, refusal: PlacementError) -> str:
        """The words that point a refused user to a profile that would wait in the queue for what they
        asked (``' Pick "GPU, queued" to wait in the queue instead.'``), where this user may pick one
        and it could ever be served here; ``""`` otherwise, or where a wait would not cure ``refusal``."""
        if choice.profile.queue or refusal.code not in WAITABLE | {Refusal.QUEUED_AHEAD}:
            return ""
        for other in queue_alternatives(self.profiles, choice):
            if await self.never_fits(other) is None:
                return words("queue_instead", profile=other.profile.display_name)
        return ""

    def queued_gpus(self, owner: str) -> dict[str, int]:
        """user -> GPUs asked for by their spawns waiting in the hub's queue, ``owner``'s own left out.

        Quotas count them beside what is held, in every check (a server, a job, a queued
        spawn when it is served), so a user never holds and waits for more than the quota.
        """
        waiting: dict[str, int] = {}
        for w in self.hub_state.queue.waiters():
            if w.owner != owner:
                waiting[w.user] = waiting.get(w.user, 0) + w.count
        return waiting

    def claim_cluster_gpus(
        self, request: GPURequest, holdings: Mapping[str, int], refusal: PlacementError | None = None,
    ) -> tuple[str, ...]:
        """Hold ``holdings`` (cluster resource -> count) for ``request.owner`` within the quotas.

        For a backend whose scheduler picks the exact GPUs: the quota check and
        the record are one step under the ledger's lock, so concurrent spawns
        never exceed a quota. ``refusal`` (the cluster has no room) is raised
        after the quota check, so an over-quota request is told about its
        quota first, as on the other backends. Raises
        :class:`~gpuspawner.placement.PlacementError` (a
        :class:`~gpuspawner.quota.QuotaError` for quotas), counted in the metrics.
        """
        state = self.hub_state
        quota = self.gpu_quota()
        started = time.monotonic()

        def admit(held: Mapping[str, tuple[str, ...]]) -> None:
            check(quota, request.count, held, request.owner, self.queued_gpus(request.owner))
            if refusal is not None:
                raise refusal

        try:
            if request.count:
                tokens = state.ledger.claim(request.owner, holdings, admit=admit)
            else:
                tokens = ()
        except PlacementError as e:
            state.metrics.refused(e.code, time.monotonic() - started)
            raise
        if request.count:
            state.metrics.placed(time.monotonic() - started)
        return tokens

    def gpu_released(self, uuids: tuple[str, ...]) -> None:
        """GPUs were given back: wake the queue; a server admitted until a booked window is no longer bound."""
        store = self.hub_state.cached(BookingStore)
        if store is not None:
            store.forget(getattr(self, "gpu_owner", ""))
        if uuids:
            self.hub_state.queue.wake()

    # ------------------------------------------------------------ bookings (gpuspawner.bookings)

    #: a notebook job's own ``time_limit`` (None: the hub's), set by the job manager: bookings judge a job by it
    gpu_job_own_limit: float | None = None

    def job_time_limit(self) -> float:
        """How long this spawner's notebook job may run: its own limit, never more than the hub's."""
        return min(self.gpu_job_own_limit or math.inf, self.gpu_job_time_limit)

    def booking_verdicts(self, request: GPURequest, gpus: tuple[GPU, ...]) -> dict[str, Verdict]:
        """Model slug -> what the hub's bookings say about ``request`` taking GPUs of that model now
        (:func:`gpuspawner.bookings.verdicts`), for the models it asks for; ``{}`` where nothing is booked."""
        model_of = {g.uuid: g.model for g in gpus}
        capacity = Counter(model_of.values())
        return self.judge_bookings(request, capacity, lambda _owner, keys: [model_of[k] for k in keys if k in model_of])

    def judge_bookings(self, request: GPURequest, capacity: Mapping[str, int],
                       models_held: Callable[[str, tuple], list[str]], free: bool = False) -> dict[str, Verdict]:
        """:meth:`booking_verdicts` on GPUs per model ``capacity``; ``models_held(owner, its ledger keys)``: the
        model of each GPU a holder holds. ``free``: ``capacity`` counts the GPUs free now (the cluster places,
        others use it too), and the hub's GPUs a window gives back (held inside their own booking, or
        told to leave by it) count as free then."""
        store = self.hub_state.cached(BookingStore)
        bookings = [b for b in store.all() if b.state != "cancelled"] if store is not None else []
        if not bookings or not request.count:
            return {}
        now, job = time.time(), _is_job(request.owner)
        members = _group_members(getattr(self, "db", None), {b.group for b in bookings if b.group})
        holders, back = [], Counter()
        for owner, uuids in self.ledger.allocations().items():
            models = models_held(owner, uuids)
            if store.admitted.get(owner, (0.0,))[0] <= now:  # those told to leave by a window keep nothing through it
                user = _owner_user(owner)
                holders += [(user, {g for g, users in members.items() if user in users}, m) for m in models]
            back.update(models)
        held = kept(bookings, holders, now)
        if free:
            capacity, held = {m: n + back.get(m, 0) - held.get(m, 0) for m, n in capacity.items()}, {}
        return verdicts(bookings, capacity, _owner_user(request.owner), self.user_group_names(), request.models,
                        request.count, now, now + self.job_time_limit() if job else None, held, job)

    def within_booking(self, request: GPURequest, gpus: tuple[GPU, ...]) -> bool:
        """Whether ``request`` is its user's own booking's, on now (served without queueing)."""
        return any(v.kind == "ok" and v.booking is not None for v in self.booking_verdicts(request, gpus).values())

    def note_verdict(self, verdict: Verdict | None) -> None:
        """Tell a server admitted until a booked window (progress message; ``verdict``: the rule's on the
        model taken), and keep ``until`` for the hub."""
        if verdict is None or verdict.kind != "until":
            return
        self.hub_state.cache(BookingStore).admit(self.gpu_owner, verdict.until, verdict.booking.id)
        self.gpu_booking_until = verdict.until
        self.gpu_event(verdict.message, 40)


def _groups_of(user: Any) -> list:
    """``user.groups`` as a list: none without a user or a list of groups (KubeSpawner's own tests spawn
    for a ``unittest.mock.Mock`` user, whose ``groups`` is a Mock, never read by KubeSpawner)."""
    groups = getattr(user, "groups", None)
    try:
        return list(groups or ())
    except TypeError:
        return []


def _is_job(owner: str) -> bool:
    """Whether the ledger's ``owner`` is a notebook job (which has a time limit); servers have none."""
    try:
        return Owner.parse(owner).is_job
    except OwnerError:
        return False


_OK = Verdict("ok")


def _owner_user(owner: str) -> str:
    try:
        return Owner.parse(owner).user
    except OwnerError:
        return owner.split("/", 1)[0]


def _group_members(db: Any, groups: set[str]) -> dict[str, set[str]]:
    """group -> its users' names, from the hub's database (none without one)."""
    if db is None or not groups:
        return {}
    from jupyterhub import orm

    found = {}
    for name in groups:
        group = orm.Group.find(db, name)
        if group is not None:
            found[name] = {u.name for u in group.users}
    return found
