"""JupyterHub spawner backends, each a unit in its own folder: ``local``, ``docker``, ``swarm``,
``kube``, ``slurm``; each a thin adapter over :class:`~.base.GPUSpawnerMixin` (``base.py``, with
its policies in ``policies.py``).

A backend's folder holds its spawner (``spawner.py``), its pure objects (``objects.py``), its
capacity reader and its notebook GPU job runner (``jobs.py``). No backend imports another's
privates: gpu-swarm subclasses gpu-docker's public class.
"""
