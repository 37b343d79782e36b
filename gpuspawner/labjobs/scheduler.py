"""jupyter-scheduler on the hub's GPUs: notebook jobs from JupyterLab's Create Job dialog.

Set as jupyter-scheduler's classes by the ``gpuspawner.labjobs`` server extension
(enabled on install) in every single-user server:

- :class:`GPUEnvironments` (``SchedulerApp.environment_manager_class``): the
  GPU choices the user may use, as jupyter-scheduler's *compute types*
  (``"1 x Tesla T4 - 1 of 2 free"``, ``"CPU only"``), read live from the hub's
  ``/hub/api/users/NAME/gpu-job-options``;
- :class:`GPUScheduler` (``SchedulerApp.scheduler_class``): a job created in
  the dialog is handed to the hub (``POST /hub/api/users/NAME/gpu-jobs``), which
  places it on its own GPUs and runs it on the hub's backend, independently of
  this server (stopping the server does not stop the job), under the same id
  as in the job list: the hub's job API, ``/hub/api/gpus`` and the usage
  records name the job by the Job ID JupyterLab shows. Its state and start
  and end times come back from the hub into jupyter-scheduler's job list, the
  GPUs it ran on and why it ended into the job's tags, the error of a job that
  did not complete into its status message; the executed notebook lands in jupyter-scheduler's staging area in
  the user's files, where the job list links to it. Stop and delete in the job
  list cancel the hub's job.

Outside a hub (no ``JUPYTERHUB_API_URL``), or on a hub without the job API,
both behave as jupyter-scheduler's defaults.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from jupyter_scheduler.environments import CondaEnvironmentManager
from jupyter_scheduler.exceptions import SchedulerError
from jupyter_scheduler.models import CreateJob, CreateJobDefinition, DescribeJob, Status, UpdateJob
from jupyter_scheduler.orm import Job
from jupyter_scheduler.scheduler import Scheduler
from traitlets import default

HUB_JOB_FILE = ".gpuspawner-job"  # in a job's staging folder: the hub's id of the job
_AGAIN = "Select the notebook in the file browser, right-click it and choose Create Job."
#: What the Create Job form says when it cannot create a job (jupyter-scheduler shows the sentence).
#: Its Input file is read-only and filled from the file browser's selection, even by the Create a
#: job button of a notebook's toolbar: with nothing selected there, the form sends it empty.
MESSAGES = {
    "no_input": "No notebook to run: the form's Input file is empty (JupyterLab fills it from the file "
                "browser's selection, and nothing was selected there). " + _AGAIN,
    "missing_input": "The input file {path} does not exist in your files (moved, renamed or deleted?). " + _AGAIN,
    "unknown_compute_type": "Unknown compute type {chosen!r}; choose one the dialog lists.",
}
_STATUS = {"queued": Status.QUEUED, "starting": Status.IN_PROGRESS, "running": Status.IN_PROGRESS,
           "completed": Status.COMPLETED, "failed": Status.FAILED, "timed_out": Status.FAILED,
           "cancelled": Status.STOPPED}


class HubJobs:
    """The hub's job API for this server's user, with the server's own token."""

    def __init__(self) -> None:
        self.api = os.environ.get("JUPYTERHUB_API_URL", "").rstrip("/")
        self.token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.user = os.environ.get("JUPYTERHUB_USER", "")

    @property
    def available(self) -> bool:
        return bool(self.api and self.token and self.user)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{self.api}/users/{self.user}/{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {"message": str(e)}

    def compute_types(self) -> list[dict] | None:
        """The hub's compute types for this user; None where the hub has no job API."""
        if not self.available:
            return None
        try:
            code, data = self.call("GET", "gpu-job-options")
        except OSError:
            return None
        return data.get("compute_types") if code == 200 else None


def parameter_value(text: str):
    """A parameter from the dialog (always text) as jupyter-scheduler means it: a Python literal if it is one."""
    import ast

    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # no literal (or one too deep)
        return text
    return value if isinstance(value, (bool, int, float, str)) else text


def label(compute_type: dict) -> str:
    """How the Create Job dialog lists a compute type: with its free count where it has one."""
    if compute_type.get("free") is None:
        return compute_type["label"]
    return f"{compute_type['label']} - {compute_type['free']} of {compute_type['total']} free"


def find_compute_type(types: list[dict], chosen: str | None) -> dict | None:
    """The compute type a job asked for (its label, with or without the free count)."""
    if not types:
        return None
    if not chosen:
        return next((t for t in types if t["gpus"] == 0), types[0])
    name = chosen.split(" - ", 1)[0]
    return next((t for t in types if t["label"] == name), None)


class GPUEnvironments(CondaEnvironmentManager):
    """This server's Python environment(s), with the hub's GPU choices as compute types."""

    async def list_environments(self):  # awaited by jupyter-scheduler's handler
        environments = super().list_environments()
        types = await asyncio.to_thread(HubJobs().compute_types)
        if types:
            labels = [label(t) for t in types]
            default_type = next((label(t) for t in types if t["gpus"] > 0 and t.get("fits_now")), labels[0])
            for env in environments:
                env.compute_types = labels
                env.default_compute_type = default_type
        return environments


class GPUScheduler(Scheduler):
    """jupyter-scheduler's scheduler, running each job on its own GPUs through the hub."""

    @default("staging_path")
    def _default_staging_path(self):
        # in the user's files, where the hub's job (a process or container of the user) reads and writes
        return os.path.join(self.root_dir, ".jupyter", "scheduler_staging_area")

    @property
    def hub(self) -> HubJobs:
        return HubJobs()

    def _relative(self, path: str) -> str:
        relative = os.path.relpath(path, self.root_dir)
        if relative.startswith(".."):
            raise SchedulerError(f"The scheduler's staging area {path} is outside your files ({self.root_dir}).")
        return relative

    def _check_input(self, input_uri: str | None) -> None:
        """Refuse a job (or job definition) whose notebook is not given, or not in the user's files."""
        if not (input_uri or "").strip():
            raise SchedulerError(MESSAGES["no_input"])
        if not self.file_exists(input_uri):
            raise SchedulerError(MESSAGES["missing_input"].format(path=input_uri))

    def create_job_definition(self, model: CreateJobDefinition) -> str:
        self._check_input(model.input_uri)  # jupyter-scheduler's own sentence names no file when it is empty
        return super().create_job_definition(model)

    def create_job(self, model: CreateJob) -> str:
        hub = self.hub
        types = hub.compute_types()
        if types is None:
            return super().create_job(model)
        chosen = find_compute_type(types, model.compute_type)
        if chosen is None:
            raise SchedulerError(MESSAGES["unknown_compute_type"].format(chosen=model.compute_type))
        if not model.job_definition_id:  # a definition's run reads the definition's own staged copy
            self._check_input(model.input_uri)
        with self.db_session() as session:
            offered = [f for f in (model.output_formats or ["ipynb"]) if f in ("ipynb", "html")]
            model.output_formats = offered or ["ipynb"]
            job = Job(**model.dict(exclude_none=True, exclude={"input_uri"}))
            job.compute_type = chosen["label"]
            session.add(job)
            session.commit()
            staging = self.get_staging_paths(DescribeJob.from_orm(job))
            self.copy_input_file(model.input_uri, staging["input"])
            body = {
                "profile": chosen["profile"], "gpus": chosen["gpus"], "gpu_model": chosen["gpu_model"],
                "notebook": self._relative(staging["input"]),
                "outputs": {fmt: self._relative(staging[fmt]) for fmt in model.output_formats},
                "log": self._relative(str(Path(staging["input"]).with_suffix(".log"))),
                "parameters": {k: parameter_value(v) for k, v in (model.parameters or {}).items()},
                "name": model.name, "id": job.job_id,  # the hub's job gets the id the job list shows
            }
            code, answer = hub.call("POST", "gpu-jobs", body)
            if code != 201:
                session.delete(job)
                session.commit()
                raise SchedulerError(answer.get("message") or f"The hub refused the job (HTTP {code}).")
            Path(staging["input"]).with_name(HUB_JOB_FILE).write_text(answer["id"])
            self._apply(session, job, answer)
            session.commit()
            return job.job_id

    # ------------------------------------------------------------ the hub's truth -> the job list

    def _hub_id(self, job: Job) -> str | None:
        staging = self.get_staging_paths(DescribeJob.from_orm(job))
        try:
            return Path(staging["input"]).with_name(HUB_JOB_FILE).read_text().strip()
        except OSError:
            return None

    @staticmethod
    def _apply(session, job: Job, answer: dict) -> None:
        from datetime import datetime

        def ms(text: str | None) -> int | None:
            return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000) if text else None

        job.status = _STATUS.get(answer["state"], Status.FAILED)
        job.start_time = ms(answer.get("started"))
        job.end_time = ms(answer.get("ended"))
        gpus = [f"{g['name']} {g['uuid']}" for g in answer.get("gpus") or []]
        # tags (shown in the job's detail view): the GPUs it got and, once ended, why it ended
        job.tags = [f"GPU: {g}" for g in gpus] or ["GPU: none"]
        if answer["state"] == "queued":
            estimate = (answer.get("estimate") or {}).get("text")  # where it waits in the hub's own queue
            job.status_message = f"waiting for GPUs in the hub's queue. {estimate}" if estimate else \
                "waiting for GPUs in the hub's queue"
        elif answer["state"] in ("starting", "running"):
            job.status_message = None
        else:
            job.tags = [*job.tags, f"ended: {answer['reason']}"]
            # jupyter-scheduler shows a status message as an alert: only for jobs that did not complete
            job.status_message = None if answer["state"] == "completed" else answer["reason"]

    async def _sync(self) -> None:
        """Bring the active jobs' states from the hub (its calls in threads, side by side)."""
        hub = self.hub
        if not hub.available:
            return
        with self.db_session() as session:
            active = session.query(Job).filter(Job.status.in_([Status.QUEUED, Status.IN_PROGRESS, Status.STOPPING,
                                                                Status.CREATED])).all()
            ids = {job.job_id: self._hub_id(job) for job in active}
        ids = {job_id: hub_id for job_id, hub_id in ids.items() if hub_id}
        answers = await asyncio.gather(*(asyncio.to_thread(hub.call, "GET", f"gpu-jobs/{h}") for h in ids.values()),
                                       return_exceptions=True)
        with self.db_session() as session:
            for job_id, reply in zip(ids, answers, strict=True):
                if isinstance(reply, OSError):  # the hub out of reach: the list shows what it last knew
                    self.log.warning("The hub's job API cannot be reached: %s", reply)
                    continue
                if isinstance(reply, BaseException):
                    raise reply
                code, answer = reply
                job = session.query(Job).filter(Job.job_id == job_id).one_or_none()
                if code == 200 and job is not None:
                    self._apply(session, job, answer)
            session.commit()

    # jupyter-scheduler's handlers await these (ensure_async): the job list's polling never
    # waits on the hub inside the server's event loop

    async def list_jobs(self, query):
        await self._sync()
        return super().list_jobs(query)

    async def get_job(self, job_id: str, job_files: bool | None = True):
        await self._sync()
        return super().get_job(job_id, job_files)

    async def count_jobs(self, query) -> int:
        await self._sync()
        return super().count_jobs(query)

    def stop_job(self, job_id: str) -> None:
        with self.db_session() as session:
            job = session.query(Job).filter(Job.job_id == job_id).one()
            hub_id = self._hub_id(job)
            if hub_id is None:
                return super().stop_job(job_id)
            code, answer = self.hub.call("DELETE", f"gpu-jobs/{hub_id}")
            if code == 200:
                self._apply(session, job, answer)
                session.commit()

    def update_job(self, job_id: str, model: UpdateJob):
        if model.status == Status.STOPPED:
            return self.stop_job(job_id)
        return super().update_job(job_id, model)
