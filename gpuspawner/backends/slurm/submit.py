"""gpu-slurm's job: its sbatch command line, its submission and its wait in words: :class:`SlurmJobMixin`.

A parent of :class:`~gpuspawner.backends.slurm.spawner.GPUSlurmSpawner`. Each job carries the hub,
user and server in its name and comment (how the hub knows its jobs); what the start's claim and
profile decided is added to the site's ``batch_submit_cmd`` as sbatch options
(:mod:`gpuspawner.backends.slurm.settings`); a refusal by sbatch is answered with 409 (or 503)
saying what Slurm said; while the job is pending, the progress says why in Slurm's words, its
place in the queue and Slurm's estimate (:mod:`gpuspawner.backends.slurm.queue`).
"""

from __future__ import annotations

import re
import shlex
import time

from batchspawner import JobStatus, format_template
from traitlets.config import Configurable

from ...accounts import AccountError
from ...estimate import History
from ...owner import Owner
from ..errors import user_error
from .estimates import waiting
from .queue import job_comment, submit_refusal
from .reservations import active_for
from .settings import CHOICE_FLAGS, sbatch_options


class SlurmJobMixin(Configurable):
    """The Slurm job of a start: name, comment, sbatch options, submission, progress (see the module's words)."""

    #: while the job is pending: Slurm's and our start estimates (:func:`~.estimates.wait_fields`), for
    #: ``/hub/api/gpus``; None otherwise
    gpu_wait: dict | None = None

    def gpu_session_history(self) -> History | None:
        """The lengths of the hub's past sessions our estimate draws from; None: none (the estimate then
        rests on the running jobs' time limits)."""
        return None

    def cmd_formatted_for_batch(self):
        """What the batch script runs: the server, or a notebook GPU job's executor."""
        if self.gpu_job_command:
            return " ".join(shlex.quote(arg) for arg in self.gpu_job_command)
        return super().cmd_formatted_for_batch()

    def slurm_job_identity(self) -> tuple[str, str]:
        """This job's name and comment: the hub, user and server (``job/<id>`` for a notebook job), and the
        comment also this start's mark (how the hub recognizes its jobs, :mod:`gpuspawner.reconcile`)."""
        server = Owner.parse(self.gpu_owner).label
        return (f"jupyterhub-{self.gpu_hub_id}-{self.user.name}-{server}".rstrip("-"),
                job_comment(self.gpu_hub_id, self.user.name, server, self.gpu_start_mark))

    def get_req_subvars(self):
        """batchspawner's values, and ``{job_name}``, ``{job_comment}`` (shell-quoted) for a site's templates."""
        return self._with_job_identity(super().get_req_subvars())

    def _with_job_identity(self, subvars: dict) -> dict:
        name, comment = self.slurm_job_identity()
        subvars["job_name"], subvars["job_comment"] = shlex.quote(name), shlex.quote(comment)
        return subvars

    def sbatch_options(self) -> str:
        """What gpu-slurm adds to the site's sbatch command line for this job (shell-quoted): one node, the
        job's name and comment (how the hub knows its jobs), and what this start's choice decided: the GPUs
        (with the site's other GRES), the profile's partition, time, QOS, account, reservation, CPUs, memory
        and node features. sbatch's command line wins over the script's ``#SBATCH`` lines, so these reach
        the job whatever the site's ``batch_script`` says."""
        name, comment = self.slurm_job_identity()
        identity = ["--nodes=1", f"--job-name={name}", f"--comment={comment}"]
        constraint = ""
        if self.req_options != self._configured["req_options"]:
            found = re.search(r"--constraint=(\S+)", self.req_options or "")
            constraint = found.group(1) if found else ""
        options = sbatch_options(identity, {t: getattr(self, t) for t, _ in CHOICE_FLAGS}, self._configured,
                                 self.req_gres if self._gpu_gres else "", constraint)
        return " ".join(shlex.quote(option) for option in options)

    async def _submit_job(self) -> str:
        """batchspawner's submission (``exec_prefix`` + ``batch_submit_cmd``, the ``batch_script`` on its
        stdin, in the server's environment), with :meth:`sbatch_options` at the end of the command line."""
        subvars = self.get_req_subvars()
        cmd = " ".join((format_template(self.exec_prefix, **subvars),
                        format_template(self.batch_submit_cmd, **subvars), self.sbatch_options()))
        subvars["cmd"] = self.cmd_formatted_for_batch()
        subvars.update(self.user_options or {})  # as batchspawner: a site's script may use {image}
        script = await self._get_batch_script(**subvars)
        self.log.info("Spawner submitting command: %s", cmd)
        self.log.debug("Spawner submitting script:\n%s", script)
        out = await self.run_command(cmd, input=script, env=self.get_env())
        try:
            self.job_id = self.parse_job_id(out)
        except Exception:
            self.log.error("Job submission failed. sbatch said: %s", out)
            self.job_id = ""
        return self.job_id

    async def submit_batch_script(self):
        """Submit the job (:meth:`_submit_job`); when sbatch fails, HTTP 409 (Slurm refused the job) or 503
        (sbatch could not reach Slurm) saying what Slurm said.

        Nothing stays held: the failed start releases this server's count of GPUs. With
        ``create_system_users``, the user's account is made first (it submits the job).
        """
        try:
            await self.ensure_account()
        except AccountError as e:
            raise user_error(503, f"This hub cannot start your server: {e}. Ask an admin.") from e
        configured_reservation = self.req_reservation
        if not configured_reservation:
            self.req_reservation = await self.booked_reservation() or ""
        try:
            job_id = await self._submit_job()
        except RuntimeError as e:  # batchspawner's run_command: sbatch's stderr
            constraint = re.search(r"--constraint=(\S+)", self.req_options or "")
            status, message = submit_refusal(str(e), {
                "partition": self.req_partition, "time": self.req_runtime, "gres": self.req_gres,
                "qos": self.req_qos, "account": self.req_account, "cpus": self.req_nprocs,
                "memory": self.req_memory, "constraint": constraint.group(1) if constraint else "",
            })
            self.log.warning("%s: sbatch failed: %s", self._log_name, str(e).strip())
            self.gpu_event(f"Refused: {message}" if status == 409 else f"Failed: {message}", 100)
            raise user_error(status, message) from e
        finally:
            booked, self.req_reservation = self.req_reservation, configured_reservation
        if job_id:
            self._submitted_job = job_id
            within = f" in your booking's reservation {booked}" if booked and not configured_reservation else ""
            self.gpu_event(f"Submitted Slurm job {job_id}{within}", 35)
            self.save_state()  # the job id is in the database before the job can start
        return job_id

    async def booked_reservation(self) -> str | None:
        """The reservation of a booking (:mod:`~gpuspawner.backends.slurm.reservations`: this hub's, named
        ``jupyterhub-<hub id>-<booking>-<n>``) whose window holds now and that names this user's account
        or one of its groups: the job runs in it (``--reservation``). None when there is none, or when
        Slurm does not list reservations (the job is then submitted without one)."""
        reading = await (await self.slurm()).reservations()  # through exec_prefix, as every Slurm command
        if reading.unknown is not None:
            self.log.warning("%s: cannot list Slurm's reservations: %s", self._log_name, reading.unknown)
            return None
        prefix = f"jupyterhub-{self.gpu_hub_id}"
        listed = [r for r in reading.value if r.booking_id(prefix) is not None]
        groups = [g.name for g in getattr(self.user, "groups", [])]
        return active_for(listed, self.account_of(self.user.name), groups, time.time())

    async def query_job_status(self):
        """batchspawner's status; while pending, Slurm's reason and the queue in the progress."""
        status = await super().query_job_status()
        if status == JobStatus.PENDING and time.monotonic() - self._words_at >= 1.5:
            self._words_at = time.monotonic()
            await self._say_why_waiting()
        elif status == JobStatus.RUNNING and self._announced_job != self.job_id:
            self._announced_job, self.gpu_wait = self.job_id, None
            self.gpu_event(f"Slurm started job {self.job_id} on {self.state_gethost()}; "
                           "waiting for the server to answer", 60)
        return status

    async def _say_why_waiting(self) -> None:
        reading = await (await self.slurm()).jobs(max_age=1.0)
        if reading.unknown is not None:
            return
        job = next((j for j in reading.value if j.id == self.job_id), None)
        if job is None or not job.pending:
            return
        nodes = await (await self.slurm()).nodes()  # our estimate beside Slurm's needs the nodes' free GPUs
        words, self.gpu_wait = waiting(job, reading.value, nodes.value if nodes.unknown is None else None,
                                       time.time(), self.gpu_session_history())
        if words != self._last_words:
            self._last_words = words
            self.gpu_event(words, 40)

