"""A server's GPUs in its spawner state, across hub restarts: :class:`GPUStateMixin`.

A parent of :class:`~gpuspawner.backends.base.GPUSpawnerMixin`. The GPUs a server holds are
written to the hub's database before anything is created (:meth:`GPUStateMixin.save_state`),
read back into the ledger when the hub starts again (:meth:`GPUStateMixin.load_state`), and
given back when JupyterHub clears the state, except on backends whose workload may outlive it
(``gpus_outlive_state``).

The state is written through the session that holds this server's row (:meth:`GPUStateMixin.hub_session`:
the session of ``orm_spawner``, as JupyterHub's own ``User`` finds it), never through ``Spawner.db``,
whose every first read JupyterHub 6 answers with a deprecation warning. The parents that still
commit through ``self.db`` (batchspawner 1.3's ``start``, KubeSpawner 7.1's ``poll``) get that
session too, without the warning.
"""

from __future__ import annotations

import sqlalchemy
from sqlalchemy.orm import Session
from traitlets import default
from traitlets.config import Configurable

from ..gpu import gpu_from_record


class GPUStateMixin(Configurable):
    """This server's GPUs in its spawner state (see the module's words)."""

    #: True where the workload may outlive its cleared state: JupyterHub clears the state before every
    #: start, while a leftover container (gpu-docker) or a server's kernels (gpu-local) may still run on
    #: its GPUs. :meth:`clear_state` then gives no GPU back; they are released once the workload is known
    #: gone (the backend's stop and poll, the next start's reconciliation).
    gpus_outlive_state = False

    #: whether :meth:`save_state` wrote this spawner's state since it was last cleared
    _gpu_state_written = False

    def hub_session(self) -> Session | None:
        """The hub's database session that holds this server's row: the one ``orm_spawner`` is in (JupyterHub
        writes a server's state through it), else the user's (a notebook job's spawner has no row);
        None outside a hub."""
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is not None:
            try:
                session = sqlalchemy.inspect(orm_spawner).session
            except sqlalchemy.exc.NoInspectionAvailable:  # a stand-in row without SQLAlchemy's instance state
                session = None
            if isinstance(session, Session):  # a Mock stand-in row (KubeSpawner's own tests) answers anything
                return session
        session = getattr(getattr(self, "user", None), "db", None)
        return session if isinstance(session, Session) else None

    @default("db")
    def _db_without_deprecation(self) -> Session | None:
        """``Spawner.db`` for the parents that still commit through it (see the module's words)."""
        return self.hub_session()

    def save_state(self) -> None:
        """Write this server's state (its GPUs first) to the hub's database now.

        JupyterHub saves it only after ``start`` returns; a hub that dies before
        that must still know, when it comes back, which GPUs its servers hold.
        """
        orm_spawner = getattr(self, "orm_spawner", None)
        session = self.hub_session()
        if orm_spawner is None or session is None:
            return
        orm_spawner.state = self.get_state()
        session.commit()
        self._gpu_state_written = True

    def get_state(self) -> dict:
        state = super().get_state()
        if self.gpu_allocation:
            state["gpus"] = [g.to_dict() for g in self.gpu_allocation]
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        records = state.get("gpus") or []
        if not records:
            return
        gpus = tuple(gpu_from_record(r) for r in records)
        refused = self.ledger.adopt(self.gpu_owner, [g.uuid for g in gpus])
        if refused:
            self.log.error(
                "%s: state says it holds GPUs %s, but another server holds them",
                self._log_name, ", ".join(refused),
            )
        self.gpu_allocation = tuple(g for g in gpus if g.uuid not in refused)

    def clear_state(self) -> None:
        """The parent's; the GPUs released; and where :meth:`save_state` wrote the state early, the cleared
        state written too, so that what the spawner forgot (a job id, a container) is not read back by the
        next spawner object of this server (JupyterHub itself saves it only where it cleared it).
        Only the parent's where the GPUs outlive the state (:attr:`gpus_outlive_state`)."""
        super().clear_state()
        if self.gpus_outlive_state:
            return
        if self.gpu_allocation:
            self.release_gpus()
        if self._gpu_state_written:
            self.save_state()
            self._gpu_state_written = False
