"""Slurm's queue in words, from ``squeue --json``. Pure: no I/O here.

:func:`read_jobs` reads the jobs; :func:`wait_words` says, for a pending job,
why Slurm holds it (its *reason*, in plain words), its place among the pending
GPU jobs of its partition (in Slurm's order: priority, then submission), and
the start Slurm estimates (what ``squeue --start`` shows) when it has one.
The job's name and comment tie it to a hub server (:func:`job_comment`).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .capacity import check_errors

__all__ = ["ENDED", "SlurmJob", "comment_start", "job_comment", "parse_comment", "read_jobs", "reason_words",
           "slurm_seconds", "slurm_time", "submit_refusal", "wait_words"]

#: the states of a job that has ended (squeue lists them for ``MinJobAge`` seconds); any other
#: state Slurm lists (PENDING, CONFIGURING, RUNNING, COMPLETING, SUSPENDED, ...) still holds or waits
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})

#: What sbatch says when Slurm refuses a job at submission (``sbatch: error: Batch job submission
#: failed: ...``), in plain words; ``{partition}``, ``{time}``, ``{gres}``, ``{qos}``, ``{account}``
#: and ``{constraint}`` are the job's (``-`` when not set; the partition: Slurm's default), ``{asks}``
#: what it asks of one node (CPUs, memory, GPUs, features).
SUBMIT_REFUSALS: tuple[tuple[str, str], ...] = (
    ("Invalid partition name", "Slurm has no partition {partition}. Ask an admin to fix the profile."),
    ("Requested time limit is invalid", "The time limit {time} is longer than partition {partition} allows. "
     "Ask an admin for a profile with a shorter time limit."),
    ("violates accounting/QOS policy", "Your Slurm account or QOS limits (QOS {qos}, account {account}) "
     "do not allow this job now: too many jobs, GPUs or too long a time limit. Stop another server, "
     "ask for fewer GPUs, or ask an admin about your limits."),
    ("Requested node configuration is not available", "No node of partition {partition} has what the job "
     "asks for ({asks}). Pick another profile, or ask an admin to fix this one."),
    ("Invalid generic resource", "Slurm does not know the GPU resource {gres}. Ask an admin to check the "
     "GPU types (slurm_gres_types)."),
    ("Invalid feature specification", "No node of partition {partition} has the features {constraint}. "
     "Ask an admin to fix the profile."),
    ("Invalid qos specification", "Slurm does not know QOS {qos}, or your account may not use it. "
     "Ask an admin to fix the profile or your account."),
    ("Invalid account", "Slurm does not let you use account {account} in partition {partition}. "
     "Ask an admin to add you to it or to fix the profile."),
    ("Memory required by task is not available", "No node of partition {partition} has {memory} memory. "
     "Pick another profile, or ask an admin to fix this one."),
)


#: what sbatch says when it did not reach slurmctld, or slurmctld did not answer in time
_UNREACHABLE = ("unable to contact slurm controller", "socket timed out", "zero bytes were transmitted",
                "temporarily unable", "communication connection failure")


def submit_refusal(said: str, job: Mapping[str, str]) -> tuple[int, str]:
    """The HTTP status and sentence a user gets when sbatch failed: what Slurm said and what it means.

    Slurm refusing the job (``Batch job submission failed: ...``) is 409; sbatch not reaching
    Slurm (``... failed: Unable to contact slurm controller (connect failure)``, a timeout) is 503,
    to try again later.

    >>> status, words = submit_refusal(
    ...     "sbatch: error: Batch job submission failed: Invalid partition name specified", {"partition": "x"})
    >>> status
    409
    >>> words  # doctest: +ELLIPSIS
    'Slurm refused the job: Invalid partition name specified. Slurm has no partition x. Ask an admin to ...'
    """
    lines = [line.strip() for line in said.strip().splitlines() if line.strip()]
    refused = next((line for line in reversed(lines) if "submission failed" in line), None)
    last = refused or (lines[-1] if lines else "sbatch failed without saying why")
    core = re.sub(r"^(sbatch: )?(error: )?(Batch job submission failed: )?", "", last).strip().rstrip(".")
    if any(words in last.lower() for words in _UNREACHABLE):
        return 503, (f"Slurm did not take the job: {core}. Try again in a while; if this goes on, ask an admin "
                     "whether Slurm's controller is up.")
    fields = dict.fromkeys(("time", "gres", "qos", "account", "constraint"), "-")
    fields["partition"] = "(Slurm's default)"
    fields.update({k: v for k, v in job.items() if v})
    asks = (("cpus", "{} CPUs"), ("memory", "{} memory"), ("gres", "GPUs {}"), ("constraint", "features {}"))
    fields["asks"] = ", ".join(words.format(job[key]) for key, words in asks if job.get(key)) or "nothing special"
    for pattern, words in SUBMIT_REFUSALS:
        if pattern.lower() in core.lower():
            return 409, f"Slurm refused the job: {core}. {words.format(**fields)}"
    return 409, f"Slurm refused the job: {core}. Ask an admin what it means for this profile."

#: Slurm's pending reasons (``squeue -o %r``) in plain words; any other reads "Slurm's reason: X".
REASONS: dict[str, str] = {
    "Resources": "the GPUs it needs are in use by other jobs; it starts when enough of them are released",
    "Priority": "jobs with a higher priority are ahead of it in Slurm's queue",
    "None": "Slurm has not looked at it yet",
    "BeginTime": "it may not start before its begin time",
    "Dependency": "it waits for another job to finish",
    "JobHeldUser": "it is held (released with scontrol release)",
    "JobHeldAdmin": "an administrator holds it",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows",
    "PartitionConfig": "it asks for more than its partition's nodes have (CPUs, memory or nodes), so it "
                       "cannot start until an admin changes the partition: stop it and pick another profile",
    "PartitionTimeLimit": "its time limit is longer than its partition allows",
    "ReqNodeNotAvail": "the nodes it could run on are down, drained or reserved",
    "NodeDown": "a node it needs is down",
    "Reservation": "it waits for its reservation to start",
    "QOSMaxGRESPerUser": "your QOS limit of GPUs per user is reached; it starts when one of your jobs ends",
    "QOSMaxGRESPerJob": "it asks for more GPUs than your QOS allows per job",
    "QOSGrpGRES": "your QOS group's GPU limit is reached",
    "QOSMaxJobsPerUserLimit": "your QOS limit of running jobs per user is reached",
    "QOSMaxCpuPerUserLimit": "your QOS limit of CPUs per user is reached",
    "AssocGrpGRES": "your account's GPU limit is reached",
    "AssocMaxJobsLimit": "your account's limit of running jobs is reached",
    "AssocGrpCpuLimit": "your account's CPU limit is reached",
    "AssocGrpMemLimit": "your account's memory limit is reached",
}

#: Start estimates further away than this are Slurm's placeholders (jobs without a time limit), not estimates.
_MAX_ESTIMATE = 7 * 24 * 3600
#: time limits (minutes) this long or longer are no limit: Slurm 22.05 lists UNLIMITED as 525600 (a year), or INFINITE
_NO_LIMIT = 365 * 24 * 60
_COMMENT = re.compile(r"jupyterhub:(?P<hub>[^ ]*) user:(?P<user>[^ ]+) server:(?P<server>[^ ]*)")
_START = re.compile(r"(?:^| )start:(?P<start>[^ ]+)")


def job_comment(hub: str, user: str, server: str, start: str = "") -> str:
    """The ``--comment`` that ties a job to a hub's server: ``jupyterhub:HUB user:NAME server:NAME``,
    and to one start of it (`` start:MARK``, new for every start), where given."""
    return f"jupyterhub:{hub} user:{user} server:{server}" + (f" start:{start}" if start else "")


def parse_comment(comment: str) -> tuple[str, str, str] | None:
    """(hub, user, server) from :func:`job_comment`'s text; None for other jobs."""
    match = _COMMENT.search(comment or "")
    return (match["hub"], match["user"], match["server"]) if match else None


def comment_start(comment: str) -> str:
    """The start mark of :func:`job_comment`'s text; ``""`` when it has none.

    >>> comment_start(job_comment("hub1", "ada", "", "3f2a9c")), comment_start(job_comment("hub1", "ada", ""))
    ('3f2a9c', '')
    """
    match = _START.search(comment or "")
    return match["start"] if match else ""


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``squeue --json`` lists it."""

    id: str
    state: str
    reason: str
    partition: str
    name: str = ""
    comment: str = ""
    gpus: str = ""  # what it asks per node, e.g. "gres:gpu:a100:1"
    priority: int = 0
    submit_time: int = 0
    start_time: int = 0
    nodes: str = ""
    exit_code: int | None = None  # of an ended job: its exit status, or -N when signal N ended it
    time_limit: int | None = None  # seconds; None: no limit (UNLIMITED, or Slurm's year-long placeholder)

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def wants_gpus(self) -> bool:
        return "gpu" in self.gpus


def _int(value: Any) -> int:
    if isinstance(value, Mapping):  # newer Slurm: {"set": true, "number": N}
        value = value.get("number", 0) if value.get("set", True) else 0
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _exit_code(value: Any) -> int | None:
    """squeue's ``exit_code``: a wait status (Slurm 22.05: ``768`` is exit 3, ``15`` signal 15), or
    newer Slurm's ``{"return_code": {"number": 3}, "signal": {"id": {"number": 15}}}``."""
    if isinstance(value, Mapping):
        signal = value.get("signal")
        signal = _int(signal.get("id")) if isinstance(signal, Mapping) else 0
        return -signal if signal else _int(value.get("return_code"))
    if value is None or isinstance(value, bool):
        return None
    status = _int(value)
    return -(status & 0x7F) if status & 0x7F else status >> 8


def _time_limit(value: Any) -> int | None:
    """squeue's ``time_limit`` (minutes; newer Slurm: ``{"set", "infinite", "number"}``) in seconds."""
    if isinstance(value, Mapping) and value.get("infinite"):
        return None
    minutes = _int(value)
    return minutes * 60 if 0 < minutes < _NO_LIMIT else None


def read_jobs(squeue: str | bytes | Mapping[str, Any]) -> tuple[SlurmJob, ...]:
    """The jobs of ``squeue --json`` output (text or parsed); ValueError when it is not that,
    or when it reports errors (:func:`~gpuspawner.backends.slurm.capacity.check_errors`)."""
    data = json.loads(squeue) if isinstance(squeue, (str, bytes)) else squeue
    if not isinstance(data, Mapping) or not isinstance(data.get("jobs"), list):
        raise ValueError("not squeue --json output: no 'jobs' list")
    check_errors(data, "squeue --json")
    jobs = []
    for raw in data["jobs"]:
        if not isinstance(raw, Mapping):
            continue
        state = raw.get("job_state", "")
        state = state[0] if isinstance(state, list) and state else state
        gres = " ".join(str(raw.get(k) or "") for k in ("tres_per_node", "tres_per_job", "tres_per_task"))
        jobs.append(SlurmJob(
            id=str(raw.get("job_id", "")),
            state=str(state).upper(),
            reason=str(raw.get("state_reason") or "None"),
            partition=str(raw.get("partition") or ""),
            name=str(raw.get("name") or ""),
            comment=str(raw.get("comment") or ""),
            gpus=gres.strip(),
            priority=_int(raw.get("priority")),
            submit_time=_int(raw.get("submit_time")),
            start_time=_int(raw.get("start_time")),
            nodes=str(raw.get("nodes") or ""),
            exit_code=_exit_code(raw.get("exit_code")),
            time_limit=_time_limit(raw.get("time_limit")),
        ))
    return tuple(jobs)


def slurm_seconds(text: str) -> int | None:
    """A Slurm time limit in seconds (``--time``'s forms); None for no limit (empty, ``UNLIMITED``).

    >>> [slurm_seconds(t) for t in ("30", "1:30", "2:00:00", "1-0", "1-2:30", "1-0:0:5", "UNLIMITED")]
    [1800, 90, 7200, 86400, 95400, 86405, None]
    """
    text = (text or "").strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = text.rpartition("-")
    try:
        parts = [int(p) for p in rest.split(":")]
        day = int(days) if days else 0
    except ValueError:
        raise ValueError(f"{text!r} is not a Slurm time limit") from None
    if days:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts[:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = parts[:3]
    return ((day * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_time(seconds: float) -> str:
    """Seconds as ``--time`` takes them (``D-HH:MM:SS``); Slurm rounds up to whole minutes.

    >>> slurm_time(6), slurm_time(90061)
    ('0-00:00:06', '1-01:01:01')
    """
    whole = max(1, math.ceil(seconds))
    minutes, secs = divmod(whole, 60)
    hours, mins = divmod(minutes, 60)
    days, hrs = divmod(hours, 24)
    return f"{days}-{hrs:02d}:{mins:02d}:{secs:02d}"


def reason_words(reason: str) -> str:
    return REASONS.get(reason) or f"Slurm's reason: {reason}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def waiting_order(job: SlurmJob, jobs: Iterable[SlurmJob]) -> list[SlurmJob]:
    """The pending GPU jobs of ``job``'s partition (``job`` among them), in Slurm's order: priority, then submission."""
    waiting = [j for j in jobs if j.pending and j.wants_gpus and j.partition == job.partition]
    if job.id not in {j.id for j in waiting}:
        waiting.append(job)
    waiting.sort(key=lambda j: (-j.priority, j.submit_time, _int(j.id)))
    return waiting


def queue_place(job: SlurmJob, jobs: Iterable[SlurmJob]) -> tuple[int, int]:
    """(place, of how many) among the pending GPU jobs of ``job``'s partition, in Slurm's order."""
    waiting = waiting_order(job, jobs)
    return next(i for i, j in enumerate(waiting, 1) if j.id == job.id), len(waiting)


def wait_words(job: SlurmJob, jobs: Iterable[SlurmJob], now: float | None = None) -> str:
    """What a user reads while ``job`` is pending, e.g.

    "Waiting in Slurm's queue (job 12, partition gpu): the GPUs it needs are in use by other
    jobs; it starts when enough of them are released. It is 1st of 2 GPU jobs waiting in
    partition gpu. Slurm expects it to start in about 14 minutes (10:42)."
    """
    now = time.time() if now is None else now
    place, waiting = queue_place(job, jobs)
    text = (f"Waiting in Slurm's queue (job {job.id}, partition {job.partition}): {reason_words(job.reason)}. "
            f"It is {_ordinal(place)} of {waiting} GPU job{'s' if waiting != 1 else ''} waiting in partition "
            f"{job.partition}.")
    ahead = job.start_time - now
    if job.start_time and 0 < ahead <= _MAX_ESTIMATE:
        minutes = max(1, round(ahead / 60))
        when = time.strftime("%H:%M", time.localtime(job.start_time))
        span = f"{minutes} minute{'s' if minutes != 1 else ''}" if minutes < 120 else f"{round(minutes / 60)} hours"
        text += f" Slurm expects it to start in about {span} ({when})."
    return text
