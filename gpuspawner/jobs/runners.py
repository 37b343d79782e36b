"""Running a job on the hub's backend: start it, see whether it still runs, end it.

A runner works through the job's own spawner object (an instance of the hub's
spawner class, made for the job by the :class:`~.manager.JobManager`), so a
job gets what a server of that user would: on gpu-local the user's account
(made on first use where the hub makes them), home and device fence; on
gpu-docker the user's image, volumes and a device request by UUID. What marks
a job as the hub's, for finding it after a hub restart, is the same as for
servers: ``GPUSPAWNER_HUB``/``SERVER``/``SPAWN`` in the process environment
(the ledger owner ``user/job/<id>`` and the job id), or the container labels.

A job's environment is its server's: :func:`server_environment` is the
backend's own ``get_env`` (``env_keep``, ``environment``, the user's HOME, its
GPUs, the hub's marks; in the runnable default with simulated GPUs, the
stand-in NVML's variables), less what makes a server the hub's server. gpu-slurm
submits through batchspawner, which uses the same ``get_env``.

A runner's ``handle`` (saved in the job's record) says where the job runs.
gpu-slurm's runner is :class:`gpuspawner.slurm.notebookjobs.SlurmJobs`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..inputs import shown
from ..spawners.processes import HUB_VAR, SERVER_VAR, SPAWN_VAR, alive, end_processes
from .execute import STOPPED_EXIT
from .outcome import Ended, outcome_of  # noqa: F401 (what runners answer, re-exported for backends)
from .spec import JobSpec

EXECUTOR = ["-m", "gpuspawner.jobs.execute"]
#: what JupyterHub puts in a server's environment to connect it to the hub as that server (its URLs,
#: OAuth client and API token): a job is no server of the hub and gets none of it
SERVER_ONLY_PREFIXES = ("JUPYTERHUB_", "JPY_")


def server_environment(spawner: Any) -> dict[str, str]:
    """The environment a server of ``spawner`` (the job's own spawner object) would get, for its job.

    The one source of truth is the backend's ``get_env``: whatever a site or the runnable
    default gives servers (``env_keep``, ``environment`` with its callables, the GPU variables)
    a job gets too, less :data:`SERVER_ONLY_PREFIXES`.
    """
    return {k: v for k, v in spawner.get_env().items()
            if isinstance(v, str) and not k.startswith(SERVER_ONLY_PREFIXES)}


def status_path(spec: JobSpec, job_id: str) -> str:
    """Where the executor writes the job's outcome: a hidden file beside its log."""
    log = Path(spec.log)
    return str(log.with_name(f".{log.name}.{job_id[:12]}.status.json"))


def executor_args(spec: JobSpec, job_id: str, termination_log: str | None = None) -> list[str]:
    args = [*EXECUTOR, "--notebook", spec.notebook, "--parameters", json.dumps(spec.parameters),
            "--status", status_path(spec, job_id), "--log", spec.log]
    if termination_log:
        args += ["--termination-log", termination_log]
    for fmt, path in spec.outputs.items():
        args += ["--output", f"{fmt}={path}"]
    if spec.kernel:
        args += ["--kernel", spec.kernel]
    return args


def notebook_problem(root: str, spec: JobSpec) -> str | None:
    """A sentence when ``spec``'s notebook is not a file under ``root`` (the user's files, which the
    hub can read); None when it is there."""
    base = Path(root)
    try:
        target = (base / spec.notebook).resolve()
        if not str(target).startswith(str(base.resolve()) + os.sep):
            return f"notebook: {shown(spec.notebook)} is outside your files"
        if not target.is_file():
            return f"notebook: {shown(spec.notebook)} does not exist in your files"
    except OSError as e:  # a name too long for the file system, a loop of links...
        return f"notebook: {shown(spec.notebook)} cannot be read in your files ({e.strerror or e})"
    return None


def read_status(path: Path) -> tuple[str | None, str | None]:
    """The executor's status file: (outcome, error), or (None, None) when it wrote none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, None
    return data.get("outcome"), data.get("error")


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


class DockerJobs:
    """gpu-docker: a job is a container of the user's image, with their volumes and its GPUs by UUID."""

    kind = "container"

    def __init__(self) -> None:
        self._removals: set[asyncio.Future] = set()

    async def check_files(self, spawner: Any, spec: JobSpec) -> str | None:
        return None  # the files are inside the user's volume: the job's container reports a missing notebook

    async def launch(self, spawner: Any, job_id: str, owner: str, spec: JobSpec) -> dict:
        from ..spawners.docker_objects import visible_devices_env

        image = spawner.image
        await spawner.pull_image(image)
        env = server_environment(spawner)
        env.update(visible_devices_env(spawner.gpu_uuids))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spawner.gpu_uuids)
        env.update({HUB_VAR: spawner.gpu_hub_id, SERVER_VAR: owner, SPAWN_VAR: job_id})
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


class KubeJobs:
    """gpu-kube: a job is a pod (``restartPolicy: Never``) of the user's image, volumes and profile.

    The pod is the one KubeSpawner would make for the user's default server, turned
    into a run-to-completion pod (:func:`~gpuspawner.kube.jobpod.job_pod`). Its GPUs
    are the cluster's to place: the hub counted them (``reserve_gpus``, the same quota
    claim as a server's) and the pod asks for them (limits, node selector). How it
    ended comes from the pod (exit code, termination message); the pod is deleted then.
    """

    kind = "pod"

    async def check_files(self, spawner: Any, spec: JobSpec) -> str | None:
        return None  # the files are in the user's volume: the job's pod reports a missing notebook

    @staticmethod
    def _reuse_server_names(spawner: Any) -> None:
        """The user's default server's remembered names (its PVC): the job mounts the same home."""
        spawners = getattr(spawner.user, "spawners", None)
        server = spawners.get("") if isinstance(spawners, dict) else None  # never creates one
        pvc = getattr(server, "pvc_name", None)
        if pvc and getattr(server, "_pvc_exists", False):
            spawner.pvc_name = pvc
            spawner._pvc_exists = True

    async def launch(self, spawner: Any, job_id: str, owner: str, spec: JobSpec) -> dict:
        from jupyterhub.utils import exponential_backoff, maybe_future

        from ..kube.api import create_pod
        from ..kube.jobpod import TERMINATION_LOG, job_pod, job_pod_name

        self._reuse_server_names(spawner)
        if spawner.enable_user_namespaces:
            await spawner._ensure_namespace()
        if spawner.storage_pvc_ensure and not spawner._pvc_exists:  # as KubeSpawner does for a server
            timeout = spawner.k8s_api_request_timeout
            await exponential_backoff(
                lambda: spawner._make_create_pvc_request(spawner.get_pvc_manifest(), timeout),
                f"Could not create PVC {spawner.pvc_name}", timeout=spawner.k8s_api_request_retry_timeout,
            )
            spawner._pvc_exists = True
        manifest = await spawner.get_pod_manifest()
        if spawner.modify_pod_hook:
            manifest = await maybe_future(spawner.modify_pod_hook(spawner, manifest))
        server_pod = spawner.api.api_client.sanitize_for_serialization(manifest)
        env = {HUB_VAR: spawner.gpu_hub_id, SERVER_VAR: owner, SPAWN_VAR: job_id}
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
        from ..kube.api import read_pod

        return await read_pod(spawner.api, handle["namespace"], handle["pod"], spawner.k8s_api_request_timeout)

    async def running(self, spawner: Any, job_id: str, handle: dict) -> bool:
        from ..kube.jobpod import pod_end

        return not pod_end(await self._pod(spawner, handle)).ended

    async def ended(self, spawner: Any, job_id: str, handle: dict, spec: JobSpec) -> Ended:
        """How it ended (the notebook container's exit code and termination message); deletes the pod."""
        from ..kube.api import delete_pod
        from ..kube.jobpod import pod_end

        end = pod_end(await self._pod(spawner, handle))
        await delete_pod(spawner.api, handle["namespace"], handle["pod"], 0, spawner.k8s_api_request_timeout)
        outcome = {0: "completed", 1: "failed", 2: "failed", STOPPED_EXIT: "stopped"}.get(end.exit_code)
        if outcome is None and end.error:
            outcome = "failed"
        return Ended(end.exit_code, outcome, end.error)

    async def stop(self, spawner: Any, job_id: str, handle: dict) -> None:
        """Delete the pod: the executor gets SIGTERM (and writes its outputs), SIGKILL 3 s later; waits for that."""
        from ..kube.api import delete_pod
        from ..kube.jobpod import pod_end

        grace = 3
        if not await delete_pod(spawner.api, handle["namespace"], handle["pod"], grace,
                                spawner.k8s_api_request_timeout):
            return
        deadline = asyncio.get_running_loop().time() + grace + 2
        while asyncio.get_running_loop().time() < deadline:
            if pod_end(await self._pod(spawner, handle)).ended:
                return
            await asyncio.sleep(0.25)
