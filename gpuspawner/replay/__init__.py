"""Replay a day of GPU sessions on a simulated clock through the hub's real decision code.

``python -m gpuspawner.replay`` (and ``benchmarks/fleet.py``) compare culler,
queue and quota settings on the same trace. What decides is the project's own
code, driven by a simulated clock instead of the wall clock:

- placement and the ledger (:class:`~gpuspawner.ledger.Ledger` with its
  ``clock``, :func:`~gpuspawner.placement.place` through ``Ledger.reserve``);
- quotas (:func:`~gpuspawner.quota.check`, as the ledger's ``admit``);
- the queue's order (:class:`~gpuspawner.queue.GPUQueue`: ``join``, ``ahead``,
  ``room``, ``leave``; a waiting request places on the GPUs ``room`` lets it use
  under the policy's ``backfill`` (by default only with no competing request
  ahead of it), exactly as ``GPUQueue.serve`` decides;
  :data:`~gpuspawner.queue.WAITABLE` says which refusals wait);
- the GPU culler's warning and stop rules
  (:class:`~gpuspawner.idle.IdleTracker`, fed the samples it would read).

What is modelled instead of run: users (a trace of sessions), JupyterHub's
kernel-activity idle culler for policy (a), and the wall-clock waits.

**The trace** (:class:`TraceParams`; every parameter is a command-line option).
Sessions arrive at random over the day, more in working hours
(``hourly_weights``: by default 1.4 times the day's mean rate from 9 to 16 h, 0.6 times
at night, as a lab with users in several time zones and overnight jobs;
``--office-hours``: twice the mean by day, a fifth at night), until the GPU-hours they mean to hold reach ``load`` x
GPUs x ``hours``. A notebook session alternates *active* spans (its GPUs
busy; exponential, mean ``active_minutes``) and *pauses* (GPUs idle; mean
``pause_minutes``, of which a share ``cpu_share`` keep the kernel busy on the
CPU); with probability ``break_share`` one pause is a long break (uniform
``break_minutes``). Its length is lognormal (mean ``session_hours``, sigma
0.5). At its end the user stops the server, except a share ``abandon_share``
who walk away and leave it idle; of these a share ``tab_open_share`` leave a
browser tab open, which keeps the server "active" for JupyterHub's own idle
culler. A share ``batch_share`` of sessions are batch jobs (busy throughout,
mean ``batch_hours``, always stopped). Each asks for 1, 2 or 4 GPUs
(``count_weights``) of any model, A100 or T4 (``model_weights``), for one of
``users`` users.

**Policies.** ``jupyterhub-default``: a refused request is retried after
``retry_minutes`` up to ``retries`` times (then the user gives up), no queue, no
GPU culler, JupyterHub's idle culler stops servers without kernel or browser
activity for an hour, without warning. ``gpuspawner``: the runnable hub's
settings (:data:`gpuspawner.recommended.RECOMMENDED_CULLER`, queue on, queue
limit and user quota as configured there), and the same with the queue's
backfill (``gpu_queue_backfill``) first-fit and nearest-host. A sweep varies the culler's idle
timeout and queue on/off. A session culled while its user would still come
back (a pause, not the end) is asked for again when the user returns, with
the rest of its work; its new wait counts.

**Figures** per policy: GPU-hours held-but-idle as % of held, median and p95
wait for a GPU (served requests; a refused and retried request waits from its
first try), refusals (tries refused at once or by the queue's limit) and
requests given up, GPU utilisation (busy GPU-hours / GPU-hours in the day),
sessions culled with and without warning, and culled users who came back.

The package: :mod:`~gpuspawner.replay.trace` (the sessions: a synthetic day or a hub's usage
records), :mod:`~gpuspawner.replay.simulation` (one policy on a simulated clock, and its
figures), :mod:`~gpuspawner.replay.report` (the table and the chart), :mod:`~gpuspawner.replay.cli`
(the command line), :mod:`~gpuspawner.replay.estimates` (the wait estimator measured: ``--estimates``),
:mod:`~gpuspawner.replay.tail` (who waits longest, and why: ``--tail``),
:mod:`~gpuspawner.replay.bookings` (a booking load: ``--bookings``),
:mod:`~gpuspawner.replay.choices` (users choosing by the wait estimate, or booking from it: ``--choices``),
:mod:`~gpuspawner.replay.fairness` (the queue by arrival vs fair share: ``--fairness``).
"""

from __future__ import annotations

from .cli import main, parse_args
from .report import table
from .simulation import Policy, Result, default_policies, replay
from .trace import Session, TraceParams, gpus, offered_load, synthetic_trace, trace_from_usage

__all__ = ["TraceParams", "Session", "Policy", "Result", "synthetic_trace", "trace_from_usage", "replay",
           "default_policies", "gpus", "offered_load", "table", "main", "parse_args"]
