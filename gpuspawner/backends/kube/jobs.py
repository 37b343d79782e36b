"""gpu-kube's notebook GPU jobs: a :class:`~gpuspawner.jobmodel.runner.JobRunner` of pods."""

from __future__ import annotations

import asyncio
from typing import Any

from ...jobmodel.execute import STOPPED_EXIT
from ...jobmodel.outcome import Ended
from ...jobmodel.runner import JobRunner, executor_args, job_marks
from ...jobmodel.spec import JobSpec


class KubeJobs(JobRunner):
    """gpu-kube: a job is a pod (``restartPolicy: Never``) of the user's image, volumes and profile.

    The pod is the one KubeSpawner would make for the user's default server, turned
    into a run-to-completion pod (:func:`~gpuspawner.backends.kube.jobpod.job_pod`). Its GPUs
    are the cluster's to place: the hub counted them (``reserve_gpus``, the same quota
    claim as a server's) and the pod asks for them (limits, node selector). How it
    ended comes from the pod (exit code, termination message); the pod is deleted then.
    """

    kind = "pod"

    async def check_files(self, spawner: Any, spec: JobSpec) -> str | None:
        return None  # the files are in the user's volume: the job's pod reports a missing notebook

    async def launch(self, spawner: Any, job_id: str, owner: str, spec: JobSpec) -> dict:
        from jupyterhub.utils import maybe_future

        from .api import create_pod
        from .jobpod import TERMINATION_LOG, job_pod, job_pod_name

        await spawner.ensure_storage()  # the user's namespace and home volume, as their server gets them
        manifest = await spawner.get_pod_manifest()
        if spawner.modify_pod_hook:
            manifest = await maybe_future(spawner.modify_pod_hook(spawner, manifest))
        server_pod = spawner.api.api_client.sanitize_for_serialization(manifest)
        env = job_marks(spawner, owner, job_id)
        notebook_dir = spawner.notebook_dir
        name = job_pod_name(spawner.pod_name, job_id)
        body = job_pod(server_pod, job_id=job_id, name=name, env=env,
                       command=["python3", *executor_args(spec, job_id, TERMINATION_LOG)],
                       working_dir=spawner.format_string(notebook_dir) if notebook_dir else None)
        body.setdefault("apiVersion", "v1")
        body.setdefault("kind", "Pod")
        await create_pod(spawner.api, spawner.namespace, body, spawner.k8s_api_request_timeout)
        return {"pod": name, "namespace": spawner.namespace}

    async def _pod(self, spawner: Any, handle: dict) -> dict | None:
        from .api import read_pod

        return await read_pod(spawner.api, handle["namespace"], handle["pod"], spawner.k8s_api_request_timeout)

    async def running(self, spawner: Any, job_id: str, handle: dict) -> bool:
        from .jobpod import pod_end

        return not pod_end(await self._pod(spawner, handle)).ended

    async def ended(self, spawner: Any, job_id: str, handle: dict, spec: JobSpec) -> Ended:
        """How it ended (the notebook container's exit code and termination message); deletes the pod."""
        from .api import delete_pod
        from .jobpod import pod_end

        end = pod_end(await self._pod(spawner, handle))
        await delete_pod(spawner.api, handle["namespace"], handle["pod"], 0, spawner.k8s_api_request_timeout)
        outcome = {0: "completed", 1: "failed", 2: "failed", STOPPED_EXIT: "stopped"}.get(end.exit_code)
        if outcome is None and end.error:
            outcome = "failed"
        return Ended(end.exit_code, outcome, end.error)

    async def stop(self, spawner: Any, job_id: str, handle: dict) -> None:
        """Delete the pod: the executor gets SIGTERM (and writes its outputs), SIGKILL 3 s later; waits for that."""
        from .api import delete_pod
        from .jobpod import pod_end

        grace = 3
        if not await delete_pod(spawner.api, handle["namespace"], handle["pod"], grace,
                                spawner.k8s_api_request_timeout):
            return
        deadline = asyncio.get_running_loop().time() + grace + 2
        while asyncio.get_running_loop().time() < deadline:
            if pod_end(await self._pod(spawner, handle)).ended:
                return
            await asyncio.sleep(0.25)
