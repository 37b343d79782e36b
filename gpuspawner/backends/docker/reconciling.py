"""gpu-docker's reconciliation: this hub's labelled containers are the truth of who holds which GPU.

A mixin of :class:`~gpuspawner.backends.docker.spawner.GPUDockerSpawner` (and so of gpu-swarm's
spawner, which lists services instead): the pure decision is
:func:`gpuspawner.backends.docker.objects.reconcile`; the shared pass is the mixin's
:meth:`~gpuspawner.backends.reconciling.GPUReconcileMixin.reconcile_with_cluster`.
"""

from __future__ import annotations

from traitlets.config import Configurable

from ...reconcile import Workload
from .caches import DockerCaches
from .engine import is_unreachable
from .objects import HUB, reconcile


class DockerReconcileMixin(Configurable):
    """Listing this hub's containers, each holding the GPUs its labels name."""

    reconciles_with_cluster = True
    backend_name = "gpu-docker"  # how this backend's log lines begin
    workload_word = "container"

    async def live_workloads(self) -> list[Workload]:
        """This hub's running labelled servers, each holding the GPUs its labels name.

        Every one is its owner's (adopted where the hub's database forgot it: a hub killed
        mid-spawn); two claiming one GPU (which gpuspawner never does) are logged, the older
        keeping it. The GPUs' records from the labels are kept for the servers (``found``).
        """
        try:
            containers = await self._labelled_servers()
        except Exception as e:
            if is_unreachable(e):
                raise self._unreachable(e, "No GPU was reserved.") from e
            raise
        plan = reconcile(self.gpu_hub_id, containers, {})
        said = self.hub_state.cache(DockerCaches).docker_conflicts.setdefault(self.backend_name, set())
        for sentence in plan.conflicts:
            if sentence not in said:  # once, not every pass
                said.add(sentence)
                self.log.error("%s: %s", self.backend_name, sentence)
        self.hub_state.found = await self._found_gpus(plan)
        checked = self.hub_state.cache(DockerCaches).inventory_checked
        if self.backend_name not in checked:  # once per hub
            self._check_inventory_source()
            checked.add(self.backend_name)
        return [Workload(plan.names[owner], owner, uuids, what=f"{self.workload_word} {plan.names[owner]}")
                for owner, uuids in plan.holdings.items()]

    async def _labelled_servers(self) -> list[dict]:
        """This hub's containers (any state), as ``docker ps`` lists them."""
        return await self.docker("containers", all=True, filters={"label": [f"{HUB}={self.gpu_hub_id}"]})

    async def _found_gpus(self, plan) -> dict:
        """Each found server's GPUs (as its labels describe them) that it still holds."""
        return {
            owner: tuple(g for g in alloc.gpus if g.uuid in plan.holdings.get(owner, ()))
            for owner, alloc in plan.allocations.items()
        }

    def _check_inventory_source(self) -> None:
        if self.gpu_inventory == "nvml" and not self.engine_url.startswith("unix://"):
            self.log.warning(
                "gpu-docker: the Docker engine %s may be on another host, but gpu_inventory is 'nvml' "
                "(this host's GPUs); use gpu_inventory = 'static' for a remote engine",
                self.engine_url,
            )

    def _adopt_reconciled_allocation(self) -> None:
        """Take the GPUs the ledger holds for this server (from its container's labels)."""
        held = self.ledger.allocations().get(self.gpu_owner, ())
        if held == self.gpu_uuids:
            return
        from_labels = self.hub_state.found.get(self.gpu_owner, ())
        by_uuid = {g.uuid: g for g in (*self.gpu_allocation, *from_labels)}
        self.gpu_allocation = tuple(by_uuid[u] for u in held if u in by_uuid)
