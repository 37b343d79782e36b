"""gpu-slurm's jobs as the truth of what runs: :class:`SlurmReconcileMixin`.

A parent of :class:`~gpuspawner.backends.slurm.spawner.GPUSlurmSpawner`. The mixin's reconciliation
(:mod:`gpuspawner.backends.reconciling`) asks it for this hub's live jobs (found by their comment,
``gpu_hub_id``), for the job ids the hub's database names (servers' state, active notebook jobs'
records), and to cancel an orphan (``slurm_cancel_orphans``).
"""

from __future__ import annotations

from batchspawner import format_template
from traitlets.config import Configurable

from ...ledger import cluster_tokens
from ...owner import Owner, OwnerError, user_of
from ...reconcile import Workload
from .capacity import parse_gres
from .commands import prefixed, run_command_line
from .queue import ENDED, comment_start, parse_comment


def ledger_resource(gres_type: str) -> str:
    """The ledger's resource name for GPUs of a GRES type (no colon: see :func:`cluster_tokens`)."""
    return f"slurm-gpu.{gres_type or 'untyped'}"


class SlurmReconcileMixin(Configurable):
    """This hub's Slurm jobs, for the shared reconciliation (see the module's words)."""

    reconciles_with_cluster = True
    backend_name = "gpu-slurm"
    workload_word = "Slurm job"

    async def live_workloads(self) -> list[Workload]:
        """This hub's jobs Slurm lists that have not ended and are not ending (``COMPLETING``: its
        epilog runs), found by their comment (``gpu_hub_id``), each holding the GPUs its ``--gres``
        asks for (as cluster tokens, as the hub's claims count them)."""
        reading = await (await self.slurm()).jobs(max_age=0)
        if reading.unknown is not None:
            raise RuntimeError(reading.unknown)
        live = []
        for job in reading.value:
            tag = parse_comment(job.comment)
            if tag is None or tag[0] != self.gpu_hub_id or job.state in ENDED or job.state == "COMPLETING":
                continue
            try:
                owner = str(Owner.from_parts(tag[1], tag[2]))
            except OwnerError as e:  # a comment this hub never writes (another user's sbatch can say anything)
                self.log.warning("Slurm job %s: its comment names no server or job of this hub (%s); not counted",
                                 job.id, e)
                continue
            gpus = parse_gres(job.gpus.replace("gres:", ""))
            holds = cluster_tokens(owner, {ledger_resource(t): n for t, n in gpus.items()})
            live.append(Workload(job.id, owner, holds, comment_start(job.comment), f"Slurm job {job.id}"))
        return live

    async def recorded_workloads(self) -> dict[str, set[str]] | None:
        """Owner -> Slurm job ids of every server JupyterHub shows running or starting whose state names
        a job (``user/server``), and of every active notebook GPU job (``user/job/<id>``)."""
        session = self.hub_session()
        if session is None:
            return None
        from jupyterhub import orm

        from ...jobmodel.store import JobStore

        owners: dict[str, set[str]] = {}
        for row in session.query(orm.Spawner).filter(orm.Spawner.server != None).all():  # noqa: E711 (SQL)
            job_id = (row.state or {}).get("job_id")
            if job_id and row.user is not None:
                owners.setdefault(str(Owner.of_server(row.user.name, row.name)), set()).add(str(job_id))
        store = self.hub_state.cache(JobStore, lambda: JobStore(session.get_bind()))
        for record in store.list(active_only=True, limit=100_000):
            if record.handle.get("slurm_job"):
                owners.setdefault(str(Owner.of_job(record.user, record.id)), set()).add(str(record.handle["slurm_job"]))
        return owners

    def stops_orphans(self) -> bool:
        return self.slurm_cancel_orphans

    async def end_orphan(self, workload: Workload) -> None:
        """Cancel a job of this hub that no server's state and no active notebook job names, as batchspawner
        cancels its jobs (``exec_prefix`` + ``batch_cancel_cmd``), as the account of the user its comment names."""
        self.log.warning("gpu-slurm: cancelling Slurm job %s of %s: no server or notebook job of this hub's "
                         "database names it (the hub stopped before saving it, or its server was stopped)",
                         workload.id, workload.owner)
        try:
            subvars = {**self.command_subvars(), "username": self.account_of(user_of(workload.owner)),
                       "job_id": workload.id}
            line = prefixed(format_template(self.exec_prefix, **subvars),
                            format_template(self.batch_cancel_cmd, **subvars))
            await run_command_line(line, "batch_cancel_cmd")
        except Exception as e:  # a filled-in template can fail in many ways; the next pass retries
            self.log.error("gpu-slurm: could not cancel Slurm job %s: %s", workload.id, e)

