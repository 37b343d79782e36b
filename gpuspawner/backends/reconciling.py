"""Reconciling the hub's GPU ledger with what really runs: :class:`GPUReconcileMixin`.

A parent of :class:`~gpuspawner.backends.base.GPUSpawnerMixin`. Where the cluster holds the
truth of what runs (``reconciles_with_cluster``: gpu-slurm, gpu-kube, gpu-docker, gpu-swarm),
the ledger is reconciled with it at start and every ``gpu_reconcile_interval`` seconds, in one
way for all of them (:mod:`gpuspawner.reconcile` decides): a backend only says how it lists this
hub's live workloads (:meth:`GPUReconcileMixin.live_workloads`), which ones the hub's database
names, and how it ends an orphan. Elsewhere (gpu-local) the backend reconciles once, its own way
(:meth:`GPUReconcileMixin.reconcile_allocations`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from traitlets.config import Configurable

from ..owner import user_of
from ..reconcile import Plan, Workload, plan


class GPUReconcileMixin(Configurable):
    """The ledger made to agree with the runtime's workloads (see the module's words)."""

    #: True where the cluster (or engine) holds the truth of what runs: the ledger is reconciled
    #: with its list of this hub's workloads at start and every ``gpu_reconcile_interval`` seconds,
    #: the shared way (:meth:`reconcile_with_cluster`). False: the backend reconciles once, its
    #: own way (:meth:`reconcile_allocations`; gpu-local).
    reconciles_with_cluster = False
    #: how the log names this backend's workloads ("Slurm job", "pod", ...)
    workload_word = "workload"

    async def reconcile_allocations(self) -> None:
        """Make the ledger hold what the runtime's servers really hold; backends override.

        Runs once per hub (:meth:`ensure_reconciled`), before anything is placed.
        """

    async def live_workloads(self) -> Sequence[Workload]:
        """This hub's live workloads as the cluster lists them (``reconciles_with_cluster`` backends)."""
        raise NotImplementedError

    async def recorded_workloads(self) -> Mapping[str, set[str]] | None:
        """Owner -> the workload ids the hub's database names, for every server JupyterHub shows
        running or starting and every active notebook job; None where the backend keeps no such
        record (then every live workload is its owner's, and none is an orphan)."""
        return None

    def stops_orphans(self) -> bool:
        """Whether a live workload no record names is ended (:meth:`end_orphan`) rather than adopted."""
        return False

    async def end_orphan(self, workload: Workload) -> None:
        """End a live workload of this hub that no record names; log what was done."""
        raise NotImplementedError

    async def ensure_reconciled(self) -> None:
        """Reconcile the ledger with the runtime once per hub; concurrent callers wait for it.

        Where the cluster holds the truth, the hub state's timer reconciles again every
        ``gpu_reconcile_interval`` seconds from then on.
        """
        state = self.hub_state
        key = ("reconcile", type(self).__name__)
        if self.reconciles_with_cluster:
            await state.once(key, lambda: self.reconcile_with_cluster(first=True))
            state.every(key, state.reconcile_interval, self._reconcile_again)
            return

        async def reconcile() -> None:
            # an allocation released here and not adopted again was gone: usage records say "crashed"
            with state.usage.reconciling(state.ledger.allocations):
                await self.reconcile_allocations()

        await state.once(key, reconcile)

    async def _reconcile_again(self) -> None:
        try:
            await self.reconcile_with_cluster(first=False)
        except Exception as e:  # the next round tries again; placement goes on meanwhile
            self.log.warning("%s: the GPU ledger was not reconciled with the cluster this time (tried again in "
                             "%g s): %s", self.backend_name, self.hub_state.reconcile_interval, e)

    #: how this backend's log lines begin
    backend_name = "gpuspawner"

    async def reconcile_with_cluster(self, first: bool) -> Plan:
        """One pass: read this hub's live workloads and its records, and make the ledger agree.

        ``first``: the pass at hub start (charges found gone end as ``crashed`` in the usage
        records; later passes: ``failed``, they ended while the hub ran). Owners whose start or
        stop is in flight at any moment of the pass are left alone (:mod:`gpuspawner.reconcile`).
        Passes of one hub never overlap.
        """
        state = self.hub_state
        async with state.reconcile_locks.setdefault(type(self).__name__, asyncio.Lock()):
            began = state.flights.mark()
            ledger = state.ledger
            held = ledger.allocations()
            since = {owner: ledger.since(owner) for owner in held}
            live = await self.live_workloads()
            recorded = await self.recorded_workloads()
            stop = self.stops_orphans()
            result = plan(held, live, recorded, state.flights.since(began), adopt_orphans=not stop)
            self._apply_plan(result, held, since, first, stop)
            state.flights.forget(began)
            if stop:
                for workload in result.orphans:
                    await self.end_orphan(workload)
        if first:
            self.log.info("%s: GPU ledger reconciled with %d live %s(s) of this hub: %d owner(s) hold %d GPU(s)",
                          self.backend_name, len(live), self.workload_word, len(ledger.allocations()),
                          sum(len(k) for k in ledger.allocations().values()))
        return result

    def _apply_plan(self, result: Plan, held: Mapping[str, tuple[str, ...]], since: Mapping[str, float | None],
                    first: bool, stop: bool) -> None:
        """Change the ledger as ``result`` says, only for owners whose charge nothing changed meanwhile."""
        state = self.hub_state
        ledger = state.ledger

        def unchanged(owner: str) -> bool:
            return ledger.allocations().get(owner) == held.get(owner) and ledger.since(owner) == since.get(owner)

        freed: list[str] = []
        adopted = {w.owner: w for w in result.adopted}
        orphans = {w.owner for w in result.orphans}
        with state.usage.reconciling(ledger.allocations, "crashed" if first else "failed"):
            for owner in result.release:
                if unchanged(owner):
                    freed += ledger.release(owner)
                    self.log.warning("%s: %s's GPU charge (%d) freed: no live %s of it", self.backend_name, owner,
                                     len(held[owner]), self.workload_word)
            for owner, keys in result.hold.items():
                if not unchanged(owner):
                    continue
                if owner in held:
                    freed += ledger.release(owner)
                refused = ledger.adopt(owner, keys)
                if refused:
                    self.log.error("%s: %s's %s holds GPUs %s that another owner holds; not counted twice",
                                   self.backend_name, owner, self.workload_word, ", ".join(refused))
                if owner in adopted and owner not in orphans:
                    say = self.log.info if first else self.log.warning
                    say("%s: %s of %s counted: it holds %d GPU(s)%s", self.backend_name, adopted[owner], owner,
                        len(keys), "" if first else " the hub did not count")
                elif owner in held:
                    self.log.warning("%s: %s's charge changed from %d to %d GPU(s), as its %s holds",
                                     self.backend_name, owner, len(held[owner]), len(keys), self.workload_word)
        for workload in () if stop else result.orphans:
            self.log.warning("%s: adopted %s of %s: no server or notebook job of this hub's database names it; "
                             "its GPUs count against %s", self.backend_name, workload, workload.owner,
                             user_of(workload.owner))
        self.gpu_released(tuple(freed))
