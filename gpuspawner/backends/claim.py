"""What one start of a server (or a notebook GPU job) took: a :class:`Claim`.

Every backend reserves GPUs the same way (:meth:`GPUSpawnerMixin.reserve_gpus
<gpuspawner.backends.base.GPUSpawnerMixin.reserve_gpus>`, a template method); the one
thing a backend says is what it takes for a choice, as a Claim, from its hook
``claim(choice)``. Backends fall in two families, and a Claim holds either:

- **the hub places** (gpu-local, gpu-docker, gpu-swarm): the exact GPUs the hub's ledger
  now holds for the server (``gpus``). gpu-swarm's Swarm may then give the task other GPUs
  of that model: the mixin's ``correct_claim`` is the explicit second step that holds
  those instead;
- **the cluster places** (gpu-kube, gpu-slurm): a counted cluster resource (``count`` of
  ``resource``; the ledger holds cluster tokens, never inventory GPUs), with what the
  cluster is asked for: the pod's allowed products and CUDA version (gpu-kube), the
  job's ``--gres`` and node features (gpu-slurm).

A backend then applies the Claim to its workload (container device requests, pod
limits, sbatch ``--gres``). Pure data: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compat import CudaVersion
from ..gpu import GPU

__all__ = ["Claim"]


@dataclass(frozen=True)
class Claim:
    """What one start took. ``Claim()``: nothing (a CPU-only server)."""

    #: the exact GPUs, where the hub places them
    gpus: tuple[GPU, ...] = ()
    #: where the cluster places: how many of ``resource`` (a MIG slice or a shared replica counts as one)
    count: int = 0
    #: the cluster's resource: ``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``; gpu-slurm's ``slurm-gpu.a100``
    resource: str = ""
    #: the resource in the words of the form: ``NVIDIA-A100-SXM4-80GB``, a MIG slice's name, ``GPU``
    name: str = "GPU"
    #: gpu-kube: the ``nvidia.com/gpu.product`` values a node may have (none: any node with the resource)
    products: tuple[str, ...] = ()
    #: gpu-kube: the CUDA version the node's driver must support (None: any)
    cuda: CudaVersion | None = None
    #: gpu-slurm: this start's GPU request, ``gpu:a100:2`` (``gpu:2`` for untyped GPUs)
    gres: str = ""
    #: gpu-slurm: node features the job needs, ``cuda12.4|cuda12.6`` (added to ``--constraint``)
    constraint: str = ""
    #: the sentence the spawn's progress shows once it is taken (none: nothing to say)
    progress: str = ""

    @property
    def uuids(self) -> tuple[str, ...]:
        """The exact GPUs' UUIDs (none where the cluster places)."""
        return tuple(g.uuid for g in self.gpus)
