"""gpu-docker's notebook GPU jobs: a :class:`~gpuspawner.jobmodel.runner.JobRunner` of containers."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from ...jobmodel.outcome import Ended
from ...jobmodel.runner import JobRunner, executor_args, job_marks, server_environment, status_path
from ...jobmodel.spec import JobSpec


class DockerJobs(JobRunner):
    """gpu-docker: a job is a container of the user's image, with their volumes and its GPUs by UUID."""

    kind = "container"

    def __init__(self) -> None:
        self._removals: set[asyncio.Future] = set()

    async def check_files(self, spawner: Any, spec: JobSpec) -> str | None:
        return None  # the files are inside the user's volume: the job's container reports a missing notebook

    async def launch(self, spawner: Any, job_id: str, owner: str, spec: JobSpec) -> dict:
        from .objects import visible_devices_env

        image = spawner.image
        await spawner.pull_image(image)
        env = server_environment(spawner)
        env.update(visible_devices_env(spawner.gpu_uuids))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spawner.gpu_uuids)
        env.update(job_marks(spawner, owner, job_id))
        host_config = dict(binds=spawner.volume_binds)
        if spawner.network_name and spawner.network_name != "bridge":
            host_config["network_mode"] = spawner.network_name
        if spawner.mem_limit:
            host_config["mem_limit"] = spawner.mem_limit
        if spawner.cpu_limit:
            host_config["cpu_quota"] = int(spawner.cpu_limit * 100_000)
        host_config = await spawner.docker("create_host_config", **host_config)
        name = f"{spawner.object_name}-job-{job_id[:12]}"
        kwargs = dict(image=image, command=["python3", *executor_args(spec, job_id)], environment=env,
                      name=name, host_config=host_config, labels={"org.gpuspawner.job": job_id})
        notebook_dir = spawner.notebook_dir
        if notebook_dir:
            kwargs["working_dir"] = spawner.format_string(notebook_dir)
        created = await spawner.docker("create_container", **kwargs)
        await spawner.docker("start", created["Id"])
        return {"container": created["Id"], "name": name}

    async def _inspect(self, spawner: Any, handle: dict) -> dict | None:
        import docker.errors

        try:
            return await spawner.docker("inspect_container", handle["container"])
        except docker.errors.NotFound:
            return None

    async def running(self, spawner: Any, job_id: str, handle: dict) -> bool:
        info = await self._inspect(spawner, handle)
        return bool(info and info["State"].get("Running"))

    async def ended(self, spawner: Any, job_id: str, handle: dict, spec: JobSpec) -> Ended:
        """How it ended (exit code; the status file read back from the container); removes the container."""
        import io
        import tarfile

        info = await self._inspect(spawner, handle)
        if info is None:
            return Ended(None, None, "the job's container is gone")
        code = info["State"].get("ExitCode")
        outcome = error = None
        workdir = info["Config"].get("WorkingDir") or "/"
        try:
            stream, _stat = await spawner.docker("get_archive", handle["container"],
                                                 os.path.join(workdir, status_path(spec, job_id)))
            data = b"".join(stream)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = tar.getmembers()[0]
                status = json.loads(tar.extractfile(member).read())
            outcome, error = status.get("outcome"), status.get("error")
        except Exception:  # no status written (killed before it could)
            pass
        # the container has exited, so its GPUs are free now: remove it without holding them up
        removal = asyncio.ensure_future(self._remove(spawner, handle["container"]))
        self._removals.add(removal)
        removal.add_done_callback(self._removals.discard)
        return Ended(code, outcome, error)

    async def _remove(self, spawner: Any, container: str) -> None:
        try:
            await spawner.docker("remove_container", container, force=True)
        except Exception as e:  # gone already, or the engine went away: the next restart's reconcile sees it
            spawner.log.warning("gpu-docker: could not remove job container %s: %s", container[:12], e)

    async def stop(self, spawner: Any, job_id: str, handle: dict) -> None:
        import docker.errors

        try:
            await spawner.docker("stop", handle["container"], timeout=3)
        except docker.errors.NotFound:
            pass
