"""The order of the hub's queue: by arrival or by fair share (:class:`GPUQueueOrderMixin`).

A parent of ``GPUSpawnerMixin`` (configured as ``c.GPUSpawnerMixin.gpu_queue_order`` etc.),
before :class:`~gpuspawner.backends.policies.GPUPolicyMixin`: whenever a spawn waits in the
hub's queue or the form estimates a wait, the queue is told the rule first
(:meth:`GPUQueueOrderMixin.order_queue`). Under fair share it orders by each user's recent
GPU use (:mod:`gpuspawner.fairshare`): what ended, from the usage table as
:mod:`gpuspawner.waits` reads it once and each release since; what is held, from the ledger.
"""

from __future__ import annotations

import math
import time
from typing import Any

from traitlets import Float, TraitError, Unicode, validate
from traitlets.config import Configurable

from ..fairshare import QUEUE_ORDERS, FairShare, held_now, use_now
from ..gpu import per_gpus
from ..ledger import cluster_resource
from ..waits import wait_history
from .policies import _owner_user

__all__ = ["GPUQueueOrderMixin", "hub_fair_share"]


class GPUQueueOrderMixin(Configurable):
    """Which waiting spawn the hub's queue serves first (see the README's "Fair-share queueing")."""

    gpu_queue_order = Unicode(
        "arrival",
        help="""The order of the hub's queue for ``queue: true`` profiles. ``"arrival"``: first come,
        first served, each user's first waiting request before anyone's second. ``"fair-share"``:
        users with less recent GPU use first: each user's GPU-hours held (busy or idle, still-held
        servers and jobs counted up to now), an hour ``gpu_fair_share_half_life`` ago counting half;
        ties go by arrival as above. The order is looked at again at every release and re-check, so a
        request can be passed by a later one of a user with less use; each waiting user sees their
        place and why on the progress page and in ``/hub/api/gpus``. Every GPU-hour counts 1 whatever
        the model. Where the cluster's own queue is the queue (gpu-slurm, whose priority has its own
        fair share; gpu-kube profiles with a Kueue queue) this setting orders nothing. Any other value
        is refused at hub start.""",
    ).tag(config=True)

    @validate("gpu_queue_order")
    def _check_queue_order(self, proposal):
        if proposal["value"] not in QUEUE_ORDERS:
            raise TraitError(f"gpu_queue_order must be 'arrival' or 'fair-share', not {proposal['value']!r}")
        return proposal["value"]

    gpu_fair_share_half_life = Float(
        168.0,
        help="""Hours after which a GPU-hour counts half in a user's recent use, for
        ``gpu_queue_order = "fair-share"`` (default 168: a week; after two weeks a quarter). The use is
        read from the usage records (the newest 20,000 ended allocations) once, then kept up to date at
        each release. A finite number above 0.""",
    ).tag(config=True)

    @validate("gpu_fair_share_half_life")
    def _check_half_life(self, proposal):
        if not 0 < proposal["value"] < math.inf:
            raise TraitError(f"gpu_fair_share_half_life must be a finite number of hours > 0, not {proposal['value']}")
        return proposal["value"]

    def order_queue(self) -> None:
        """Tell the hub's queue the configured order."""
        queue = self.hub_state.queue
        fair = self.gpu_queue_order == "fair-share"
        if not fair:
            queue.fair_share = None
        elif queue.fair_share is None or queue.fair_share.half_life != self.gpu_fair_share_half_life * 3600:
            queue.fair_share = hub_fair_share(self.hub_state, self.gpu_fair_share_half_life * 3600)

    async def wait_in_queue(self, *args: Any, **kwargs: Any) -> Any:
        self.order_queue()
        return await super().wait_in_queue(*args, **kwargs)

    def queue_form_estimates(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        self.order_queue()
        return super().queue_form_estimates(*args, **kwargs)


def hub_fair_share(state: Any, half_life: float) -> FairShare:
    """The :class:`~gpuspawner.fairshare.FairShare` of the hub ``state`` (a HubState): what ended from its
    :class:`~gpuspawner.waits.WaitHistory`, what is held from its ledger."""
    history = wait_history(state)

    def model_of() -> Any:
        reading = state.inventory.last_reading()
        models = per_gpus(reading.gpus, "models", lambda gpus: {g.uuid: g.model for g in gpus}) if reading else {}
        return lambda uuid: cluster_resource(uuid) or models.get(uuid, "")

    def held() -> dict:
        ledger = state.ledger
        return held_now(ledger.allocations(), ledger.since, _owner_user, model_of(), time.time())

    return use_now(lambda: history.recent_use(half_life), half_life, held, time.time)
