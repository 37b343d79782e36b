"""Kubernetes support for gpuspawner.

Following KubeSpawner's ``objects.py`` pattern, the parts here are pure
functions over plain data (node and pod objects as JSON dicts, requests as
small dataclasses); the only I/O is in :mod:`gpuspawner.backends.kube.api`.

- :mod:`.capacity`: GPU inventory of a cluster from its nodes and pods
  (free/total per model, per MIG profile and per shared pool), and refusals.
- :mod:`.objects`: the KubeSpawner trait overrides for a request.
- :mod:`.cuda`: node affinity on the driver's CUDA version (the image's
  requirement is read by :func:`gpuspawner.compat.min_cuda`).
- :mod:`.events`: scheduling events in plain words.
- :mod:`.holdings`: which GPUs the hub's single-user pods hold (quotas after a restart).
- :mod:`.jobpod`: a notebook GPU job as a run-to-completion pod, and how its pod ended.
- :mod:`.api`: reading nodes and pods through kubernetes_asyncio, cached; creating, reading
  and deleting job pods.
- :mod:`.spawner`: the gpu-kube spawner; :mod:`.jobs`: its notebook GPU job runner;
  :mod:`.profiles`, :mod:`.kueue`: KubeSpawner-style profile entries and Kueue's queues.
- :mod:`.dev`: the development cluster of the runnable default and the tests.
"""
