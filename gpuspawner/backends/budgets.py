"""GPU-hour budgets on every backend: the settings, the hub's :class:`BudgetKeeper`, and the spawn's gate.

:class:`GPUBudgetSettings` is a parent of ``GPUSpawnerMixin``, so its traits are configured as
``c.GPUSpawnerMixin.gpu_budget_per_user`` etc.; their help strings are the reference (README,
"Budgets"). The arithmetic is :mod:`gpuspawner.budgets` (pure); here is what reads the hub's
database for it and what a spawn does with it.

The gate (:meth:`GPUBudgetSettings.apply_budget`) runs where every spawn's and every notebook
GPU job's options are checked (``_apply_gpu_options`` on every backend: form, REST and the job
API alike), before anything is held or recorded. A GPU choice of a user whose budget is spent
is, with ``gpu_budget_exhausted = "refuse"``, a :class:`jupyterhub.spawner.SpawnException` of
status 422, reason ``compute-quota-exceeded`` (as jupyterhub-usage-quotas 0.2 refuses), whose
sentence names used, limit and when GPUs open again; the REST answer's JSON also carries
:meth:`~gpuspawner.budgets.Standing.quota_json` (:func:`gpuspawner.hub.budgets.json_error_bodies`).
With ``"queue-last"`` the choice goes on, marked to wait in the hub's queue behind every
request of a user with budget left (``gpu_budget_last``, the queue's ordering key). CPU-only
choices are never refused.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

try:
    from jupyterhub.spawner import SpawnException
except ImportError:  # JupyterHub 5 (zero-to-jupyterhub 4's hub image) has none: an HTTPError of the same status
    SpawnException = None
from sqlalchemy import or_, select
from tornado import web
from traitlets import Any as AnyTrait, Bool, Dict, Float, TraitError, Unicode, validate
from traitlets.config import Configurable

from ..budgets import (
    EXHAUSTED,
    PERIODS,
    QUOTA_ERROR,
    BudgetError,
    BudgetPolicy,
    Standing,
    crossed_low,
    parse_spec,
    parse_weights,
)
from ..profiles import Choice
from ..refusals import words
from ..usage import Allocation

__all__ = ["BudgetKeeper", "GPUBudgetSettings", "budget_refusal"]

Listener = Callable[[str, Standing], None]
log = logging.getLogger("gpuspawner.budgets")


class BudgetKeeper:
    """One hub's budget book: the last standing of each user it computed (the Prometheus gauge),
    and the listeners told when a user's budget runs low (:meth:`on_low`)."""

    def __init__(self) -> None:
        self.last: dict[str, Standing] = {}
        self._listeners: list[Listener] = []

    def on_low(self, listener: Listener) -> None:
        """Call ``listener(user, standing)`` whenever a user's left falls to ``gpu_budget_low`` of the limit."""
        self._listeners.append(listener)

    def standing(self, db: Any, policy: BudgetPolicy, user: str, groups: Iterable[str],
                 now: float | None = None) -> Standing:
        """Where ``user`` (in ``groups``) stands now, from the hub's usage records (``db``: its session)."""
        return self.standings(db, policy, {user: groups}, now)[0]

    def standings(self, db: Any, policy: BudgetPolicy, users: Mapping[str, Iterable[str]],
                  now: float | None = None) -> list[Standing]:
        """Where each of ``users`` (name -> groups) stands now, from one read of the usage records (only the
        rows of these users and their budgeted groups, in the earliest period that counts)."""
        now = time.time() if now is None else now
        users = {user: sorted(groups) for user, groups in users.items()}
        applying = [(scope, name, spec) for u, g in users.items() for scope, name, spec in policy.applying(u, g)]
        rows: list[Allocation] = []
        if applying and db is not None:
            since = min(spec.window(now)[0] for _, _, spec in applying)
            names = {name for scope, name, _ in applying if scope == "user"}
            groups = {name for scope, name, _ in applying if scope == "group"}
            whose = [Allocation.user.in_(sorted(names))] if names else []
            whose += [Allocation.groups.contains(json.dumps(g), autoescape=True) for g in sorted(groups)]
            query = select(Allocation).where(Allocation.started < now, or_(*whose),
                                             or_(Allocation.ended.is_(None), Allocation.ended > since))
            rows = list(db.execute(query).scalars())
        found = policy.standings(users, rows, now)
        for standing in found:
            self.note(standing, policy.low)
        return found

    def note(self, found: Standing, low: float) -> None:
        """Keep ``found`` as the user's last standing; tell the listeners if it crossed ``low``."""
        before = self.last.get(found.user)
        if found.lines:
            self.last[found.user] = found
        else:
            self.last.pop(found.user, None)
        if crossed_low(before, found, low):
            for listener in list(self._listeners):
                try:
                    listener(found.user, found)
                except Exception:  # a listener never breaks a spawn
                    log.exception("budget listener failed for %s", found.user)

    def left_by_user(self) -> dict[str, float]:
        """user -> weighted GPU-hours left (of the binding budget) at its last standing: the gauge's values."""
        return {user: s.left for user, s in self.last.items() if s.left is not None}


def budget_refusal(standing: Standing) -> Exception:
    """The 422 a spent budget answers (JupyterHub shows its sentence; the REST body gets the quota fields)."""
    sentence = standing.sentence()
    if SpawnException is not None:
        error = SpawnException(sentence, reason=QUOTA_ERROR, status_code=422)
    else:
        error = web.HTTPError(422, "%s", sentence, reason=QUOTA_ERROR)
    error.jupyterhub_message = sentence
    error.json_fields = standing.quota_json()
    return error


def json_error_bodies() -> None:
    """Let JupyterHub's REST answers carry an error's own JSON fields (``json_fields``: a spent budget's 422).

    JupyterHub's API handlers answer an error with ``{"status", "message"}`` and no hook; so,
    once per process, where JupyterHub's API handlers are loaded (a hub), their ``write_error``
    is wrapped: an error with a dict ``json_fields`` is answered with those fields added, any
    other as before.
    """
    module = sys.modules.get("jupyterhub.apihandlers.base")
    if module is None or getattr(module.APIHandler.write_error, "gpuspawner_json_fields", False):
        return
    original = module.APIHandler.write_error

    def write_error(self, status_code, **kwargs):
        error = (kwargs.get("exc_info") or (None, None, None))[1]
        fields = getattr(error, "json_fields", None)
        if not isinstance(fields, dict):
            return original(self, status_code, **kwargs)
        self.set_header("Content-Type", "application/json")
        message = getattr(error, "jupyterhub_message", None) or str(error)
        self.write(json.dumps({"status": status_code, "message": message, **fields}))

    write_error.gpuspawner_json_fields = True
    module.APIHandler.write_error = write_error


class GPUBudgetSettings(Configurable):
    """GPU-hour budgets (see the module's words and the README's "Budgets")."""

    gpu_budget_per_user = AnyTrait(
        None, allow_none=True,
        help="""The GPU-hour budget of each user: weighted GPU-hours their servers and notebook GPU jobs
        may hold per period (held time counts, busy or idle). A number (hours per
        ``gpu_budget_period``), or a dict ``{"hours": 20, "period": "week", "rolling": True}``.
        None (the default): no budget per user. ``gpu_budget_overrides`` replaces it for some users.""",
    ).tag(config=True)

    gpu_budget_per_group = Dict(
        help="""GPU-hour budgets of JupyterHub groups, shared by their members (every allocation recorded
        with the group counts), e.g. ``{"students": 100}`` or ``{"students": {"hours": 100, "period":
        "month"}}``. A member of several budgeted groups is held to each, and to their own.""",
    ).tag(config=True)

    gpu_budget_overrides = Dict(
        help="""Per-user budgets set by an admin, replacing ``gpu_budget_per_user`` for those users:
        ``{"alice": 100, "bob": {"hours": 5, "period": "day"}}``; ``None`` for a user: no user budget
        for them (group budgets still apply).""",
    ).tag(config=True)

    gpu_budget_weights = Dict(
        help="""How much an hour of each GPU model counts: ``{model pattern: factor}``, e.g.
        ``{"a100*": 4, "t4": 1}``; the first pattern (in this order) that matches the model the usage
        records keep wins, no match counts 1. A pattern with ``*``, ``?`` or ``[`` is a shell pattern;
        any other matches as profiles' ``gpu_models`` do (``"a100"`` matches ``a100-sxm4-80gb``).
        The records keep model slugs on gpu-local, gpu-docker and gpu-swarm, and the cluster resource
        on gpu-kube and gpu-slurm (``nvidia.com/mig-1g.10gb``, ``slurm-gpu.a100``): a MIG slice or a
        shared replica counts as one GPU there, so give it its fraction as its weight. Factors are
        finite numbers, 0 or more.""",
    ).tag(config=True)

    gpu_budget_period = Unicode(
        "week",
        help="""The period of budgets given as a plain number: ``"day"``, ``"week"`` or ``"month"``.
        Calendar periods are UTC (a week starts on Monday 00:00, a month on its 1st).""",
    ).tag(config=True)

    gpu_budget_rolling = Bool(
        False,
        help="""True: budgets given as a plain number count a rolling window (the last 24 hours, 7 days or
        30 days up to now) instead of the calendar period. A spent rolling budget opens again as soon
        as enough use has left the window for something to be left.""",
    ).tag(config=True)

    gpu_budget_exhausted = Unicode(
        "refuse",
        help="""What a GPU request of a user whose budget is spent gets: ``"refuse"`` (HTTP 422, reason
        ``compute-quota-exceeded``, a sentence naming used, limit and when GPUs open again; CPU-only
        profiles still start), or ``"queue-last"`` (a ``queue: true`` profile waits in the hub's queue
        behind every request of a user with budget left; others are placed as usual when GPUs are free).""",
    ).tag(config=True)

    gpu_budget_unit = Unicode(
        "GPU-hours",
        help="""What a weighted GPU-hour is called where users read it: ``"A100-hours"`` when an A100
        weighs 1. The form then says "6.5 of 20 A100-hours left this week".""",
    ).tag(config=True)

    gpu_budget_low = Float(
        0.1,
        help="""The share of a budget (0 to 1) at or below which it runs "low": the hub then calls the
        listeners of its budget keeper once (``gpuspawner.budgets`` module's "Hook"); e.g. 0.1: 10 %
        left.""",
    ).tag(config=True)

    gpu_budget_check_interval = Float(
        60.0,
        help="""The most seconds between two reads of the budgets of the users who hold GPUs now (with
        budgets configured; read sooner when the holders change or a warning or stop may be due):
        it keeps ``gpuspawner_budget_left`` current while servers run and calls the "runs low"
        listeners when a running server takes a budget to ``gpu_budget_low``. A finite number above 0.""",
    ).tag(config=True)

    @validate("gpu_budget_per_user")
    def _check_user_budget(self, proposal):
        return self._checked(lambda: parse_spec(proposal["value"], "gpu_budget_per_user", allow_none=True),
                             proposal)

    @validate("gpu_budget_per_group", "gpu_budget_overrides")
    def _check_budget_dicts(self, proposal):
        name = proposal["trait"].name

        def check():
            for key, value in proposal["value"].items():
                if not isinstance(key, str) or not key:
                    raise BudgetError(f"{name}: {key!r} is not a {'group' if 'group' in name else 'user'} name")
                parse_spec(value, f"{name}[{key!r}]", allow_none=name == "gpu_budget_overrides")

        return self._checked(check, proposal)

    @validate("gpu_budget_weights")
    def _check_weights(self, proposal):
        return self._checked(lambda: parse_weights(proposal["value"]), proposal)

    @validate("gpu_budget_period")
    def _check_period(self, proposal):
        if proposal["value"] not in PERIODS:
            raise TraitError(f"gpu_budget_period must be one of {', '.join(PERIODS)}, not {proposal['value']!r}")
        return proposal["value"]

    @validate("gpu_budget_exhausted")
    def _check_exhausted(self, proposal):
        if proposal["value"] not in EXHAUSTED:
            raise TraitError(f"gpu_budget_exhausted must be 'refuse' or 'queue-last', not {proposal['value']!r}")
        return proposal["value"]

    @validate("gpu_budget_check_interval")
    def _check_interval(self, proposal):
        if not 0 < proposal["value"] < float("inf"):
            raise TraitError(f"gpu_budget_check_interval must be a finite number of seconds > 0, "
                             f"not {proposal['value']}")
        return proposal["value"]

    @validate("gpu_budget_low")
    def _check_low(self, proposal):
        if not 0 <= proposal["value"] <= 1:
            raise TraitError(f"gpu_budget_low must be a share from 0 to 1, not {proposal['value']}")
        return proposal["value"]

    @validate("gpu_budget_unit")
    def _check_unit(self, proposal):
        if not proposal["value"].strip() or len(proposal["value"]) > 40:
            raise TraitError(f"gpu_budget_unit must be a short name such as 'A100-hours', not {proposal['value']!r}")
        return proposal["value"].strip()

    @staticmethod
    def _checked(check: Callable[[], Any], proposal) -> Any:
        try:
            check()
        except BudgetError as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    # ------------------------------------------------------------ reading it

    def budget_policy(self) -> BudgetPolicy:
        """The configured budgets, checked (the validators ran when they were set)."""
        period, rolling = self.gpu_budget_period, self.gpu_budget_rolling

        def spec(value, name, allow_none=False):
            return parse_spec(value, name, period, rolling, allow_none=allow_none)

        return BudgetPolicy(
            per_user=spec(self.gpu_budget_per_user, "gpu_budget_per_user", True),
            per_group={g: spec(v, "gpu_budget_per_group") for g, v in self.gpu_budget_per_group.items()},
            overrides={u: spec(v, "gpu_budget_overrides", True) for u, v in self.gpu_budget_overrides.items()},
            weights=parse_weights(self.gpu_budget_weights), unit=self.gpu_budget_unit,
            exhausted=self.gpu_budget_exhausted, low=self.gpu_budget_low,
        )

    # ------------------------------------------------------------ a spawn's gate (spawners only)

    #: True for this spawn when its user's budget is spent and ``gpu_budget_exhausted`` is "queue-last":
    #: its request waits in the hub's queue behind every request of a user with budget left
    gpu_budget_last = False

    def gpu_budget_standing(self) -> Standing | None:
        """This server's user's standing now; None when no budget is configured (nothing is read)."""
        policy = self.budget_policy()
        if not policy.enabled:
            return None
        keeper = budget_keeper(self.hub_state)
        return keeper.standing(self.hub_session(), policy, self.user.name, self.user_group_names())

    def apply_budget(self, choice: Choice) -> None:
        """The budget gate of a spawn's (or a job's) checked ``choice`` (see the module's words)."""
        self.gpu_budget_last = False
        if not choice.gpus:
            return
        standing = self.gpu_budget_standing()
        if standing is None or not standing.exhausted:
            return
        if self.gpu_budget_exhausted == "queue-last":
            self.gpu_budget_last = True
            return
        self.hub_state.metrics.refused("budget", 0.0)
        raise budget_refusal(standing)

    def budget_form_context(self, context: dict) -> dict:
        """What the spawn form says of budgets: the summary line, a spent budget's sentence, and each profile's
        cost per GPU-hour of each model (``costs``: profile slug -> text); empty without budgets."""
        standing = self.gpu_budget_standing()
        if standing is None:
            return {}
        policy = self.budget_policy()
        costs = {}
        for entry in context.get("profiles", ()):
            models = [(m.name, policy.cost_per_hour(1, m.slug)) for m in entry.get("models", ())]
            if models and entry["profile"].max_gpus:
                costs[entry["profile"].slug] = ", ".join(f"{name} {cost:g}" for name, cost in models)
        spent = ""
        if standing.exhausted:
            spent = words("budget_queue_last") if policy.exhausted == "queue-last" else standing.sentence()
        return {"summary": standing.summary(), "spent": spent, "costs": costs, "unit": standing.unit}


def budget_keeper(state: Any) -> BudgetKeeper:
    """The hub's one :class:`BudgetKeeper` (made on first use; its gauge served with the hub's metrics)."""
    def make() -> BudgetKeeper:
        keeper = BudgetKeeper()
        state.metrics.budget_left = keeper.left_by_user
        return keeper

    return state.cache(BudgetKeeper, make)


json_error_bodies()
