"""gpu-slurm's notebook GPU jobs: a job is a Slurm batch job of the user (a
:class:`~gpuspawner.jobmodel.runner.JobRunner`).

The job's spawner object (a :class:`~gpuspawner.backends.slurm.spawner.GPUSlurmSpawner`
made for the job) has already checked the request against Slurm's nodes and
counted its GPUs in the hub's ledger (under ``user/job/<id>``, for the quotas)
and set ``--gres=gpu:TYPE:N`` with the profile's partition, QOS, account,
reservation and constraint. The runner submits it as the user through the
spawner's own ``batch_script`` and ``batch_submit_cmd`` (so a site's prologue,
``srun`` and options apply to jobs as to servers), running the executor
(``python3 -m gpuspawner.jobs.execute``, see ``job_python``) in the user's home
(``req_homedir``); Slurm picks the GPUs and sets ``CUDA_VISIBLE_DEVICES``.
``--time`` is the smaller of the profile's and the job's time limit. The job's
name and comment mark it as this hub's ``user/job/<id>``, the way servers'
jobs are marked, so a restarted hub counts it and does not cancel it.

While Slurm holds it pending the job is ``queued``, its reason Slurm's in words, with Slurm's start estimate
and ours (:mod:`~gpuspawner.backends.slurm.estimates`).
Its outcome comes from the executor's status file (the hub reads the shared
filesystem) and Slurm's state and exit code (``squeue`` lists ended jobs for
``MinJobAge`` seconds; no accounting needed): Slurm's ``TIMEOUT`` is a job
stopped at its time limit, ``CANCELLED`` one stopped, ``NODE_FAIL``,
``OUT_OF_MEMORY``, ... failed with that reason. Cancel is the spawner's ``batch_cancel_cmd``
(``scancel``), and every Slurm command goes through its ``exec_prefix``, as for servers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from ...jobmodel.outcome import Ended
from ...jobmodel.runner import JobRunner, executor_args, notebook_problem, read_status, status_path
from ...jobmodel.spec import JobSpec
from .estimates import waiting
from .queue import ENDED, SlurmJob, slurm_seconds, slurm_time

log = logging.getLogger("gpuspawner.jobs")

#: Slurm's states of a job that ended without finishing its work, in words
_FAILED_WORDS = {
    "NODE_FAIL": "its node failed",
    "OUT_OF_MEMORY": "it ran out of memory (the profile's memory limit)",
    "PREEMPTED": "Slurm preempted it for another job",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "it reached its deadline",
    "REVOKED": "Slurm revoked it",
}
#: how long :meth:`SlurmJobs.stop` waits for Slurm to end a cancelled job (its GPUs freed)
STOP_WAIT = 60.0


class SlurmJobs(JobRunner):
    """gpu-slurm: a job is a Slurm batch job of the user on the GPUs Slurm gives it."""

    kind = "slurm job"

    @staticmethod
    def time_limit(spawner: Any, spec: JobSpec) -> str:
        """``--time``: the smaller of the profile's (``req_runtime``) and the job's time limit."""
        own = spec.time_limit or spawner.gpu_job_time_limit
        profile = slurm_seconds(spawner.req_runtime)
        return slurm_time(min(own, profile) if profile else own)

    async def check_files(self, spawner: Any, spec: JobSpec) -> str | None:
        """A sentence when the notebook is not in the user's home, which the hub reads on the cluster's
        shared filesystem; nothing when the hub cannot look there (the job then says it)."""
        root = Path(spawner.req_homedir)
        try:
            if not await asyncio.to_thread(root.is_dir):
                return None
            return await asyncio.to_thread(notebook_problem, str(root), spec)
        except PermissionError:
            return None

    async def launch(self, spawner: Any, job_id: str, owner: str, spec: JobSpec) -> dict:
        spawner.gpu_job_command = [spawner.job_python, *executor_args(spec, job_id)]
        spawner.req_runtime = self.time_limit(spawner, spec)
        slurm_job = await spawner.submit_batch_script()  # HTTP 409/503 saying what Slurm said
        if not slurm_job:
            raise RuntimeError("sbatch gave no job id")
        log.info("job %s of %s is Slurm job %s (--gres=%s --time=%s)", job_id, spawner.user.name, slurm_job,
                 spawner.req_gres or "none", spawner.req_runtime)
        return {"slurm_job": str(slurm_job), "root": spawner.req_homedir, "time": spawner.req_runtime}

    async def _job(self, spawner: Any, handle: dict, max_age: float | None = None) -> tuple[SlurmJob | None, bool]:
        """(the job as squeue lists it or None, whether Slurm answered); a job missing from a cached
        reading (one from before its submission) is looked for again in a fresh one."""
        reader = await spawner.slurm()
        for age in (max_age, 0):
            reading = await reader.jobs(max_age=age)
            if reading.unknown is not None:
                return None, False
            job = next((j for j in reading.value if j.id == handle["slurm_job"]), None)
            if job is not None:
                return job, True
        return None, True

    async def running(self, spawner: Any, job_id: str, handle: dict) -> bool:
        """Pending or running in Slurm (or Slurm does not answer: then it is taken to run on)."""
        job, answered = await self._job(spawner, handle)
        if not answered:
            return True
        return job is not None and job.state not in ENDED

    async def waiting(self, spawner: Any, job_id: str, handle: dict) -> str | None:
        """Why Slurm holds the job pending, in words (its reason, place and Slurm's start estimate, then ours);
        None once it runs."""
        job, _answered = await self._job(spawner, handle)
        if job is None or not job.pending:
            return None
        reader = await spawner.slurm()
        reading, nodes = await reader.jobs(), await reader.nodes()
        history = spawner.gpu_session_history()
        return waiting(job, reading.value, nodes.value if nodes.unknown is None else None, time.time(), history)[0]

    async def ended(self, spawner: Any, job_id: str, handle: dict, spec: JobSpec) -> Ended:
        """How it ended: the executor's status file, and Slurm's state and exit code while squeue lists it."""
        job, _answered = await self._job(spawner, handle, max_age=0)
        where = Path(handle.get("root", "/")) / status_path(spec, job_id)
        outcome, error = await asyncio.to_thread(read_status, where)
        state = job.state if job is not None and job.state in ENDED else None
        code = job.exit_code if state else None
        if state == "TIMEOUT":
            return Ended(code, "timed_out", f"Slurm stopped it at its time limit ({handle.get('time')})")
        if outcome is None and state == "CANCELLED":
            outcome, error = "stopped", "cancelled in Slurm"
        elif outcome is None and state in _FAILED_WORDS:
            outcome, error = "failed", f"Slurm ended it: {_FAILED_WORDS[state]} ({state})"
        return Ended(code, outcome, error)

    async def stop(self, spawner: Any, job_id: str, handle: dict) -> None:
        """``batch_cancel_cmd`` through ``exec_prefix`` (as the user, as for servers), then wait until Slurm
        has ended it: its GPUs are free."""
        spawner.job_id = handle["slurm_job"]
        try:
            await spawner.cancel_batch_job()
        except RuntimeError as e:  # already ended, or Slurm does not answer: looked at below
            log.warning("job %s: scancel %s: %s", job_id, handle["slurm_job"], e)
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline:
            job, answered = await self._job(spawner, handle, max_age=0)
            if answered and (job is None or job.state in ENDED):
                return
            await asyncio.sleep(0.25)
        log.warning("job %s: Slurm job %s has not ended %g s after scancel", job_id, handle["slurm_job"], STOP_WAIT)


__all__ = ["SlurmJobs"]
