"""What users do with a long wait estimate, in the replay (``python -m gpuspawner.replay --choices``).

The hub shows each ``queue: true`` profile's estimate on the spawn form ("If you queue now: about
10:40 UTC ...", :func:`gpuspawner.waits.if_queued_now`), and a refused spawn's pointer names the
queued profiles that would serve it. Here a user about to queue looks at those estimates first,
made by the same :func:`~gpuspawner.estimate.for_gpus` the hub calls (:func:`~gpuspawner.replay.estimates.estimator`,
from a history recorded on other days), for the request as asked and, where the request allows any
model (the trace's ``any``), for each model of the inventory alone (its own profile on the form):

- where the estimate for the request as asked is within the user's ``patience``, they queue as asked;
- else, where another model's estimate is sooner and within ``patience``, they take that model;
- else they come back at the soonest estimate (with that model) and look again; after
  :data:`MAX_DEFERRALS` returns they queue whatever it says.

Figures (:class:`ChoiceFigures`), per policy: p95 of the wait of those who queued (from when they
decided to queue, their first try or their return, to their start, less any time away), p95 and
median of "asked -> started" for everyone (from their first try, time away included, so demand
that moved is not hidden), held-idle, users who took another model, users who came back at their
estimate, and culled users who came back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..estimate import History
from ..gpu import GPU
from .estimates import estimator, fit
from .simulation import Policy, _Live, _Replay, _result
from .trace import MODELS, Session

#: how many times a user comes back at the estimate before queueing whatever it says
MAX_DEFERRALS = 3

#: the columns of the choices table (attribute, title, format)
COLUMNS = [("policy", "policy", "{}"), ("held_idle_pct", "held-idle %", "{:.1f}"),
           ("p95_queued_min", "p95 wait, queued min", "{:.1f}"),
           ("p95_asked_min", "p95 asked -> started min", "{:.1f}"),
           ("median_asked_min", "median asked -> started min", "{:.1f}"),
           ("other_model", "took another model", "{}"), ("later", "came back at the estimate", "{}"),
           ("gave_up", "gave up", "{}"), ("came_back", "culled, came back", "{}")]


@dataclass
class ChoiceFigures:
    policy: str
    held_idle_pct: float
    p95_queued_min: float
    p95_asked_min: float
    median_asked_min: float
    other_model: int
    later: int
    gave_up: int
    came_back: int


class _Choosing(_Replay):
    """A replay whose users look at the estimates before they queue (the module's rules)."""

    def __init__(self, sessions: list[Session], inventory: tuple[GPU, ...], policy: Policy, hours: float,
                 history: History, patience: float) -> None:
        super().__init__(sessions, inventory, policy, hours)
        self.estimate_of = estimator(history)
        self.patience = patience
        self.models = [m for m, name in MODELS.items() if any(g.name == name for g in inventory)]
        self.queued_waits: list[float] = []
        self.other_model = self.later = 0
        # per request (the object itself, never its id: an id is reused once a request is gone)
        self.decided: dict[_Live, float] = {}  # when its user decided to queue
        self.deferrals: dict[_Live, int] = {}  # times its user came back later instead
        self.spent: dict[_Live, float] = {}  # time it waited in the queue before it went away

    def _likely(self, live: _Live, models: tuple[str, ...]) -> float:
        likely = self.estimate_of(self, _Live(replace(live.s, models=models))).likely
        return float("inf") if likely is None else likely

    def ask(self, live: _Live) -> None:
        if not self.policy.queue or self.deferrals.get(live, 0) >= MAX_DEFERRALS:
            self.decided.setdefault(live, self.now)
            super().ask(live)
            return
        asked = self._likely(live, live.s.models)
        if asked > self.now + self.patience:
            options = [(asked, live.s.models)]
            if live.s.models == ("any",):
                options += [(self._likely(live, (m,)), (m,)) for m in self.models]
            soonest, models = min(options)
            if soonest > self.now + self.patience and soonest < float("inf"):
                self.later += live not in self.deferrals
                self.deferrals[live] = self.deferrals.get(live, 0) + 1
                if live in self.decided:  # it had queued (and reached the queue's limit): that wait counts
                    self.spent[live] = self.spent.get(live, 0.0) + self.now - self.decided.pop(live)
                self.at(soonest, "retry", live, live.generation)
                return
            if models != live.s.models:
                self.other_model += 1
                live.s = replace(live.s, models=models)
        self.decided.setdefault(live, self.now)
        super().ask(live)

    def granted(self, live: _Live) -> None:
        self.queued_waits.append(self.now - self.decided.pop(live, self.now) + self.spent.pop(live, 0.0))
        super().granted(live)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 60, 1) if ordered else 0.0


def measure(days: list[list[Session]], fit_days: list[list[Session]] | History, inventory: tuple[GPU, ...],
            policies: Iterable[Policy], patience: float, hours: float = 24.0) -> list[ChoiceFigures]:
    """Each policy on ``days`` as is and with users choosing by the estimates (drawn from the history
    the policy recorded on ``fit_days``, or that history itself)."""
    out = []
    for policy in policies:
        history = fit_days if isinstance(fit_days, History) else fit(fit_days, inventory, policy, hours)
        plain = [_Replay(sessions, inventory, policy, hours).run() for sessions in days]
        chose = [_Choosing(sessions, inventory, policy, hours, history, patience).run() for sessions in days]
        for runs, name, queued in ((plain, policy.name, [w for r in plain for w in r.waits]),
                                   (chose, f"{policy.name}, users choose",
                                    [w for r in chose for w in r.queued_waits])):
            result = _result(runs)
            out.append(ChoiceFigures(
                name, result.held_idle_pct, _p(queued, 0.95), result.p95_wait_min, result.median_wait_min,
                sum(getattr(r, "other_model", 0) for r in runs), sum(getattr(r, "later", 0) for r in runs),
                result.gave_up, result.came_back))
    return out
