"""gpu-local's notebook GPU jobs (moved here from :mod:`gpuspawner.jobs.runners`, whose helpers it uses)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...jobs.runners import (
    HUB_VAR,
    SERVER_VAR,
    SPAWN_VAR,
    Ended,
    executor_args,
    notebook_problem,
    read_status,
    server_environment,
    status_path,
)
from ...jobs.spec import JobSpec
from .processes import alive, end_processes


class LocalJobs:
    """gpu-local: a job is a process of the user (in their device fence), like their server."""

    kind = "process"

    def __init__(self) -> None:
        self._procs: dict[str, subprocess.Popen] = {}

    @staticmethod
    def root_dir(spawner: Any) -> str:
        """The user's files: the folder their server starts in."""
        if getattr(spawner, "_switches_user", True):
            home = spawner._system_user().pw_dir
        else:
            home = spawner.home_dir
        notebook_dir = spawner.notebook_dir
        if notebook_dir:
            return os.path.join(home, spawner.format_string(notebook_dir).replace("~", home, 1))
        return home

    async def check_files(self, spawner: Any, spec: JobSpec) -> str | None:
        """A sentence when the notebook is not there (the hub can look on this host)."""
        await spawner.ensure_account()  # the user's files are in their account's home (made on first use)
        return await asyncio.to_thread(notebook_problem, self.root_dir(spawner), spec)

    def _env(self, spawner: Any, job_id: str, owner: str, home: str) -> dict[str, str]:
        """Its server's environment (with CUDA_VISIBLE_DEVICES of its GPUs), marked as this job."""
        env = server_environment(spawner)
        user = spawner._system_user().pw_name if getattr(spawner, "_switches_user", True) else spawner.user.name
        env.update({"HOME": home, "USER": user, "LOGNAME": user})
        env.update({HUB_VAR: spawner.gpu_hub_id, SERVER_VAR: owner, SPAWN_VAR: job_id})
        return spawner.passable_env(env)

    async def launch(self, spawner: Any, job_id: str, owner: str, spec: JobSpec) -> dict:
        await spawner.ensure_account()
        problem = spawner.root_problem()  # a job runs as whom the user's server would: never root
        if problem:
            raise RuntimeError(problem)
        spawner.gpu_spawn_id = job_id
        spawner._create_fence()
        root = self.root_dir(spawner)
        switches = getattr(spawner, "_switches_user", True)
        home = spawner._system_user().pw_dir if switches else spawner.home_dir
        if not switches:
            os.makedirs(root, 0o755, exist_ok=True)
        cmd = [*(spawner._scope_prefix or []), sys.executable, *executor_args(spec, job_id)]
        preexec = spawner.make_preexec_fn(spawner.user.name) if (switches or spawner._fence_path) else None
        env = self._env(spawner, job_id, owner, home)
        proc = await asyncio.to_thread(
            subprocess.Popen, cmd, env=env, cwd=root, preexec_fn=preexec, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self._procs[job_id] = proc
        return {"pid": proc.pid, "root": root}

    def _pids(self, spawner: Any, job_id: str) -> list[int]:
        """The job's processes: its fence's (cgroup or scope), else those carrying its marks."""
        return spawner._fences().pids(job_id)

    async def running(self, spawner: Any, job_id: str, handle: dict) -> bool:
        proc = self._procs.get(job_id)
        if proc is not None:
            return proc.poll() is None
        pid = handle.get("pid")
        if pid and alive([pid]):
            return True
        return bool(await asyncio.to_thread(self._pids, spawner, job_id))

    async def ended(self, spawner: Any, job_id: str, handle: dict, spec: JobSpec) -> Ended:
        """How it ended; ends what it left behind (kernels, daemons) and removes its device fence.

        What would not die keeps the job's GPUs out of service (the manager's release then frees nothing).
        """
        proc = self._procs.pop(job_id, None)
        code = proc.returncode if proc is not None else None
        await spawner._end_processes(job_id)
        where = Path(handle.get("root", "/")) / status_path(spec, job_id)
        outcome, error = await asyncio.to_thread(read_status, where)
        return Ended(code, outcome, error)

    async def stop(self, spawner: Any, job_id: str, handle: dict) -> None:
        pids = await asyncio.to_thread(self._pids, spawner, job_id)
        proc = self._procs.get(job_id)
        if proc is not None and proc.poll() is None and proc.pid not in pids:
            pids.append(proc.pid)
        await end_processes(pids, grace=3.0)
        if proc is not None:
            await asyncio.to_thread(proc.wait, 5)
