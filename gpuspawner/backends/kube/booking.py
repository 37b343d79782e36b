"""gpu-kube's booking keeper: bookings of the cluster's GPU models, kept by this hub alone.

The hub asks its spawner class for a keeper (:meth:`GPUSpawnerMixin.booking_keeper
<gpuspawner.backends.base.GPUSpawnerMixin.booking_keeper>`, :mod:`gpuspawner.hub.booking_keeper`).
Kubernetes has no advance reservations, so nothing is made on the cluster: a booking is for the
cluster's GPU models as the capacity reader counts them per pool (:mod:`.capacity`; the models the
form offers, with their totals on schedulable nodes), and this hub's placement keeps it
(:mod:`.booked`): in the window the hub refuses or narrows its own other users' requests for the
model. Other tenants of the cluster (pods the hub did not make) are not held back; their pods count
as holding GPUs, so a booking may find fewer free than it booked.

- :meth:`~KubeBookingKeeper.models`: the cluster's pools ``[{"model", "name", "total"}]``;
  RuntimeError when the Kubernetes API does not answer and no earlier reading is kept;
- :meth:`~KubeBookingKeeper.reserve` / :meth:`~KubeBookingKeeper.holds`: nothing made; what the booking
  holds, in words; :meth:`~KubeBookingKeeper.unreserve` and :meth:`~KubeBookingKeeper.reconcile`: nothing
  to remove or make again;
- :meth:`~KubeBookingKeeper.held_models`: the model each GPU of a ledger owner is of (the model its pod
  asked for, :class:`.holdings.PoolHolders`), so an unused window is released only when none of its users
  holds GPUs of the booked model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...bookings import ANY, Booking
from .api import ClusterCapacity
from .capacity import pools
from .holdings import PoolHolders

#: what a booking holds on Kubernetes, in words
HOLDS = "{count} of the cluster's {model} GPUs, as counted by this hub; other tenants are not held back"


def holds_words(b: Booking) -> str:
    """What ``b`` holds on a gpu-kube hub, in words."""
    return HOLDS.format(count=b.count, model="" if b.model == ANY else b.model).replace("  ", " ")


class KubeBookingKeeper:
    """The keeper of a gpu-kube hub (one per hub): reads the cluster through ``reader()``, made on first use
    (the Kubernetes client belongs to the hub's event loop)."""

    def __init__(self, reader: Callable[[], ClusterCapacity]) -> None:
        self._make_reader = reader
        self._reader: ClusterCapacity | None = None

    @classmethod
    def of(cls, spawner_class: type, config: Any) -> KubeBookingKeeper:
        """A keeper reading the cluster with ``spawner_class``'s Kubernetes settings in ``config``."""
        def reader() -> ClusterCapacity:
            spawner = spawner_class(config=config, _mock=True)  # its API client and settings; no pod is made
            return ClusterCapacity(spawner.api, ttl=spawner.gpu_inventory_ttl, timeout=spawner.k8s_api_request_timeout)

        return cls(reader)

    async def models(self) -> list[dict]:
        if self._reader is None:
            self._reader = self._make_reader()
        reading = await self._reader.read()
        if reading.unknown and not reading.nodes:
            raise RuntimeError(reading.unknown)
        return [{"model": p.slug, "name": p.name, "total": p.total} for p in pools(reading.nodes)]

    async def reserve(self, b: Booking) -> str:
        return holds_words(b)

    async def unreserve(self, booking_id: str) -> None:
        return None

    async def holds(self, bookings: Sequence[Booking]) -> dict[str, str]:
        return {b.id: holds_words(b) for b in bookings}

    async def reconcile(self, live: Sequence[Booking]) -> dict[str, str]:
        return {}

    @staticmethod
    def held_models(state: Any, owner: str, keys: tuple[str, ...]) -> list[str]:
        """The model of each GPU ``owner`` holds in hub state ``state`` (its ledger ``keys``); none where its
        pod could land on several models."""
        return state.cache(PoolHolders).models_of(owner, keys)
