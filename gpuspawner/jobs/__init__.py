"""Notebook GPU jobs: a notebook run headless on its own GPUs, given back when it ends.

- :mod:`.spec`: pure: the REST body of a job (its GPU choice, its files) and job owners;
- :mod:`.store`: the hub's job records, in the hub's own database;
- :mod:`.execute`: what runs inside the job (``python -m gpuspawner.jobs.execute``);
- :mod:`.runners`: starting, watching and ending a job on the hub's backend;
- :mod:`.manager`: the hub's :class:`~.manager.JobManager` (placement, watch, recovery).
"""
