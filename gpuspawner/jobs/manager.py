"""The hub's notebook GPU jobs: :class:`JobManager` (one per hub, on its :class:`~gpuspawner.state.HubState`).

A job goes through the same door as a server: an object of the hub's spawner
class is made for it (owner ``user/job/<id>`` in the ledger), its GPU choice is
checked by the same profile rules (groups, counts, models), placed by the same
placement under the same quotas, and waits in the same queue when its profile
queues. Then the backend's runner (a :class:`~gpuspawner.jobmodel.runner.JobRunner`,
the only way the manager reaches the backend) starts it, and the manager
watches it until it ends (completed, failed, cancelled, or past its time
limit), when its GPUs are given back at once. A backend with a queue of its
own (gpu-slurm: Slurm's) may hold a launched job: its runner's ``waiting``
says why, and the job is ``queued`` with those words until it runs.

Restart safety: the job's record is in the hub's database before anything
runs, with where it runs once it does; the job's process or container carries
the hub's marks. A restarted hub re-reads every active record: a job still
running is watched again (never started twice), one that ended while the hub
was down is recorded with its outcome and its GPUs freed, a queued one waits
again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid as uuidlib
from collections import Counter
from typing import Any

from tornado import web
from traitlets.utils.importstring import import_item

from ..gpu import GPU
from ..jobmodel.outcome import outcome_of
from ..jobmodel.runner import JobRunner
from ..jobmodel.spec import JobSpec, parse_job, requested_job_id
from ..jobmodel.store import ACTIVE, STATES, JobExists, JobRecord, JobStore
from ..notifications import Teller, job_told
from ..owner import Owner
from ..profiles import OptionsError

log = logging.getLogger("gpuspawner.jobs")
POLL = 0.25  # seconds between looks at a running job
#: why the hub itself cancels a job (its usage record's end reason) -> the job's reason in words
CANCELLED = {"budget": "cancelled: its user's GPU budget was spent"}


def _error(status: int, message: str) -> web.HTTPError:
    error = web.HTTPError(status, "%s", message)
    error.jupyterhub_message = message
    return error


def _taken(job_id: str) -> web.HTTPError:
    return _error(409, f"id: a job with id {job_id} exists already; leave 'id' out and the hub makes a new one")


def _gpu(record: dict) -> GPU:
    values = {k: v for k, v in record.items() if k in GPU.__dataclass_fields__}
    if values.get("compute_capability") is not None:
        values["compute_capability"] = tuple(values["compute_capability"])
    return GPU(**values)


class JobManager:
    """Submit, watch, cancel and recover one hub's jobs."""

    def __init__(self, state: Any, store: JobStore, settings: dict, time_limit: float) -> None:
        self.state = state
        self.store = store
        self.settings = settings
        self.time_limit = time_limit
        self.spawner_class = settings["spawner_class"]
        runner_path = getattr(self.spawner_class, "gpu_job_runner", None)
        self.runner: JobRunner | None = import_item(runner_path)() if runner_path else None
        if self.runner is None:
            log.info("%s runs no notebook GPU jobs: the job API answers 501", self.spawner_class.__name__)
        self._tasks: dict[str, asyncio.Task] = {}
        self._cancel: dict[str, str] = {}  # job id -> "cancelled" | "timed_out"
        self._submitting: set[str] = set()  # ids of jobs being submitted now
        self._states: dict[str, str] = {r.id: r.state for r in store.list(limit=100_000)}
        self._recovered: asyncio.Future | None = None
        self._closing = False

    # ------------------------------------------------------------ reading

    def counts(self) -> dict[str, int]:
        counts = Counter(self._states.values())
        return {state: counts.get(state, 0) for state in STATES}

    def get(self, job_id: str) -> JobRecord | None:
        return self.store.get(job_id)

    def list(self, user: str | None = None) -> list[JobRecord]:
        return self.store.list(user)

    def _save(self, record: JobRecord) -> JobRecord:
        self.store.save(record)
        self._states[record.id] = record.state
        return record

    def _add(self, record: JobRecord) -> JobRecord:
        """A new job's first record (409 when its id was taken meanwhile)."""
        try:
            self.store.add(record)
        except JobExists:
            raise _taken(record.id) from None
        self._states[record.id] = record.state
        return record

    # ------------------------------------------------------------ the job's spawner

    def spawner_for(self, user: Any, owner: str) -> Any:
        """A new object of the hub's spawner class for ``user``'s job ``owner`` (``user/job/<id>``)."""
        spawner = self.spawner_class(
            user=user, hub=self.settings.get("hub"), config=self.settings["config"],
            orm_spawner=None,
        )
        spawner.hub_state = self.state
        spawner.gpu_owner_override = owner
        return spawner

    def _user(self, name: str) -> Any | None:
        try:
            return self.settings["users"][name]
        except KeyError:
            return None

    def check_runs_jobs(self) -> None:
        """501 with a sentence where the hub's backend runs no notebook GPU jobs (its ``gpu_job_runner`` is None)."""
        if self.runner is None:
            name = getattr(self.spawner_class, "backend_name", "gpuspawner")
            name = self.spawner_class.__name__ if name == "gpuspawner" else name
            raise _error(501, f"This hub's backend ({name}) does not run notebook GPU jobs: run the notebook in "
                              "your server instead, or ask an admin for a backend that runs them (gpu-local, "
                              "gpu-docker, gpu-kube, gpu-slurm).")

    # ------------------------------------------------------------ submitting

    async def submit(self, user: Any, body: Any) -> JobRecord:
        """Check and start (or queue) a job; HTTP 400/403/409/501 with a sentence, and nothing started.

        Everything that can refuse runs before anything is reserved or recorded: the body
        (:func:`~.spec.parse_job`), the profile rules, the notebook's file, and for a queued
        profile whether the request could ever fit; then the reservation (409 when no room).
        """
        await self.recovered()
        self.check_runs_jobs()
        try:
            spec = parse_job(body, self.time_limit)
            job_id = requested_job_id(body) or uuidlib.uuid4().hex
        except OptionsError as e:
            raise _error(400, str(e)) from e
        if job_id in self._submitting or self.store.get(job_id) is not None:
            raise _taken(job_id)
        self._submitting.add(job_id)  # one submission per id at a time (they share a ledger owner)
        try:
            return await self._submit(user, spec, job_id)
        finally:
            self._submitting.discard(job_id)

    async def _submit(self, user: Any, spec: JobSpec, job_id: str) -> JobRecord:
        owner = str(Owner.of_job(user.name, job_id))
        spawner = self.spawner_for(user, owner)
        spawner.gpu_job_own_limit = spec.time_limit  # bookings judge the job by when it must end
        choice = await spawner.apply_job_options(spec.options)  # 400/403 as for a server
        problem = await self.runner.check_files(spawner, spec)
        if problem:
            raise _error(400, problem)
        if choice.profile.queue and choice.gpus:  # a job that could never run is not queued
            refusal = await spawner.never_fits(choice)
            if refusal is not None:
                raise _error(409, str(refusal))
        record = JobRecord(
            id=job_id, user=user.name, name=spec.name, state="queued", created=time.time(),
            spec={**spec.to_dict(), "profile": choice.profile.slug, "gpu_count": choice.gpus,
                  "gpu_model": choice.gpu_model, "image": choice.image},
        )
        with self.state.flights.flying(owner):  # until its watch (below) takes over
            if not (choice.profile.queue and choice.gpus):
                await spawner.reserve_gpus()  # a refusal is the 409 a server gets; nothing is saved
                record = record.changed(state="starting", gpus=tuple(g.to_dict() for g in spawner.gpu_allocation))
                try:
                    self._add(record)
                except BaseException:
                    spawner.release_gpus()
                    raise
            else:
                self._add(record)
            self._start(record, spawner)
        return record

    def _start(self, record: JobRecord, spawner: Any, resume: bool = False) -> None:
        # while the manager runs and watches a job, the job's charge is the manager's: the hub's
        # reconciliation with the cluster leaves it alone (the watch frees it when the job ends)
        flight = self.state.flights.begin(spawner.gpu_owner)
        task = asyncio.ensure_future(self._run(record, spawner, resume))
        self._tasks[record.id] = task

        def done(_task: asyncio.Task, job_id: str = record.id) -> None:
            self._tasks.pop(job_id, None)
            self.state.flights.end(flight)

        task.add_done_callback(done)

    async def _run(self, record: JobRecord, spawner: Any, resume: bool) -> None:
        spec = JobSpec.from_dict(record.spec)
        spawner.gpu_job_own_limit = spec.time_limit
        try:
            if record.state == "queued":
                try:
                    await spawner.reserve_gpus()
                except web.HTTPError as e:
                    message = getattr(e, "jupyterhub_message", None) or e.log_message or str(e)
                    self._finish(record, spawner, "failed", message, None)
                    return
                except asyncio.CancelledError:
                    if self._closing:
                        raise
                    self._finish(record, spawner, "cancelled", "cancelled while queued", None)
                    return
                record = self._save(record.changed(
                    state="starting", gpus=tuple(g.to_dict() for g in spawner.gpu_allocation)))
            if not resume:
                handle = await self.runner.launch(spawner, record.id, spawner.gpu_owner, spec)
                record = await self._progress(self._save(record.changed(handle=handle)), spawner)
            await self._watch(record, spawner, spec)
        except Exception as e:
            log.exception("job %s of %s", record.id, record.user)
            if record.handle:
                try:
                    await self.runner.stop(spawner, record.id, record.handle)
                except Exception:
                    log.exception("job %s: could not stop it", record.id)
            message = getattr(e, "jupyterhub_message", None) or str(e)  # e.g. Slurm refusing it at sbatch
            self._finish(record, spawner, "failed", f"the hub could not run it: {message}", None)

    async def _progress(self, record: JobRecord, spawner: Any) -> JobRecord:
        """A launched job is ``queued`` while it waits in the backend's own queue (a runner's
        ``waiting`` says why, in words: Slurm's), else ``running`` (from when it started)."""
        words = await self.runner.waiting(spawner, record.id, record.handle)
        if words:
            if record.state != "queued" or record.reason != words:
                record = self._save(record.changed(state="queued", reason=words, started=None))
        elif record.state != "running":
            record = self._save(record.changed(state="running", reason="", started=time.time()))
            log.info("job %s of %s started on GPUs %s", record.id, record.user,
                     ", ".join(spawner.gpu_uuids) or "those its backend gave it")
        return record

    async def _watch(self, record: JobRecord, spawner: Any, spec: JobSpec) -> None:
        limit = spec.time_limit or self.time_limit
        while True:
            reason = self._cancel.get(record.id)
            if reason is None and record.started and time.time() - record.started > limit:
                reason = self._cancel[record.id] = "timed_out"
            if reason is not None:
                await self.runner.stop(spawner, record.id, record.handle)
            elif await self.runner.running(spawner, record.id, record.handle):
                record = await self._progress(record, spawner)
                await asyncio.sleep(POLL)
                continue
            ended = await self.runner.ended(spawner, record.id, record.handle, spec)
            if reason == "timed_out":
                state, text = "timed_out", f"stopped at its time limit ({limit:g} s)"
            elif reason is not None:
                state, text = "cancelled", CANCELLED.get(reason, "cancelled")
            else:
                state, text = outcome_of(ended)
            self._finish(record, spawner, state, text, ended.exit_code, usage_reason=reason if reason in CANCELLED
                         else None)
            return

    def _finish(self, record: JobRecord, spawner: Any, state: str, reason: str, exit_code: int | None,
                usage_reason: str | None = None) -> None:
        # the usage record ends with the job's own outcome (completed, failed, cancelled, timed_out),
        # or why the hub cancelled it (``usage_reason``: budget), also when the hub found it gone after a
        # restart and only now read how it ended
        self.state.usage.end_reason(spawner.gpu_owner, usage_reason or state, replaces_crashed=True)
        spawner.release_gpus()
        self._cancel.pop(record.id, None)
        self._save(record.changed(state=state, reason=reason, ended=time.time(), exit_code=exit_code))
        log.info("job %s of %s %s: %s; its GPUs are free", record.id, record.user, state, reason)
        told = job_told(record.name, record.id, state, reason)
        if told is not None:
            self.state.cache(Teller).later(record.user, "job", *told)

    # ------------------------------------------------------------ cancelling

    async def cancel(self, record: JobRecord, wait: float = 10.0, reason: str = "cancelled") -> JobRecord:
        """Stop an active job (its GPUs are freed when it has ended); a finished one is left as it is.
        ``reason``: ``"cancelled"`` (its user, an admin, the API) or a key of :data:`CANCELLED` (the hub's)."""
        if not record.active:
            return record
        self._cancel.setdefault(record.id, reason)
        task = self._tasks.get(record.id)
        if task is not None and record.state == "queued" and not record.handle:  # waiting in the hub's queue
            task.cancel()
        if task is not None:
            await asyncio.wait([task], timeout=wait)
        return self.store.get(record.id) or record

    # ------------------------------------------------------------ after a hub restart

    def recovered(self) -> asyncio.Future:
        """Recover the active jobs once (every caller waits for it)."""
        if self._recovered is None:
            self._recovered = asyncio.ensure_future(self._recover())
        return asyncio.shield(self._recovered)

    async def _recover(self) -> None:
        active = [r for r in self.store.list(limit=100_000) if r.state in ACTIVE]
        if not active:
            await self._reconcile_at_start()
            return
        first = self._user(active[0].user)
        if first is not None:  # rebuild the ledger from what really runs, once, before anything else
            await self.spawner_for(first, str(Owner.of_job(first.name, active[0].id))).ensure_reconciled()
        for record in sorted(active, key=lambda r: r.created):
            user = self._user(record.user)
            if user is None:
                self._save(record.changed(state="failed", reason="its user no longer exists", ended=time.time()))
                continue
            spawner = self.spawner_for(user, str(Owner.of_job(record.user, record.id)))
            spawner.gpu_allocation = tuple(_gpu(g) for g in record.gpus)
            launched = not (record.state in ("queued", "starting") and not record.handle)
            # a launched job holds its GPUs only while it still runs (the reconciliation has kept them
            # then): one that ended while the hub was down is recorded with its outcome, holding nothing
            runs = launched and await self.runner.running(spawner, record.id, record.handle)
            if record.gpus and (runs or not launched):
                self.state.ledger.adopt(spawner.gpu_owner, [g["uuid"] for g in record.gpus])
            if not launched:
                try:
                    await spawner.apply_job_options(record.spec.get("options", {}))
                except web.HTTPError as e:
                    self._finish(record, spawner, "failed", getattr(e, "jupyterhub_message", str(e)), None)
                    continue
                spawner.release_gpus()
                record = self._save(record.changed(state="queued", gpus=()))
                log.info("job %s of %s: waiting for GPUs again after the hub's restart", record.id, record.user)
                self._start(record, spawner)
            elif runs:
                log.info("job %s of %s still runs (or waits in its backend's queue): watching it again",
                         record.id, record.user)
                self._start(record, spawner, resume=True)
            else:
                spec = JobSpec.from_dict(record.spec)
                ended = await self.runner.ended(spawner, record.id, record.handle, spec)
                state, text = outcome_of(ended)
                self._finish(record, spawner, state, text + " (ended while the hub was down)", ended.exit_code)

    async def _reconcile_at_start(self) -> None:
        """Where the cluster holds the truth, reconcile the ledger with it now (which starts its timer),
        even when no server or job is left to poll: jobs of this hub the cluster still runs are
        counted or cancelled from the hub's start. Through a spawner of any user (none: no hub user yet)."""
        if not getattr(self.spawner_class, "reconciles_with_cluster", False) or self.settings.get("db") is None:
            return
        from jupyterhub import orm

        found = self.settings["db"].query(orm.User).first()
        user = self._user(found.name) if found is not None else None
        if user is None:
            return
        try:
            await self.spawner_for(user, str(Owner.of_server(user.name))).ensure_reconciled()
        except Exception as e:  # the first poll or spawn tries again
            log.warning("the GPU ledger was not reconciled with the cluster at hub start: %s", e)

    async def close(self) -> None:
        """Stop watching (the jobs go on running; a restarted hub watches them again)."""
        self._closing = True
        for task in list(self._tasks.values()):
            task.cancel()
