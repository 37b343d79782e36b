"""Fair-share queueing: each user's recent weighted GPU use, decayed with a half-life.

The hub's queue orders waiting requests by arrival (``gpu_queue_order = "arrival"``) or by
fair share (``"fair-share"``): users with less recent GPU use first. A user's recent use is
the GPU-hours they held (busy or idle), each weighted by :func:`model_weight`, an hour ``h``
ago counting ``2 ** (-h / half_life)`` of an hour now (:class:`RecentUse`). Still-held
allocations count up to now.

Pure: :class:`RecentUse` is fed the ended holdings (the hub: the usage table's rows as
:mod:`gpuspawner.waits` reads them, then each release; the replay: its ledger's releases)
and is asked about users with what they hold now. :class:`FairShare` is what the queue is
given to order by (:attr:`gpuspawner.queue.GPUQueue.fair_share`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["QUEUE_ORDERS", "FairShare", "Holding", "RecentUse", "duration", "model_weight", "ordinal"]

#: ``gpu_queue_order``'s values
QUEUE_ORDERS = ("arrival", "fair-share")

#: (GPU count, model slug, held since: seconds since the epoch) of one holding still held
Holding = tuple[int, str, float]


def model_weight(model: str) -> float:
    """What one GPU-hour of ``model`` (a slug such as ``a100-sxm4-80gb``) counts in a user's recent use.

    The one place a model's weight plugs in (the budgets' weights, once configured): today every
    GPU-hour counts 1, whatever the model.
    """
    return 1.0


def _decayed(rate: float, start: float, end: float, at: float, half_life: float) -> float:
    """GPU-hours of ``rate`` (GPUs x weight) held from ``start`` to ``end``, decayed to time ``at`` >= ``end``."""
    if end <= start:
        return 0.0
    k = math.log(2) / half_life
    return rate * (math.exp(-k * (at - end)) - math.exp(-k * (at - start))) / k / 3600


class RecentUse:
    """Each user's recent weighted GPU-hours, decayed with a ``half_life`` (seconds).

    Kept per user as one number at one time, decayed when read, so reading it costs the same
    whatever the history's length.
    """

    def __init__(self, half_life: float, weight: Callable[[str], float] = model_weight) -> None:
        if not 0 < half_life < math.inf:
            raise ValueError(f"half_life must be a finite number of seconds > 0, not {half_life}")
        self.half_life = half_life
        self.weight = weight
        self._users: dict[str, tuple[float, float]] = {}  # user -> (GPU-hours decayed to `at`, at)

    def add(self, user: str, gpus: int, model: str, started: float, ended: float) -> None:
        """``user`` held ``gpus`` GPUs of ``model`` from ``started`` to ``ended``."""
        value, at = self._users.get(user, (0.0, ended))
        now = max(at, ended)
        value *= 2 ** (-(now - at) / self.half_life)
        value += _decayed(gpus * self.weight(model), started, ended, now, self.half_life)
        self._users[user] = (value, now)

    def of(self, user: str, now: float, holding: Iterable[Holding] = ()) -> float:
        """``user``'s recent use at ``now``, GPU-hours: what ended, and ``holding`` (held until now)."""
        value, at = self._users.get(user, (0.0, now))
        value *= 2 ** (-(now - at) / self.half_life)
        for gpus, model, since in holding:
            value += _decayed(gpus * self.weight(model), since, now, now, self.half_life)
        return value


@dataclass(frozen=True)
class FairShare:
    """What the queue orders by under fair share: ``use(users)`` -> each user's recent use now
    (GPU-hours, :class:`RecentUse`), and the ``half_life`` (seconds) its words name."""

    use: Callable[[Iterable[str]], Mapping[str, float]]
    half_life: float


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ... ``11th``, ``12th``, ``13th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def duration(seconds: float) -> str:
    """A half-life in words: ``"24 hours"``, ``"7 days"``, ``"90 minutes"``."""
    if seconds % 86400 == 0:
        days = int(seconds // 86400)
        return f"{days} day{'s' if days != 1 else ''}"
    if seconds >= 3600:
        return f"{seconds / 3600:g} hours" if seconds != 3600 else "1 hour"
    return f"{seconds / 60:g} minutes"


def held_now(allocations: Mapping[str, tuple[str, ...]], since: Callable[[str], float | None],
             user_of: Callable[[str], str], model_of: Callable[[str], str], now: float) -> dict[str, list[Holding]]:
    """User -> what they hold now, as :class:`RecentUse` counts it, from a ledger's ``allocations`` (owner ->
    GPU UUIDs or cluster tokens), when each holding began (``since``; unknown: now), each owner's user and each
    GPU's model."""
    found: dict[str, list[Holding]] = {}
    for owner, uuids in allocations.items():
        if uuids:
            began = since(owner)
            holding = (len(uuids), model_of(uuids[0]), now if began is None else began)
            found.setdefault(user_of(owner), []).append(holding)
    return found


def use_now(recent: Callable[[], RecentUse], half_life: float, held: Callable[[], Mapping[str, list[Holding]]],
            clock: Callable[[], float]) -> FairShare:
    """The queue's :class:`FairShare` from ``recent()`` (what ended, decayed with ``half_life``) and ``held()``
    (what is held now), at ``clock()``."""
    def use(users: Iterable[str]) -> dict[str, float]:
        now, holding, ended = clock(), held(), recent()
        return {user: ended.of(user, now, holding.get(user, ())) for user in users}

    return FairShare(use, half_life)
