"""The marks a workload of this hub carries in its environment, on every backend that can set them.

A gpu-local server process, a notebook job's process, container or pod starts with:

- ``GPUSPAWNER_HUB`` (:data:`HUB_VAR`): the hub's id (``gpu_hub_id``);
- ``GPUSPAWNER_SERVER`` (:data:`SERVER_VAR`): its owner, ``"user/server"`` or ``"user/job/<id>"``
  (:class:`~gpuspawner.owner.Owner`);
- ``GPUSPAWNER_SPAWN`` (:data:`SPAWN_VAR`): an id new at every start (a job's: its job id).

A restarted hub finds its workloads, and what each holds, by these (gpu-local:
:mod:`gpuspawner.backends.local.processes`). Pure: names only.
"""

from __future__ import annotations

__all__ = ["HUB_VAR", "SERVER_VAR", "SPAWN_VAR", "marks"]

HUB_VAR = "GPUSPAWNER_HUB"
SERVER_VAR = "GPUSPAWNER_SERVER"
SPAWN_VAR = "GPUSPAWNER_SPAWN"


def marks(hub_id: str, owner: str, spawn: str) -> dict[str, str]:
    """The environment that marks one start (``spawn``) of ``owner`` as hub ``hub_id``'s."""
    return {HUB_VAR: hub_id, SERVER_VAR: owner, SPAWN_VAR: spawn}
