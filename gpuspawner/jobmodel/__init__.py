"""The notebook GPU job model, below the backends (core: no backend, no hub).

- :mod:`.spec`: pure: the REST body of a job (its GPU choice, its files), checked;
- :mod:`.store`: the hub's job records, in the hub's own database;
- :mod:`.runner`: :class:`~.runner.JobRunner`, what the job manager asks of a backend, and the
  helpers every backend's runner shares (the executor's command line, the job's environment);
- :mod:`.outcome`: pure: how a job's run ended and what that means for the job;
- :mod:`.execute`: what runs inside the job (``python -m gpuspawner.jobs.execute``).

The backends implement :class:`~.runner.JobRunner` (``backends/<name>/jobs.py``); the hub's
:class:`~gpuspawner.jobs.manager.JobManager` (above the backends) drives them.
"""
