"""Our start estimate for a pending gpu-slurm job, beside Slurm's own (issue 30). Pure: no I/O.

Slurm's estimate (``squeue --start``, the job's ``start_time`` while pending) comes from its
backfill plan, which rests on the running jobs' time limits; without time limits it is "now + 1
year", a placeholder. Ours is :func:`gpuspawner.estimate.estimate` on what ``squeue`` and
``sinfo`` say: the GPUs free on each node of the job's partition (a group per node and GPU type,
as a job runs on one node), the running GPU jobs there as holders (since their start, their
latest end their start + time limit) and the pending GPU jobs ahead of it in Slurm's order (the
order :func:`~gpuspawner.backends.slurm.queue.queue_place` counts). With a usage history (the
lengths of the hub's past sessions) each holder's likely end is drawn from it; without one, the
holders end at their time limits, and the sentence says what it rests on.

:func:`wait_fields` is what ``/hub/api/gpus`` lists for a pending server (``slurm_start``,
``estimate``; the progress says ``WORDS["ours"]`` after Slurm's words).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ...estimate import Ask, Estimate, History, Holder, estimate
from .capacity import SlurmNode
from .queue import SlurmJob, parse_comment, wait_words, waiting_order

__all__ = ["WORDS", "job_gpus", "our_estimate", "slurm_start", "wait_fields", "waiting"]

#: the sentences of this module
WORDS = {
    "ours": "Our estimate: {sentence}",
}
#: Slurm's start times further away than this are its placeholder (no time limits), not an estimate
PLACEHOLDER = 300 * 24 * 3600
_GPUS = re.compile(r"gpu(?::(?P<type>[A-Za-z][\w.-]*))?(?:[:=](?P<count>\d+))?")
_HOLDING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"})


def job_gpus(job: SlurmJob) -> tuple[str, int]:
    """(GRES type or "", count) of a job's GPUs: ``gres:gpu:a100:2`` -> ("a100", 2); (``""``, 0) without GPUs.

    >>> job_gpus(SlurmJob("1", "PENDING", "None", "gpu", gpus="gres:gpu:a100:2")), job_gpus(
    ...     SlurmJob("2", "PENDING", "None", "gpu", gpus="gres/gpu=1"))
    (('a100', 2), ('', 1))
    """
    found = _GPUS.search(job.gpus or "")
    if not found:
        return "", 0
    return found["type"] or "", int(found["count"] or 1)


def slurm_start(job: SlurmJob, now: float) -> float | None:
    """Slurm's expected start of a pending job; None when it has none, or only its placeholder."""
    if not job.start_time or job.start_time - now > PLACEHOLDER:
        return None
    return float(max(job.start_time, now))


def _groups(nodes: Iterable[SlurmNode], partitions: set[str], gres_type: str) -> dict[str, int]:
    """``node/type`` -> free GPUs, for the nodes of ``partitions`` with GPUs of ``gres_type`` ("": any)."""
    out = {}
    for node in nodes:
        if partitions and not partitions & set(node.partitions):
            continue
        for kind in node.gpus:
            if not gres_type or kind == gres_type:
                out[f"{node.name}/{kind}"] = node.free(kind)
    return out


def _holding_group(job: SlurmJob, gres_type: str, nodes: Sequence[SlurmNode]) -> str:
    if gres_type:
        return f"{job.nodes}/{gres_type}"
    node = next((n for n in nodes if n.name == job.nodes), None)  # an untyped ask: the node's type in use
    kinds = [k for k, used in (node.used.items() if node else ()) if used] or list(node.gpus if node else ())
    return f"{job.nodes}/{kinds[0]}" if kinds else ""


def _user(job: SlurmJob) -> str:
    parsed = parse_comment(job.comment)
    return parsed[1] if parsed else ""


def our_estimate(job: SlurmJob, jobs: Sequence[SlurmJob], nodes: Sequence[SlurmNode], now: float,
                 history: History | None = None) -> Estimate:
    """When pending ``job`` likely starts, by :func:`gpuspawner.estimate.estimate` on Slurm's state."""
    partitions = set(filter(None, job.partition.split(",")))
    gres_type, count = job_gpus(job)
    free = _groups(nodes, partitions, "")
    holders = []
    for other in jobs:
        kind, n = job_gpus(other)
        if other.state in _HOLDING and n:
            group = _holding_group(other, kind, nodes)
            if group in free:
                since = float(other.start_time or now)
                latest = since + other.time_limit if other.time_limit else None
                holders.append(Holder(other.id, n, since, group, _user(other), "", latest, "job" if latest else ""))
    mine = frozenset(_groups(nodes, partitions, gres_type))
    order = waiting_order(job, jobs)
    ahead = []
    for other in order[:[j.id for j in order].index(job.id)]:
        kind, n = job_gpus(other)
        theirs = frozenset(_groups(nodes, partitions, kind))
        if theirs & mine:  # one that waits for other GPUs does not hold this one back (Slurm backfills past it)
            ahead.append(Ask(other.id, n, _user(other), groups=theirs))
    ask = Ask(job.id, count, _user(job), groups=mine)
    return estimate(ask, now, free, holders, ahead, history or History(()))


def wait_fields(job: SlurmJob, jobs: Sequence[SlurmJob], nodes: Sequence[SlurmNode], now: float,
                history: History | None = None) -> dict:
    """A pending job's fields in ``/hub/api/gpus``: ``slurm_start`` (epoch seconds or None), ``estimate``
    (``likely``, ``low``, ``high``: epoch seconds or None; ``basis`` and ``sentence``: words)."""
    ours = our_estimate(job, jobs, nodes, now, history)
    return {"slurm_job": job.id, "slurm_reason": job.reason, "slurm_start": slurm_start(job, now),
            "estimate": {"likely": ours.likely, "low": ours.low, "high": ours.high, "basis": ours.basis,
                         "sentence": ours.sentence(now)}}


def waiting(job: SlurmJob, jobs: Sequence[SlurmJob], nodes: Sequence[SlurmNode] | None, now: float,
            history: History | None = None) -> tuple[str, dict | None]:
    """What a pending job's progress says (Slurm's words, then ours) and its :func:`wait_fields`; Slurm's
    words alone (and no fields) for a job without GPUs or when ``sinfo`` did not answer (``nodes`` None)."""
    words = wait_words(job, jobs, now)
    if nodes is None or not job.wants_gpus:
        return words, None
    fields = wait_fields(job, jobs, nodes, now, history)
    return f"{words} {WORDS['ours'].format(sentence=fields['estimate']['sentence'])}", fields
