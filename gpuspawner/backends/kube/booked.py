"""gpu-kube and the hub's bookings (:mod:`gpuspawner.bookings`): the cluster places, so the rule counts
what the capacity reader says is free per model (pool slug), not the hub's own GPUs.

In a booking's window, a request of anyone else for the booked model is refused with the booking's
sentence when the model's free GPUs minus what is booked and not yet used by the booking's users
would go below zero; the booking's users are admitted (a profile with a Kueue queue still queues in
Kueue: the hub admits, Kueue's quotas decide). Before a window, the same "until" rule as where the
hub places: a server is admitted until the window starts (and told so), a notebook job only if its
time limit ends before. The hub's servers inside their own booking, or told to leave at a window,
count as giving their GPUs back then.

The ledger counts a server's GPUs as cluster tokens of a resource (``nvidia.com/gpu``), not of a
model: :class:`~.holdings.PoolHolders` keeps, per ledger owner, the model its pod was asked for (where the
request allowed only one; else, and after a hub restart, the pool of the nodes its pods run on, read at
the hub's reconciliation with the cluster), for the rule above, the queue's wait estimates and the
release of unused booked windows (:mod:`.booking`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ...bookings import Verdict
from ...gpu import slug_matches
from ...placement import GPURequest
from ...profiles import Choice
from ...refusals import PlacementError, refuse
from ..claim import Claim
from .booking import KubeBookingKeeper
from .capacity import NodeGPUs, pools
from .holdings import PoolHolders

__all__ = ["KubeBookingsMixin"]


def requestable(nodes: Sequence[NodeGPUs], patterns: Sequence[str]) -> dict[str, int]:
    """Free GPUs per pool slug that ``patterns`` select (none: whole GPUs), as the capacity reader counts them."""
    return {p.slug: p.free for p in pools(nodes)
            if (any(slug_matches(pat, p.slug) for pat in patterns) if patterns else p.kind == "gpu")}


def narrowed(choice: Choice, slugs: Sequence[str]) -> Choice:
    """``choice`` asking only for the pools ``slugs`` (what bookings let it take)."""
    profile = dataclasses.replace(choice.profile, gpu_models=tuple(slugs))
    return dataclasses.replace(choice, profile=profile, gpu_model=slugs[0] if len(slugs) == 1 else "any")


class KubeBookingsMixin:
    """The bookings' rule in gpu-kube's claim (a mixin of :class:`~.spawner.GPUKubeSpawner`)."""

    @classmethod
    def booking_keeper(cls, config) -> Any:
        """Bookings of the cluster's GPU models, kept by this hub's placement (:mod:`.booking`)."""
        return KubeBookingKeeper.of(cls, config)

    def kube_booking_verdicts(self, request: GPURequest, nodes: Sequence[NodeGPUs]) -> dict[str, Verdict]:
        """Pool slug -> the rule's verdict for ``request`` now (``{}``: nothing booked)."""
        holders = self.hub_state.cache(PoolHolders)
        return self.judge_bookings(request, requestable(nodes, request.models), holders.models_of, free=True)

    def booked_choice(self, choice: Choice, request: GPURequest, nodes: Sequence[NodeGPUs],
                      waiting: bool = False) -> tuple[Choice, PlacementError | None, dict[str, Verdict]]:
        """What ``choice`` may ask the cluster for under the bookings, a refusal, and the verdicts.

        A booking's own user in its window asks for the booked models only (their pods land on them);
        anyone else for the models not refused. All refused: the booking's sentence (``waiting``: a
        ``none_free`` refusal, so a request in the hub's queue waits on, as on the other backends).
        """
        said = self.kube_booking_verdicts(request, nodes) if choice.gpus else {}
        if not said:
            return choice, None, said
        mine = [m for m, v in said.items() if v.kind == "ok" and v.booking is not None]
        allowed = mine or [m for m, v in said.items() if v.ok]
        if allowed:
            return (choice if len(allowed) == len(said) else narrowed(choice, allowed)), None, said
        sentence = next(v.message for v in said.values() if not v.ok)
        return choice, refuse("booked_wait" if waiting else "booked", {"sentence": sentence},
                              requested=request.count, models=request.models), said

    def within_kube_booking(self, request: GPURequest, nodes: Sequence[NodeGPUs]) -> bool:
        """Whether ``request`` is its user's own booking's, on now (it never waits in the hub's queue)."""
        return any(v.kind == "ok" and v.booking is not None
                   for v in self.kube_booking_verdicts(request, nodes).values())

    def note_kube_claim(self, claim: Claim, nodes: Sequence[NodeGPUs], said: dict[str, Verdict]) -> None:
        """Keep the model this server's pod asks for (where one pool has its products) and tell a server
        admitted until a window so (its progress; the hub stops it when the window starts)."""
        if not claim.count:
            return
        slugs = sorted({p.slug for p in pools(nodes) if p.resource == claim.resource
                        and (not claim.products or set(p.products) <= set(claim.products))})
        owner = self.gpu_owner
        holders = self.hub_state.cache(PoolHolders)
        if len(slugs) == 1:
            holders[owner] = slugs[0]
        else:
            holders.pop(owner, None)
        verdicts = [said[s] for s in slugs if s in said]
        self.note_verdict(next((v for v in verdicts if v.kind == "until"), None))

    def note_pod_models(self, placed: Mapping[str, Sequence[tuple[str, str]]], nodes: Sequence[NodeGPUs]) -> None:
        """The model of each counted server's or job's GPUs where the hub did not keep it (a hub restarted):
        the pool of its pods' resource on the nodes they run on (``placed``: owner -> (node, resource))."""
        by_node = {n.name: n for n in nodes}
        holders = self.hub_state.cache(PoolHolders)
        for owner, where in placed.items():
            slugs = {p.slug for node, resource in where if node in by_node
                     for p in by_node[node].pools if p.resource == resource}
            if len(slugs) == 1 and owner not in holders:
                holders[owner] = slugs.pop()
