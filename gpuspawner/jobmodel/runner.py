"""What the job manager asks of a backend: :class:`JobRunner`, and the helpers every runner shares.

A job runs through the job's own spawner object (an instance of the hub's
spawner class, made for the job by :class:`gpuspawner.jobs.manager.JobManager`
with the ledger owner ``user/job/<id>``), so a job gets what a server of that
user would: on gpu-local the user's account (made on first use where the hub
makes them), home and device fence; on gpu-docker the user's image, volumes and
a device request by UUID; on gpu-kube the pod of the user's default server; on
gpu-slurm the server's ``batch_script``. A runner uses only the spawner's
public methods and traits (each backend documents the few it adds for its
runner), never its private names.

What marks a job as the hub's, for finding it after a hub restart, is the same
as for servers (:mod:`gpuspawner.marks`): ``GPUSPAWNER_HUB``/``SERVER``/``SPAWN``
in the environment (the owner ``user/job/<id>`` and the job id), or the
container labels and pod annotations.

A job's environment is its server's: :func:`server_environment` is the
backend's own ``get_env`` (``env_keep``, ``environment``, the user's HOME, its
GPUs, the hub's marks; in the runnable default with simulated GPUs, the
stand-in NVML's variables), less what makes a server the hub's server. gpu-slurm
submits through batchspawner, which uses the same ``get_env``.

Each backend's runner lives in its own folder: :class:`~gpuspawner.backends.local.jobs.LocalJobs`,
:class:`~gpuspawner.backends.docker.jobs.DockerJobs`, :class:`~gpuspawner.backends.kube.jobs.KubeJobs`,
:class:`~gpuspawner.backends.slurm.jobs.SlurmJobs`; a spawner class names its own in
``gpu_job_runner`` (an import path; None: that backend runs no jobs). Pure but for
:func:`notebook_problem` and :func:`read_status`, which read the user's files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from ..inputs import shown
from ..marks import marks
from .outcome import Ended
from .spec import JobSpec

__all__ = ["EXECUTOR", "JobRunner", "executor_args", "job_marks", "notebook_problem", "read_status",
           "server_environment", "status_path"]


class JobRunner(Protocol):
    """How one backend starts, watches and ends a notebook GPU job: all the job manager calls.

    ``spawner`` is always the job's own spawner object, its GPUs already reserved
    (``gpu_allocation``, ``gpu_uuids``) or counted, its profile applied; ``handle`` is
    what :meth:`launch` answered, saved in the job's record (so a restarted hub can
    look at the job again with a new spawner object and a new runner). Runners
    subclass this class, and so inherit :meth:`waiting`.
    """

    #: what a job is on this backend, in words: "process", "container", "pod", "slurm job"
    kind: str

    async def check_files(self, spawner: Any, spec: JobSpec) -> str | None:
        """A sentence (the 400 the user gets) when the job's notebook is not in the user's files;
        None when it is, or when the hub cannot look (the job then says so)."""
        ...

    async def launch(self, spawner: Any, job_id: str, owner: str, spec: JobSpec) -> dict:
        """Start the job, marked as ``owner``'s (``user/job/<id>``); answer its handle (JSON: where it runs)."""
        ...

    async def running(self, spawner: Any, job_id: str, handle: dict) -> bool:
        """Whether the job still runs (or waits in the backend's own queue)."""
        ...

    async def waiting(self, spawner: Any, job_id: str, handle: dict) -> str | None:
        """Why the backend's own queue holds the launched job, in words; None once it runs (the default:
        backends without a queue of their own)."""
        return None

    async def ended(self, spawner: Any, job_id: str, handle: dict, spec: JobSpec) -> Ended:
        """How the job ended (called once it no longer runs, or after :meth:`stop`); cleans up what it left."""
        ...

    async def stop(self, spawner: Any, job_id: str, handle: dict) -> None:
        """End the job (cancel, time limit); returns once it has ended or could not be ended."""
        ...


#: the executor, by its public name (``gpuspawner.jobs.execute``, an alias of :mod:`.execute` that
#: also works with an older gpuspawner installed in a user's image)
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


def job_marks(spawner: Any, owner: str, job_id: str) -> dict[str, str]:
    """The environment that marks a job as this hub's ``owner`` (``user/job/<id>``), started as ``job_id``."""
    return marks(spawner.gpu_hub_id, owner, job_id)


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
