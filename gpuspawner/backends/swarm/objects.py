"""Pure pieces of the Swarm backend: node GPUs, service spec, task GPUs, waiting words.

No Docker I/O here (``spawner.py`` does that). Swarm nodes advertise their GPUs
as named generic resources (dockerd ``--node-generic-resource
NVIDIA-GPU=GPU-<uuid>``) and their model as a node label; a service reserves
``NVIDIA-GPU=N`` and is constrained to that label; Swarm picks the GPUs and
hands each task its own in ``DOCKER_RESOURCE_NVIDIA-GPU``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...gpu import GPU

RESOURCE_KIND = "NVIDIA-GPU"
MODEL_LABEL = "org.gpuspawner.gpu-model"
#: task states in which a task holds (or is about to hold) its generic resources
LIVE_STATES = frozenset({"new", "pending", "assigned", "accepted", "preparing", "ready", "starting", "running"})


def node_gpus(nodes: Iterable[Mapping], label: str = MODEL_LABEL) -> tuple[GPU, ...]:
    """Every GPU the ready nodes advertise, named by the node's model label."""
    gpus = []
    for node in nodes:
        if (node.get("Status") or {}).get("State") != "ready":
            continue
        if (node.get("Spec") or {}).get("Availability", "active") != "active":
            continue
        name = ((node.get("Spec") or {}).get("Labels") or {}).get(label) or "Unknown GPU"
        host = (node.get("Description") or {}).get("Hostname") or node.get("ID", "?")
        resources = ((node.get("Description") or {}).get("Resources") or {}).get("GenericResources") or []
        uuids = [r["NamedResourceSpec"]["Value"] for r in resources
                 if (r.get("NamedResourceSpec") or {}).get("Kind") == RESOURCE_KIND]
        gpus.extend(GPU(host=host, index=i, uuid=u, name=name) for i, u in enumerate(uuids))
    return tuple(gpus)


def task_gpus(task: Mapping) -> tuple[str, ...]:
    """The GPU UUIDs Swarm assigned to a task (empty before it is assigned)."""
    return tuple(
        r["NamedResourceSpec"]["Value"] for r in task.get("GenericResources") or []
        if (r.get("NamedResourceSpec") or {}).get("Kind") == RESOURCE_KIND
    )


def gpu_reservations(generic_resources: object) -> list[str]:
    """The ``NVIDIA-GPU`` reservations among generic resources, in docker-py's spelling
    (``{"NVIDIA-GPU": 2}``) or the API's (``[{"DiscreteResourceSpec": {...}}]``), as ``Kind=Value``."""
    if isinstance(generic_resources, Mapping):
        return [f"{k}={v}" for k, v in generic_resources.items() if k == RESOURCE_KIND]
    found = []
    for entry in generic_resources or ():
        spec = (entry.get("DiscreteResourceSpec") or entry.get("NamedResourceSpec") or {}) if isinstance(
            entry, Mapping) else {}
        if spec.get("Kind") == RESOURCE_KIND:
            found.append(f"{RESOURCE_KIND}={spec.get('Value')}")
    return found


def template_gpu_reservations(task_template: Mapping) -> list[str]:
    """The ``NVIDIA-GPU`` reservations a service's task template already makes (from configuration)."""
    reservations = ((task_template.get("Resources") or {}).get("Reservations") or {})
    return gpu_reservations(reservations.get("GenericResources"))


def missing_image(err: str) -> bool:
    """Whether a task's error says its image could not be found or pulled on its node."""
    return any(words in err for words in ("No such image", "manifest unknown", "pull access denied",
                                          "repository does not exist"))


def add_gpu_reservation(task_template: dict, count: int, model_name: str | None, label: str = MODEL_LABEL) -> dict:
    """The task template with ``NVIDIA-GPU=count`` reserved and placed on nodes of ``model_name``."""
    template = dict(task_template)
    resources = dict(template.get("Resources") or {})
    reservations = dict(resources.get("Reservations") or {})
    others = [r for r in reservations.get("GenericResources") or []
              if (r.get("DiscreteResourceSpec") or r.get("NamedResourceSpec") or {}).get("Kind") != RESOURCE_KIND]
    if count:
        others.append({"DiscreteResourceSpec": {"Kind": RESOURCE_KIND, "Value": count}})
    if others:
        reservations["GenericResources"] = others
    else:
        reservations.pop("GenericResources", None)
    resources["Reservations"] = reservations
    template["Resources"] = resources
    if count and model_name:
        placement = dict(template.get("Placement") or {})
        constraints = [c for c in placement.get("Constraints") or [] if not c.startswith(f"node.labels.{label}")]
        constraints.append(f"node.labels.{label}=={model_name}")
        placement["Constraints"] = constraints
        template["Placement"] = placement
    return template


def as_container(service: Mapping, task: Mapping | None, labels: Mapping[str, str], gpus_label: str) -> dict:
    """A service and its live task in the shape ``docker.objects.reconcile`` reads (``docker ps``)."""
    state = "running" if task is not None and (task.get("Status") or {}).get("State") in LIVE_STATES else "exited"
    return {
        "Id": service.get("ID", ""),
        "Names": [(service.get("Spec") or {}).get("Name", "")],
        "Created": service.get("CreatedAt", ""),
        "State": state,
        "Labels": {**labels, gpus_label: ",".join(task_gpus(task) if task else ())},
    }


def waiting_words(task: Mapping, count: int, model: str) -> str | None:
    """Swarm's reason a task is not placed yet, in words; None when it is not waiting."""
    status = task.get("Status") or {}
    if status.get("State") != "pending":
        return None
    err = status.get("Err") or status.get("Message") or ""
    if "insufficient resources" in err:
        return f"Waiting for a node with {count} free {model} GPU(s): every such GPU is in use (Swarm: {err})"
    if "constraint" in err:
        return f"Waiting: no Swarm node offers {model} GPUs right now (Swarm: {err})"
    return f"Waiting for Swarm to place the server ({err or 'pending'})"


#: task states that end a task without it running: Swarm's own words for why are in Status.Err
ENDED_STATES = frozenset({"rejected", "failed"})


def start_failure(task: Mapping) -> str | None:
    """Why Swarm could not start a task (e.g. the NVIDIA hook refusing a device), or None."""
    status = task.get("Status") or {}
    if status.get("State") not in ENDED_STATES:
        return None
    return status.get("Err") or status.get("Message") or status.get("State")
