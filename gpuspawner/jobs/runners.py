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
Each backend's runner lives in its own folder: :class:`~gpuspawner.backends.local.jobs.LocalJobs`,
:class:`~gpuspawner.backends.docker.jobs.DockerJobs`, :class:`~gpuspawner.backends.kube.jobs.KubeJobs`,
:class:`~gpuspawner.backends.slurm.jobs.SlurmJobs`; the helpers they share are here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..backends.local.processes import HUB_VAR, SERVER_VAR, SPAWN_VAR  # noqa: F401 (the marks every runner sets, re-exported)
from ..inputs import shown
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
