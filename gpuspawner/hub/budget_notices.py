"""Running servers and notebook jobs whose user's GPU budget runs out: told it runs low, warned, then
stopped or allowed to finish (``gpu_budget_at_zero``, :mod:`gpuspawner.backends.budget_at_zero`).

Every :data:`PERIOD` seconds the hub looks at the users who hold GPUs now (the hub's ledger: every
backend's servers and jobs alike) and at their budgets (:mod:`gpuspawner.budgets`: what is left of each
budget that applies, and how fast the GPUs held now, the usage records not ended, spend it, weighted as
the budget weighs them). It reads them through the hub's budget keeper
(:class:`gpuspawner.backends.budgets.BudgetKeeper`), which calls its "runs low" listeners
(``keeper.on_low``: the off-browser notifications) when a user's budget crosses ``gpu_budget_low``:
so the hook is called while servers run, not only when someone spawns or reads the budgets. For
each user, :func:`stage` says where they stand:

- ``"low"``: a budget is at or under its low share; each of the user's servers gets a notice;
- ``"warn"``: at the GPUs held now, a budget runs out within ``gpu_budget_warn_before`` seconds:
  each server is warned when, and what happens then (stopped, or allowed to finish while new GPU
  servers meet the budget until it resets);
- ``"zero"``: a budget is spent. With ``gpu_budget_at_zero = "stop"`` the user's servers are stopped
  (the proxy's route, then the spawner, as JupyterHub's own stop) and their jobs cancelled, their usage
  records ending with the reason ``"budget"``; a server or job that took its GPUs after the budget was
  spent (admitted at the lowest priority with ``gpu_budget_exhausted = "queue-last"``) is told, not
  stopped. When it was spent is reckoned the first time the watcher sees it spent (also after a hub
  restart): what it is overspent, at the current pace, before then (:func:`spent_at`). With
  ``"finish"`` every server is told the budget is spent and runs on.

The notices go to the server's monitor (``POST {server}/api/gpus/notices``, which JupyterLab shows)
through :func:`gpuspawner.hub.judging.post_notice`, all under one id (:data:`NOTICE_ID`), so a later
one replaces an earlier one, never the culler's or a booking's; each stage has its own level
(:data:`LEVELS`). After a hub restart nothing is told twice: the first time the watcher sees a
server, it reads that server's notice board (which lives as long as the server) and takes the level
of the notice found there as what this start was already told. A job has no notice board: its user
hears of it through the low listeners' channels.

- :func:`stage` and the sentences (:data:`WORDS`) are pure;
- :class:`BudgetNotices` keeps what each start of each server was told, and acts;
- :class:`Readings` reads the budgets only when something may have changed;
- :func:`watch` starts it in a running hub.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from sqlalchemy import select

from ..owner import Owner, OwnerError
from ..state import hub_state_of_app, settings_for
from .booking_notices import _hhmm, _left, stop_server
from .judging import HubHTTP, post_notice

log = logging.getLogger("gpuspawner.budgets")

NOTICE_ID = "gpu-budget"
SOURCE = "gpu-budgets"
PERIOD = 5.0  # seconds between rounds: a server is stopped at most this late
REREAD = 60.0  # seconds: the budgets are read again at least this often (see :class:`Readings`)
END_REASON = "budget"
#: the stages, in order; a server is told each stage above what it was told already
RANK = {None: 0, "low": 1, "warn": 2, "zero": 3}
#: the level of each stage's notice (and, read back from a server's board, the stage it was told)
LEVELS = {"low": "info", "warn": "warning", "zero": "error"}
#: what new GPU servers meet while a budget is spent, by ``gpu_budget_exhausted``
NEW = {"refuse": "refused", "queue-last": "queued behind everyone with budget left"}

#: the sentences of this part, in one place
WORDS = {
    "low": "{name} runs low: {standing}.{at_rate}",
    "at_rate": " At the GPUs you hold now it runs out at {at} UTC.",
    "warn": "{name} runs out in {left}, at {at} UTC, at the GPUs you hold now: {standing}. {then}",
    "then_stop": "This server will be stopped then; save your work before.",
    "then_finish": "This server will be allowed to finish; new GPU servers will be {new} until {reset}.",
    "zero_finish": "{name} is spent: {standing}. This server is allowed to finish; new GPU servers will be "
                   "{new} until {reset}.",
    "zero_after": "{name} is spent: {standing}. This server took its GPUs after that and runs on; new GPU "
                  "servers will be {new} until {reset}.",
    "stopped": "stopping {owner}: {name} is spent ({standing})",
    "reset": "{at} UTC",
    "no_reset": "an administrator raises it",
}


@dataclass(frozen=True)
class Spend:
    """One budget of a user, as the watcher needs it (made from :mod:`gpuspawner.budgets`' standing)."""

    budget: str  # which one, stable across rounds: "user ann", "group students"
    name: str  # in words, a sentence's subject: "Your GPU budget", "The GPU budget of group students"
    standing: str  # what is left in words: "0.5 of 20 A100-hours left this week"
    left: float  # weighted GPU-hours left; 0 or less: spent
    reset: float | None  # when it is whole again (seconds since the epoch), None: never by itself
    burn: float  # weighted GPU-hours per hour that the GPUs held now spend of it
    low: bool  # at or under its low threshold


@dataclass(frozen=True)
class Holder:
    """A server or notebook job that holds GPUs now."""

    owner: str  # the ledger's key: user/server or user/job/<id>
    user: str
    server: str  # the server's name ("" for the default one); a job's id for a job
    since: float  # when this start took its GPUs
    is_job: bool = False
    url: str | None = None  # a server's own URL (its monitor), None while it is not up or for a job


@dataclass(frozen=True)
class Rule:
    """The hub's configuration for running servers: ``gpu_budget_at_zero``, ``gpu_budget_warn_before``,
    and what happens to new GPU servers while a budget is spent (words: "refused")."""

    at_zero: str = "stop"
    warn_before: float = 900.0
    new: str = "refused"


def runs_out(s: Spend, now: float) -> float:
    """When ``s`` is spent at the rate its GPUs spend it now (``now`` when it is; infinity at no rate)."""
    if s.left <= 0:
        return now
    return now + s.left / s.burn * 3600.0 if s.burn > 0 else math.inf


def spent_at(spends: Iterable[Spend], now: float) -> float:
    """When the first budget spent was spent, seen at ``now``: what it is overspent, at the pace its GPUs spend
    it now, before ``now`` (``now`` at no pace). A server that took its GPUs after this was admitted while
    the budget was spent; the estimate is early only if the pace fell since (a holder left)."""
    first = first_out(spends, now)
    if first is None or first.left > 0 or first.burn <= 0:
        return now
    return now + first.left / first.burn * 3600.0


def first_out(spends: Iterable[Spend], now: float) -> Spend | None:
    """The budget that runs out first (None without budgets)."""
    return min(spends, key=lambda s: (runs_out(s, now), s.left), default=None)


def stage(spends: Iterable[Spend], now: float, warn_before: float) -> str | None:
    """Where a user stands: ``"zero"`` (a budget is spent), ``"warn"`` (one runs out within ``warn_before``
    seconds at the current rate), ``"low"`` (one is under its low threshold), else None."""
    spends = list(spends)
    first = first_out(spends, now)
    if first is None:
        return None
    if first.left <= 0:
        return "zero"
    if warn_before > 0 and runs_out(first, now) - now <= warn_before:
        return "warn"
    return "low" if any(s.low for s in spends) else None


def _reset(s: Spend, now: float) -> str:
    return WORDS["reset"].format(at=_hhmm(s.reset, now)) if s.reset is not None else WORDS["no_reset"]


def notice(spends: Iterable[Spend], now: float, rule: Rule, what: str, after: bool = False) -> str:
    """The notice of stage ``what`` for a server (``after``: it took its GPUs after the budget was spent)."""
    spends = list(spends)
    first = first_out(spends, now)
    assert first is not None
    if what == "low":
        s = next((s for s in spends if s.low), first)
        at = runs_out(s, now)
        at_rate = WORDS["at_rate"].format(at=_hhmm(at, now)) if math.isfinite(at) else ""
        return WORDS["low"].format(name=s.name, standing=s.standing, at_rate=at_rate)
    if what == "warn":
        at = runs_out(first, now)
        then = (WORDS["then_stop"] if rule.at_zero == "stop"
                else WORDS["then_finish"].format(new=rule.new, reset=_reset(first, now)))
        return WORDS["warn"].format(name=first.name, left=_left(at - now), at=_hhmm(at, now), standing=first.standing,
                                    then=then)
    key = "zero_after" if after else "zero_finish"
    return WORDS[key].format(name=first.name, standing=first.standing, new=rule.new, reset=_reset(first, now))


Post = Callable[[Holder, str, str], Awaitable[bool]]  # posts (message, level) to a server: whether it took it
Board = Callable[[Holder], Awaitable["str | None"]]  # the level of this part's notice on a server's board
Stop = Callable[[Holder], Awaitable[None]]  # stops a server, cancels a job: its usage ends "budget"


class BudgetNotices:
    """What each start of each server was told, when each user's budget was seen spent; one :meth:`round`
    acts on it (see the module's words)."""

    def __init__(self, post: Post, board: Board, stop: Stop, clock: Callable[[], float] = time.time) -> None:
        self._post, self._board, self._stop, self._clock = post, board, stop, clock
        self._told: dict[tuple[str, float], int] = {}  # (owner, since) -> RANK of what it was told
        self._spent_since: dict[str, float] = {}  # user -> when a budget of theirs was spent (:func:`spent_at`)
        self._failed: set[tuple[str, float]] = set()  # the starts an action failed for: said once in the log

    async def round(self, holders: Iterable[Holder], spends: Mapping[str, list[Spend]], rule: Rule) -> None:
        """Act on ``holders`` (every server and job holding GPUs now), ``spends``: user -> their budgets."""
        now = self._clock()
        by_user: dict[str, list[Holder]] = {}
        for h in holders:
            by_user.setdefault(h.user, []).append(h)
        seen: set[tuple[str, float]] = set()
        for user, theirs in by_user.items():
            budgets = spends.get(user, [])
            where = stage(budgets, now, rule.warn_before)
            if where != "zero":
                self._spent_since.pop(user, None)
            spent_since = self._spent_since.setdefault(user, spent_at(budgets, now)) if where == "zero" else math.inf
            for h in theirs:
                seen.add((h.owner, h.since))
                try:
                    await self._act(h, budgets, where, now, rule, stop=h.since < spent_since)
                except Exception as e:  # one server that cannot be reached holds up no other
                    if (h.owner, h.since) not in self._failed:
                        self._failed.add((h.owner, h.since))
                        log.warning("%s: the budget watcher could not act on it (%s); trying again every round",
                                    h.owner, e)
        for key in set(self._told) - seen:  # that start is over
            del self._told[key]
        self._failed &= seen
        for user in set(self._spent_since) - set(by_user):
            del self._spent_since[user]

    async def _act(self, h: Holder, budgets: list[Spend], where: str | None, now: float, rule: Rule,
                   stop: bool) -> None:
        if where == "zero" and rule.at_zero == "stop" and stop:
            first = first_out(budgets, now)
            log.warning(WORDS["stopped"].format(owner=h.owner, name=first.name, standing=first.standing))
            await self._stop(h)
        elif not h.is_job:
            await self._tell(h, budgets, where, now, rule, after=where == "zero" and rule.at_zero == "stop")

    async def _tell(self, h: Holder, budgets: list[Spend], where: str | None, now: float, rule: Rule,
                    after: bool) -> None:
        if h.url is None:  # notices wait until the server is up
            return
        key = (h.owner, h.since)
        if key not in self._told:  # first seen (also after a hub restart): what its board already says
            level = await self._board(h)
            self._told[key] = next((RANK[s] for s, lv in LEVELS.items() if lv == level), 0)
        told = self._told[key] = min(self._told[key], RANK[where])  # whole again: tell again next time
        if where is not None and RANK[where] > told:
            if await self._post(h, notice(budgets, now, rule, where, after), LEVELS[where]):
                self._told[key] = RANK[where]


class Readings:
    """The budgets as last read, carried forward between reads at the pace the GPUs held spend them.

    Reading the standings costs a query of the usage rows in the longest budget's period and each
    user's budgets over them (``scripts/bench budget_watch``: about 25 ms of CPU for 10,000 rows and
    50 holders, 180 ms for 50,000 and 200), on the hub's event loop. Between two reads only the GPUs
    held change what is left, at the pace the read found, so a round reads again only when the holders
    changed, :data:`REREAD` seconds passed, or the carried figures put a user at another stage: every
    stage acted on (told, stopped) is a stage just read. ``read(users, now)``: user -> their budgets."""

    def __init__(self, read: Callable[[set[str], float], dict[str, list[Spend]]], every: float = REREAD) -> None:
        self._read, self._every = read, every
        self._at, self._key = -math.inf, None
        self._spends: dict[str, list[Spend]] = {}
        self._stages: dict[str, str | None] = {}

    def get(self, holders: Iterable[Holder], now: float, warn_before: float) -> dict[str, list[Spend]]:
        holders = list(holders)
        key = frozenset((h.owner, h.since) for h in holders)
        carried = {user: [replace(s, left=s.left - s.burn * (now - self._at) / 3600.0) for s in spends]
                   for user, spends in self._spends.items()}
        if (key != self._key or now - self._at >= self._every
                or any(stage(spends, now, warn_before) != self._stages.get(user) for user, spends in carried.items())):
            self._spends, self._at, self._key = self._read({h.user for h in holders}, now), now, key
            self._stages = {user: stage(spends, now, warn_before) for user, spends in self._spends.items()}
            return self._spends
        return carried


# ------------------------------------------------------------------ from the budgets' standing


def spends_of(standing, open_rows: Iterable, weights, low_share: float) -> list[Spend]:
    """The watcher's view of a user's :class:`~gpuspawner.budgets.Standing`: each budget line with the rate
    at which the GPUs held now (``open_rows``: the usage rows not ended) spend it, weighted as it weighs them."""
    from ..budgets import Standing, counted, weight  # the budgets' own rules: who counts, how much

    out = []
    for line in standing.lines:
        burn = sum(r.gpu_count * weight(r.model, weights) for r in open_rows if counted(line.scope, line.name, r))
        alone = Standing(standing.user, standing.unit, standing.now, (line,))
        reset = line.available_again if line.exhausted else (line.resets if line.spec.rolling else line.until)
        out.append(Spend(f"{line.scope} {line.name}",
                         "Your GPU budget" if line.scope == "user" else f"The GPU budget of group '{line.name}'",
                         alone.summary(), line.limit - line.used, reset, burn,
                         line.limit > 0 and line.left <= low_share * line.limit))
    return out


# ------------------------------------------------------------------ in a running hub


def holders_now(state, users: Mapping) -> list[Holder]:
    """Every server and notebook job that holds GPUs in the hub's ledger now (every backend's), with each
    ready server's URL (``users``: JupyterHub's users by name)."""
    found = []
    for owner in state.ledger.allocations():
        try:
            parsed = Owner.parse(owner)
        except OwnerError:
            continue
        since = state.ledger.since(owner) or 0.0
        if parsed.is_job:
            found.append(Holder(owner, parsed.user, parsed.job, since, is_job=True))
            continue
        try:
            spawner = users[parsed.user].spawners.get(parsed.server)
        except KeyError:
            spawner = None
        ready = spawner is not None and spawner.ready and spawner.server is not None
        found.append(Holder(owner, parsed.user, parsed.server, since, url=spawner.server.url if ready else None))
    return found


def rule_of(settings: dict, exhausted: str) -> Rule:
    """The hub's :class:`Rule` (``settings``: its tornado settings), as its spawner class reads the settings;
    ``exhausted``: ``gpu_budget_exhausted``."""
    from ..backends.budget_at_zero import GPUBudgetAtZeroMixin

    mine = settings_for(settings["config"], settings.get("spawner_class"), GPUBudgetAtZeroMixin)
    return Rule(mine.gpu_budget_at_zero, mine.gpu_budget_warn_before, NEW[exhausted])


def spends_now(settings: dict, policy, users: Iterable[str], now: float) -> dict[str, list[Spend]]:
    """Each of ``users``' budgets (``policy``: the hub's :class:`~gpuspawner.budgets.BudgetPolicy`) as the
    watcher sees them. Read through the hub's budget keeper, which tells its "runs low" listeners of each
    crossing (:mod:`gpuspawner.backends.budgets`)."""
    from ..backends.budgets import budget_keeper
    from ..usage import Allocation

    db = settings["db"]
    groups = {}
    for name in users:
        try:  # (JupyterHub's UserDict finds a name through [], not through get())
            groups[name] = [g.name for g in settings["users"][name].groups]
        except KeyError:
            groups[name] = []
    standings = budget_keeper(hub_state_of_app(settings)).standings(db, policy, groups, now)
    held = list(db.execute(select(Allocation).where(Allocation.ended.is_(None))).scalars())
    return {s.user: spends_of(s, held, policy.weights, policy.low) for s in standings}


def watch(settings: dict) -> BudgetNotices:
    """In a running hub (``settings``: its tornado settings): tell, warn and stop (or let finish) the servers
    and jobs of users whose budgets run out, every :data:`PERIOD` seconds."""
    from .budgets import budget_policy, budget_settings
    from .handlers import SETTINGS_KEY
    from .jobs import job_manager

    state = hub_state_of_app(settings)
    call = HubHTTP((settings.get(SETTINGS_KEY) or {}).get("token", ""))  # the overview's: access:servers
    refused: set[tuple] = set()  # the starts whose server did not take a notice: said once in the log

    async def post(h: Holder, message: str, level: str) -> bool:
        code = await post_notice(call, h.url.rstrip("/"), message, source=SOURCE, notice_id=NOTICE_ID, level=level)
        if not 200 <= code < 300 and (h.owner, h.since) not in refused:
            refused.add((h.owner, h.since))
            log.warning("%s: its server did not take the budget notice (HTTP %s; no GPU monitor?); "
                        "trying again every %g s", h.owner, code, PERIOD)
        return 200 <= code < 300

    async def board(h: Holder) -> str | None:
        code, body = await call("GET", f"{h.url.rstrip('/')}/api/gpus/notices")
        found = body.get("notices", []) if code == 200 and isinstance(body, dict) else []
        return next((n.get("level") for n in found if isinstance(n, dict) and n.get("id") == NOTICE_ID), None)

    async def stop(h: Holder) -> None:
        if not h.is_job:
            await stop_server(settings, h, END_REASON)
            return
        jobs = job_manager(settings)
        record = jobs.get(h.server)
        if record is not None:
            await jobs.cancel(record, wait=0, reason=END_REASON)

    notices = state.cache(BudgetNotices, lambda: BudgetNotices(post, board, stop))
    policy = budget_policy(settings)  # the configuration, read once
    rule = rule_of(settings, policy.exhausted)

    readings = Readings(lambda users, now: spends_now(settings, policy, users, now),
                        every=budget_settings(settings).gpu_budget_check_interval)

    async def round_() -> None:
        holders = holders_now(state, settings["users"])
        if holders:
            await notices.round(holders, readings.get(holders, time.time(), rule.warn_before), rule)

    if policy.enabled:  # no budget configured: nothing to watch
        state.every("budget-notices", PERIOD, round_)
    return notices
