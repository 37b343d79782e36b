"""Notebook GPU jobs: a notebook run headless on its own GPUs, given back when it ends.

- :mod:`.manager`: the hub's :class:`~.manager.JobManager` (placement, watch, recovery), which
  talks to the hub's backend only through its :class:`~gpuspawner.jobmodel.runner.JobRunner`;
- :mod:`.execute`: the executor's public name (``python -m gpuspawner.jobs.execute``).

The job model below the backends is :mod:`gpuspawner.jobmodel` (the request, the records,
the runner protocol, how a run ended, the executor); each backend's runner is its ``jobs.py``.
"""
