"""Pure pieces of the Docker backend: labels, device requests, reconciliation.

No Docker I/O here (the spawner in ``spawner.py`` does that): these functions
take and return plain values, so they are tested exhaustively without an
engine.

- :func:`allocation_labels` / :func:`allocation_from_labels`: the allocation
  written on a container, and read back after a hub restart.
- :func:`device_request`: the Docker ``DeviceRequest`` naming the exact GPUs
  by UUID (never ``Count``: Docker's ``count=N`` always means GPUs 0..N-1).
- :func:`reconcile`: what the ledger must hold, given the containers the
  engine lists.
- :func:`other_gpu_access`: the ways a container's configuration would reach GPUs
  besides its placed ones (refused, never dropped: ``spawner.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ...gpu import GPU, nvidia_visible_devices

__all__ = [
    "LABEL_PREFIX",
    "ContainerAllocation",
    "Reconciliation",
    "allocation_from_labels",
    "allocation_labels",
    "container_name",
    "device_request",
    "other_gpu_access",
    "reconcile",
    "visible_devices_env",
]

LABEL_PREFIX = "org.gpuspawner."
HUB = LABEL_PREFIX + "hub"
OWNER = LABEL_PREFIX + "owner"
GPUS = LABEL_PREFIX + "gpus"
INDEXES = LABEL_PREFIX + "gpu-indexes"
HOST = LABEL_PREFIX + "host"
MODEL = LABEL_PREFIX + "gpu-name"


@dataclass(frozen=True)
class ContainerAllocation:
    """Which GPUs one container holds, as its labels say."""

    hub: str
    owner: str  # "user/server-name", the ledger's key
    gpus: tuple[GPU, ...] = ()

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)


def allocation_labels(hub: str, owner: str, gpus: Sequence[GPU]) -> dict[str, str]:
    """Labels recording ``owner``'s GPUs on its container (all strings, as Docker wants)."""
    labels = {HUB: hub, OWNER: owner, GPUS: ",".join(g.uuid for g in gpus)}
    if gpus:
        labels[INDEXES] = ",".join(str(g.index) for g in gpus)
        labels[HOST] = gpus[0].host
        labels[MODEL] = gpus[0].name
    return labels


def allocation_from_labels(labels: Mapping[str, str] | None) -> ContainerAllocation | None:
    """Read labels written by :func:`allocation_labels`; None if they are not ours or are damaged."""
    labels = labels or {}
    hub, owner = labels.get(HUB), labels.get(OWNER)
    if not hub or not owner:
        return None
    uuids = [u for u in labels.get(GPUS, "").split(",") if u]
    indexes = [i for i in labels.get(INDEXES, "").split(",") if i]
    if indexes and len(indexes) != len(uuids):
        indexes = []
    host = labels.get(HOST) or "?"
    name = labels.get(MODEL) or "Unknown GPU"
    gpus = []
    for n, uuid in enumerate(uuids):
        index = int(indexes[n]) if indexes and indexes[n].isdigit() else -1
        gpus.append(GPU(host=host, index=index, uuid=uuid, name=name))
    return ContainerAllocation(hub, owner, tuple(gpus))


def device_request(uuids: Sequence[str], capabilities: Sequence[str]) -> dict | None:
    """The DeviceRequest for exactly these GPUs (Docker API field names), or None for none.

    ``Count`` is left out on purpose: with ``DeviceIDs`` the engine gives
    exactly those GPUs; a count would always mean the first N.
    """
    if not uuids:
        return None
    return {
        "Driver": "nvidia",
        "DeviceIDs": list(uuids),
        "Capabilities": [list(capabilities)],
    }


def visible_devices_env(uuids: Sequence[str]) -> dict[str, str]:
    """The environment that agrees with the device request.

    The engine appends ``NVIDIA_VISIBLE_DEVICES`` itself for a device request;
    setting the same value in the container's own environment overrides an
    image's ``NVIDIA_VISIBLE_DEVICES=all`` (CUDA images ship it), which a host
    whose default runtime is ``nvidia`` would otherwise honour. A CPU-only
    server gets :data:`~gpuspawner.gpu.NO_GPU_DEVICES` (``void``): no GPU, no driver.
    """
    return {VISIBLE_DEVICES: nvidia_visible_devices(uuids)}


#: the variable through which the NVIDIA runtime gives a container its GPUs (gpu-docker sets it per server)
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


def _is_gpu_request(request: object) -> bool:
    """A Docker device request that asks for GPUs (NVIDIA's driver, or ``--gpus``' capability ``gpu``)."""
    if not isinstance(request, Mapping):
        return False
    driver = request.get("Driver") or request.get("driver") or ""
    capabilities = request.get("Capabilities") or request.get("capabilities") or []
    words = {w for group in capabilities if isinstance(group, (list, tuple)) for w in group}
    return driver == "nvidia" or "gpu" in words


def _device_path(device: object) -> str:
    if isinstance(device, Mapping):
        return str(device.get("PathOnHost") or device.get("path_on_host") or "")
    return str(device).split(":", 1)[0]


def _environment(environment: object) -> dict[str, str]:
    """A container's environment as a dict (Docker takes a dict or ``KEY=value`` strings)."""
    if isinstance(environment, Mapping):
        return {str(k): str(v) for k, v in environment.items()}
    pairs = (str(item).partition("=") for item in environment or ())
    return {k: v for k, _, v in pairs}


def other_gpu_access(host_config: Mapping | None, environment: object = None, ours: str | None = None) -> list[str]:
    """What in a container's configuration would reach GPUs besides the ones placed for it.

    ``host_config`` in either spelling (``create_host_config``'s ``device_requests`` and
    ``devices``, or the API's ``DeviceRequests`` and ``Devices``); ``environment`` a dict
    or ``KEY=value`` strings, in which ``NVIDIA_VISIBLE_DEVICES`` may only be ``ours``
    (the value gpu-docker sets). Each finding is a phrase naming it: a GPU device request
    (``--gpus all``, ``count=-1``), an NVIDIA device node, or ``NVIDIA_VISIBLE_DEVICES``.
    """
    host_config = host_config or {}
    found = []
    for key in ("device_requests", "DeviceRequests"):
        for request in host_config.get(key) or ():
            if _is_gpu_request(request):
                found.append(f"the GPU device request {dict(request)}")
    for key in ("devices", "Devices"):
        for device in host_config.get(key) or ():
            if _device_path(device).startswith("/dev/nvidia"):
                found.append(f"the device {_device_path(device)}")
    value = _environment(environment).get(VISIBLE_DEVICES)
    if value is not None and value != ours:
        found.append(f"{VISIBLE_DEVICES}={value}")
    return found


@dataclass(frozen=True)
class Reconciliation:
    """What to do to the ledger so it says what the running containers say."""

    holdings: dict[str, tuple[str, ...]] = field(default_factory=dict)  # owner -> UUIDs
    release: tuple[str, ...] = ()  # owners the ledger holds GPUs for, with no running container
    conflicts: tuple[str, ...] = ()  # sentences for the log
    allocations: dict[str, ContainerAllocation] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # owner -> the name of its container that counts


def reconcile(
    hub: str,
    containers: Iterable[Mapping],
    ledger: Mapping[str, Sequence[str]],
) -> Reconciliation:
    """The ledger's truth from the engine's container list.

    ``containers`` are entries as ``docker ps --all`` lists them (``Id``,
    ``Names``, ``State``, ``Labels``, ``Created``); ``ledger`` is owner ->
    UUIDs held now. Only running containers of this ``hub`` hold GPUs;
    exited, created or dead ones hold none. If two running containers claim
    one GPU (which gpuspawner never does), the older container keeps it and
    the conflict is reported.
    """
    running = []
    for c in containers:
        allocation = allocation_from_labels(c.get("Labels"))
        if allocation is None or allocation.hub != hub:
            continue
        if c.get("State") != "running":
            continue
        running.append((c.get("Created", 0), c.get("Id", ""), container_name(c), allocation))
    running.sort(key=lambda item: (item[0], item[1]))

    holdings: dict[str, tuple[str, ...]] = {}
    allocations: dict[str, ContainerAllocation] = {}
    names: dict[str, str] = {}
    taken: dict[str, str] = {}
    conflicts = []
    for _, _, name, allocation in running:
        if allocation.owner in holdings:
            conflicts.append(
                f"container {name} also claims to be {allocation.owner}'s server; its GPUs "
                f"{', '.join(allocation.uuids) or '(none)'} are not counted twice"
            )
            continue
        kept = []
        for uuid in allocation.uuids:
            if uuid in taken:
                conflicts.append(f"GPU {uuid} is claimed by container {name} ({allocation.owner}) "
                                 f"and by {taken[uuid]}'s container; the older one keeps it")
                continue
            taken[uuid] = allocation.owner
            kept.append(uuid)
        holdings[allocation.owner] = tuple(kept)
        allocations[allocation.owner] = allocation
        names[allocation.owner] = name
    release = tuple(sorted(owner for owner, uuids in ledger.items() if uuids and owner not in holdings))
    holdings = {owner: uuids for owner, uuids in holdings.items() if uuids}
    return Reconciliation(holdings, release, tuple(conflicts), allocations, names)


def container_name(container: Mapping) -> str:
    """A container's name as ``docker ps`` lists it (its short id when it has none)."""
    names = container.get("Names") or []
    if names:
        return str(names[0]).lstrip("/")
    return str(container.get("Id", "?"))[:12]
