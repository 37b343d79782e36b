"""gpu-local's notebook GPU jobs: a :class:`~gpuspawner.jobmodel.runner.JobRunner` of processes.

A job is a process of the user, started as their server would be: as their account, in their
files, inside a device fence of its own, through the spawner's public job methods
(:class:`~.accounts.LocalAccounts`: ``job_account``, ``job_files_root``, ``job_preexec_fn``;
:class:`~.starts.LocalStarts`: ``job_command_prefix``, ``job_pids``, ``end_job_processes``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...jobmodel.outcome import Ended
from ...jobmodel.runner import (
    JobRunner,
    executor_args,
    job_marks,
    notebook_problem,
    read_status,
    server_environment,
    status_path,
)
from ...jobmodel.spec import JobSpec
from .processes import alive, end_processes


class LocalJobs(JobRunner):
    """gpu-local: a job is a process of the user (in their device fence), like their server."""

    kind = "process"

    def __init__(self) -> None:
        self._procs: dict[str, subprocess.Popen] = {}

    async def check_files(self, spawner: Any, spec: JobSpec) -> str | None:
        """A sentence when the notebook is not there (the hub can look on this host)."""
        await spawner.ensure_account()  # the user's files are in their account's home (made on first use)
        return await asyncio.to_thread(notebook_problem, spawner.job_files_root(), spec)

    @staticmethod
    def _env(spawner: Any, job_id: str, owner: str) -> dict[str, str]:
        """Its server's environment (with CUDA_VISIBLE_DEVICES of its GPUs), marked as this job."""
        env = server_environment(spawner)
        user, home = spawner.job_account()
        env.update({"HOME": home, "USER": user, "LOGNAME": user})
        env.update(job_marks(spawner, owner, job_id))
        return spawner.passable_env(env)

    async def launch(self, spawner: Any, job_id: str, owner: str, spec: JobSpec) -> dict:
        await spawner.ensure_account()
        problem = spawner.root_problem()  # a job runs as whom the user's server would: never root
        if problem:
            raise RuntimeError(problem)
        prefix = spawner.job_command_prefix(job_id)  # its device fence, made before its process exists
        root = spawner.job_files_root(make=True)
        cmd = [*prefix, sys.executable, *executor_args(spec, job_id)]
        proc = await asyncio.to_thread(
            subprocess.Popen, cmd, env=self._env(spawner, job_id, owner), cwd=root,
            preexec_fn=spawner.job_preexec_fn(), start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self._procs[job_id] = proc
        return {"pid": proc.pid, "root": root}

    async def running(self, spawner: Any, job_id: str, handle: dict) -> bool:
        proc = self._procs.get(job_id)
        if proc is not None:
            return proc.poll() is None
        pid = handle.get("pid")
        if pid and alive([pid]):
            return True
        return bool(await asyncio.to_thread(spawner.job_pids, job_id))

    async def ended(self, spawner: Any, job_id: str, handle: dict, spec: JobSpec) -> Ended:
        """How it ended; ends what it left behind (kernels, daemons) and removes its device fence.

        What would not die keeps the job's GPUs out of service (the manager's release then frees nothing).
        """
        proc = self._procs.pop(job_id, None)
        code = proc.returncode if proc is not None else None
        await spawner.end_job_processes(job_id)
        where = Path(handle.get("root", "/")) / status_path(spec, job_id)
        outcome, error = await asyncio.to_thread(read_status, where)
        return Ended(code, outcome, error)

    async def stop(self, spawner: Any, job_id: str, handle: dict) -> None:
        pids = await asyncio.to_thread(spawner.job_pids, job_id)
        proc = self._procs.get(job_id)
        if proc is not None and proc.poll() is None and proc.pid not in pids:
            pids.append(proc.pid)
        await end_processes(pids, grace=3.0)
        if proc is not None:
            await asyncio.to_thread(proc.wait, 5)
