"""Notebook GPU jobs over REST: ``/hub/api/users/NAME/gpu-jobs`` (see the README for the contract).

- ``GET  /hub/api/users/NAME/gpu-job-options``: the compute types NAME may use,
  with live free counts (what jupyter-scheduler's Create Job dialog offers);
- ``POST /hub/api/users/NAME/gpu-jobs``: submit (201 with the job; 400, 403,
  409 with a sentence, and nothing started);
- ``GET  /hub/api/users/NAME/gpu-jobs``: NAME's jobs, newest first;
- ``GET  /hub/api/users/NAME/gpu-jobs/ID``: one job;
- ``DELETE /hub/api/users/NAME/gpu-jobs/ID``: cancel (the answer is the job once
  it has ended and its GPUs are free; ``?forget=1`` also deletes a finished job's record).

Access: the custom scope ``custom:gpu-jobs`` filtered to the user
(``custom:gpu-jobs!user``: every user has it for themselves, and so do their
servers' tokens, see :mod:`.setup`) or ``admin:servers`` for the user
(administrators). Anyone else gets 404, as for JupyterHub's own user resources.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone

from jupyterhub.apihandlers import APIHandler
from jupyterhub.scopes import has_scope
from tornado import web

from ..inputs import OptionsError, dumps, read_json
from ..jobmodel.spec import JOB_ID
from ..jobmodel.store import JobRecord, JobStore
from ..jobs.manager import JobManager
from ..owner import Owner
from ..placement import PlacementError
from ..profiles import Choice
from ..state import HubState, hub_state_of_app, settings_for

JOB_SCOPE = "custom:gpu-jobs"


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_json(record: JobRecord, estimates: Mapping[str, dict] | None = None) -> dict:
    """A job as the REST API shows it (the README's job contract); ``estimates``: owner -> the wait
    estimate of each request in the hub's queue (:func:`queue_estimates`), a queued job's is its ``estimate``."""
    spec = record.spec
    gpus = [{"uuid": g["uuid"], "name": g.get("name"), "index": g.get("index"), "host": g.get("host")}
            for g in record.gpus]
    return {
        "id": record.id, "user": record.user, "name": record.name, "kind": "job",
        "state": record.state, "reason": record.reason,
        "profile": spec.get("profile"), "gpu_count": spec.get("gpu_count"), "gpu_model": spec.get("gpu_model"),
        "image": spec.get("image"), "gpus": gpus,
        "notebook": spec.get("notebook"), "outputs": spec.get("outputs"), "log": spec.get("log"),
        "parameters": spec.get("parameters") or {}, "time_limit": spec.get("time_limit"),
        "created": _iso(record.created), "started": _iso(record.started), "ended": _iso(record.ended),
        "exit_code": record.exit_code,
        "estimate": (estimates or {}).get(str(Owner.of_job(record.user, record.id))) if record.state == "queued"
        else None,
    }


def queue_estimates(state: HubState) -> dict[str, dict]:
    """Owner -> the last wait estimate of each request waiting in the hub's queue (REST fields)."""
    now = time.time()
    return {w.owner: w.estimate.as_json(now) for w in state.queue.waiters() if w.estimate is not None}


def job_manager(settings: dict) -> JobManager:
    """The hub's job manager (made on first use, on the hub's :class:`HubState`)."""
    state: HubState = hub_state_of_app(settings)
    def make() -> JobManager:
        gpu_settings = settings_for(settings["config"], settings.get("spawner_class"))
        store = state.cache(JobStore, lambda: JobStore(settings["db"].get_bind()))
        manager = JobManager(state, store, settings, gpu_settings.gpu_job_time_limit)
        state.job_counts = manager.counts
        return manager

    return state.cache(JobManager, make)


class _JobsBase(APIHandler):
    def check_access(self, user_name: str):
        if not self.current_user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        for scope in (JOB_SCOPE, "admin:servers"):
            if has_scope(f"{scope}!user={user_name}", self.parsed_scopes, db=self.db):
                break
        else:
            raise web.HTTPError(404, "No access to resources or resources not found")
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {user_name}")
        return user

    @property
    def jobs(self) -> JobManager:
        return job_manager(self.settings)


class JobOptionsHandler(_JobsBase):
    """``GET /hub/api/users/NAME/gpu-job-options``: the compute types NAME may use, with free counts."""

    async def get(self, user_name: str) -> None:
        user = self.check_access(user_name)
        manager = self.jobs
        manager.check_runs_jobs()
        spawner = manager.spawner_for(user, str(Owner.of_job(user.name, "options")))
        context = await spawner.options_form_context()
        types = await compute_types(context, spawner.never_fits)
        self.set_header("Cache-Control", "no-store")
        self.finish(dumps({"compute_types": types, "simulated": context["simulated"]}))


async def compute_types(
    context: dict, never_fits: Callable[[Choice], Awaitable[PlacementError | None]],
) -> list[dict]:
    """The compute types of a spawn form's context: CPU only, and each GPU count of each model a profile offers.

    A count of a model that ``never_fits`` refuses (more GPUs than any machine of
    this hub has of it, on cluster backends what the cluster says no node could
    ever hold) is not offered: it could never run. ``fits_now``: that many are free
    on one machine now. One entry per label: the first profile offering it.
    """
    types = []
    for entry in context["profiles"]:
        profile = entry["profile"]
        for count in profile.gpu_counts:
            if count == 0:
                types.append({"label": "CPU only", "profile": profile.slug, "gpus": 0, "gpu_model": "any",
                              "free": None, "total": None, "queue": False})
                continue
            for model in entry["models"]:
                if await never_fits(Choice(profile, count, model.slug)) is not None:
                    continue
                types.append({"label": f"{count} x {model.name}", "profile": profile.slug, "gpus": count,
                              "gpu_model": model.slug, "free": model.free, "total": model.total,
                              # free on one machine now (unknown availability: the cluster decides)
                              "fits_now": count <= model.largest if model.known else True,
                              "queue": profile.queue})
    seen, unique = set(), []
    for t in types:
        if t["label"] not in seen:
            seen.add(t["label"])
            unique.append(t)
    return unique


class JobsHandler(_JobsBase):
    """``GET``: a user's jobs; ``POST``: submit one."""

    async def get(self, user_name: str) -> None:
        self.check_access(user_name)
        records = self.jobs.list(user_name)
        self.set_header("Cache-Control", "no-store")
        estimates = queue_estimates(self.jobs.state)
        self.finish(dumps({"jobs": [job_json(r, estimates) for r in records]}))

    async def post(self, user_name: str) -> None:
        user = self.check_access(user_name)
        try:
            body = read_json(self.request.body)
        except OptionsError as e:
            raise web.HTTPError(400, "%s", str(e)) from None
        record = await self.jobs.submit(user, {} if body is None else body)
        self.set_status(201)
        self.finish(dumps(job_json(record)))


class JobHandler(_JobsBase):
    """``GET``: one job; ``DELETE``: cancel it (and with ``?forget=1`` delete its record once ended)."""

    def _record(self, user_name: str, job_id: str) -> JobRecord:
        record = self.jobs.get(job_id)
        if record is None or record.user != user_name:
            raise web.HTTPError(404, f"No job {job_id} of {user_name}")
        return record

    async def get(self, user_name: str, job_id: str) -> None:
        self.check_access(user_name)
        self.set_header("Cache-Control", "no-store")
        self.finish(dumps(job_json(self._record(user_name, job_id), queue_estimates(self.jobs.state))))

    async def delete(self, user_name: str, job_id: str) -> None:
        self.check_access(user_name)
        record = await self.jobs.cancel(self._record(user_name, job_id))
        if self.get_argument("forget", "") and not record.active:
            self.jobs.store.delete(record.id)
        self.finish(dumps(job_json(record)))


def handlers() -> list[tuple[str, type]]:
    user = r"/api/users/([^/]+)"
    return [
        (user + r"/gpu-job-options", JobOptionsHandler),
        (user + r"/gpu-jobs", JobsHandler),
        (user + rf"/gpu-jobs/({JOB_ID.pattern})", JobHandler),
    ]
