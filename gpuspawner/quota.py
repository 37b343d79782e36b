"""GPU quotas per user and per JupyterHub group. Pure: no I/O, no state.

A user's quota counts the GPUs held by all of their servers (named servers
included). A group's quota counts the GPUs held by all servers of all of its
members together. :func:`check` is called with the ledger's allocations under
the ledger's lock, so the check and the reservation happen as one step and
concurrent spawns can never exceed a quota.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .owner import Owner, user_of
from .refusals import PlacementError, refuse

__all__ = ["Quota", "QuotaError", "check", "held_by"]


@dataclass(frozen=True)
class Quota:
    """The limits that apply to one request."""

    user: str
    per_user: int | None = None  # None: no per-user limit
    groups: Mapping[str, int] = field(default_factory=dict)  # group -> limit, for the user's groups only
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)  # group -> member user names


class QuotaError(PlacementError):
    """A request refused because it would exceed a quota (code ``quota_user`` or ``quota_group``)."""


def _plural(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def held_by(allocations: Mapping[str, tuple[str, ...]], users: frozenset[str] | set[str]) -> dict[str, int]:
    """owner -> GPU count, for the owners belonging to ``users``."""
    return {o: len(u) for o, u in allocations.items() if user_of(o) in users and u}


def check(
    quota: Quota, count: int, allocations: Mapping[str, tuple[str, ...]], owner: str | None = None,
    waiting: Mapping[str, int] | None = None,
) -> None:
    """Raise :class:`QuotaError` when ``count`` more GPUs would exceed a limit.

    ``allocations`` is owner -> held UUIDs (the ledger's); ``owner`` (the
    requesting server) is left out, since it releases what it held first.
    ``waiting`` (user -> GPUs asked for by their spawns waiting in the queue)
    counts too, so a queue never holds more than the quotas allow.
    """
    waiting = waiting or {}
    if count <= 0:
        return
    others = {o: u for o, u in allocations.items() if o != owner}
    if quota.per_user is not None:
        mine = held_by(others, {quota.user})
        total = sum(mine.values())
        queued = waiting.get(quota.user, 0)
        if total + queued + count > quota.per_user:
            servers = ", ".join(sorted(Owner.parse(o).label or "default" for o in mine)) or "none"
            also = f" and your queued spawns wait for {queued}" if queued else ""
            raise refuse("quota_user", {"limit": _plural(quota.per_user), "total": total, "servers": servers,
                                        "also": also, "count": count}, QuotaError, requested=count)
    for group, limit in sorted(quota.groups.items()):
        members = quota.members.get(group, frozenset()) | {quota.user}
        total = sum(held_by(others, members).values())
        queued = sum(n for u, n in waiting.items() if u in members)
        if total + queued + count > limit:
            also = f" and their queued spawns wait for {queued}" if queued else ""
            raise refuse("quota_group", {"group": group, "limit": _plural(limit), "total": total, "also": also,
                                         "count": count}, QuotaError, requested=count)
