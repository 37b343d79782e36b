"""``gpu-swarm``: each user's server is a Swarm service that reserves its GPUs.

:class:`GPUDockerSpawner`'s behaviour (form, checks, CUDA check, errors,
reconciliation, stop) on DockerSpawner's :class:`~dockerspawner.SwarmSpawner`.
What differs is who picks the GPUs: every Swarm node advertises its GPUs as
named generic resources (``NVIDIA-GPU=GPU-<uuid>``) and its model as the node
label ``org.gpuspawner.gpu-model``; a server becomes a service reserving
``NVIDIA-GPU=N`` and constrained to nodes of the chosen model, and Swarm hands
the task its own GPUs in ``DOCKER_RESOURCE_NVIDIA-GPU`` (which the NVIDIA
runtime maps to the visible devices with ``swarm-resource`` in its config).

The hub's inventory is the nodes' generic resources; the ledger holds the GPUs
Swarm assigned to this hub's live tasks (read from the tasks, so it survives a
hub restart: the services carry the owner in their labels). The hub claims
GPUs as gpu-docker does (its pick of the model, held in the ledger, so counts
stay right); once Swarm has assigned the task its GPUs, the mixin's second step
(:meth:`~gpuspawner.backends.base.GPUSpawnerMixin.correct_claim`) holds Swarm's
instead, in the ledger, the admin's overview and the server's state, as soon as
the task says (while it starts) and again once the service runs.
"""

from __future__ import annotations

import asyncio
import time

from dockerspawner import SwarmSpawner
from jupyterhub.utils import random_port
from traitlets import TraitError, Unicode, validate

from ...inventory import InventoryReading
from ..docker.objects import GPUS, HUB, allocation_labels
from ..docker.spawner import GPUDockerSpawner
from ..errors import user_error
from .objects import (
    LIVE_STATES,
    MODEL_LABEL,
    RESOURCE_KIND,
    add_gpu_reservation,
    as_container,
    gpu_reservations,
    missing_image,
    node_gpus,
    start_failure,
    task_gpus,
    template_gpu_reservations,
    waiting_words,
)

#: seconds stop() waits for Swarm to shut a removed service's task down (and free its GPUs)
TASK_SHUTDOWN_WAIT = 60


class SwarmInventory:
    """The GPUs the swarm's ready nodes advertise (an inventory source, read in a thread)."""

    def __init__(self, client, label: str = MODEL_LABEL) -> None:
        self.client = client
        self.label = label

    def read(self) -> InventoryReading:
        try:
            nodes = self.client.nodes()
        except Exception as e:  # the form still renders and says so
            return InventoryReading(problems=(f"Swarm nodes cannot be listed: {e}",))
        return InventoryReading(gpus=node_gpus(nodes, self.label))


class GPUSwarmSpawner(GPUDockerSpawner, SwarmSpawner):
    """SwarmSpawner whose services reserve ``NVIDIA-GPU=N`` of the chosen model."""

    gpu_model_label = Unicode(
        MODEL_LABEL,
        help="""
        The Swarm node label that names the model of the node's GPUs, as NVML names it
        (``docker node update --label-add org.gpuspawner.gpu-model="NVIDIA A100 80GB PCIe"``).
        The hub's GPUs are the ``NVIDIA-GPU`` generic resources (GPU UUIDs) of the swarm's
        ready, active nodes (this replaces ``gpu_inventory``), named by this label ("Unknown
        GPU" where a node lacks it); a service asking for GPUs is constrained to nodes whose
        label is the chosen model. A constraint on this label in SwarmSpawner's
        ``extra_placement_spec`` is refused at hub start (the chosen model decides it).
        """,
    ).tag(config=True)

    honours_interconnect = False  # Swarm picks the GPUs
    host_word = "node"  # a swarm node holds a request's GPUs
    #: no notebook GPU jobs on Swarm (yet): gpu-docker's runner makes a plain container, which Swarm
    #: gives no GPUs; the job API answers 501 with a sentence saying so, and nothing runs
    gpu_job_runner = None

    @validate("extra_placement_spec")
    def _refuse_model_constraints(self, proposal):
        """A configured constraint on the model label would be replaced by the chosen model's: refused."""
        self._check_model_constraints(proposal["value"], self.gpu_model_label)
        return proposal["value"]

    @validate("gpu_model_label")
    def _check_model_label(self, proposal):
        self._check_model_constraints(self.extra_placement_spec, proposal["value"])
        return proposal["value"]

    @staticmethod
    def _check_model_constraints(placement: dict | None, label: str) -> None:
        found = [c for c in (placement or {}).get("constraints") or []
                 if isinstance(c, str) and c.replace(" ", "").startswith(f"node.labels.{label}")]
        if found:
            raise TraitError(
                f"SwarmSpawner.extra_placement_spec constrains the GPU model label ({found[0]}): each GPU "
                f"server is placed on nodes of the model its user chose (node.labels.{label}), so this "
                "setting is refused rather than replaced. Remove it, and offer models through gpu_profiles."
            )

    @validate("extra_resources_spec")
    def _refuse_gpu_reservations(self, proposal):
        """GPUs reserved in configuration would be replaced by the profile's: refused, never dropped."""
        found = gpu_reservations((proposal["value"] or {}).get("generic_resources"))
        if found:
            raise TraitError(
                f"SwarmSpawner.extra_resources_spec reserves GPUs ({', '.join(found)}): {type(self).__name__} "
                f"reserves each server's GPUs from its profile ({RESOURCE_KIND}=N of the chosen model), so it "
                "refuses this setting rather than ignore it. Remove it, and offer GPUs through gpu_profiles."
            )
        return proposal["value"]

    @property
    def hub_state(self):
        state = GPUDockerSpawner.hub_state.fget(self)
        if not isinstance(state.inventory.source, SwarmInventory):
            state.inventory.source = SwarmInventory(self.client, self.gpu_model_label)
            state.inventory.invalidate()
        return state

    @hub_state.setter
    def hub_state(self, state) -> None:
        GPUDockerSpawner.hub_state.fset(self, state)

    # ------------------------------------------------------------ the service

    def get_env(self):
        env = super().get_env()
        if self.gpu_allocation:
            # Swarm, not the hub, picks the GPUs: the task gets them in DOCKER_RESOURCE_NVIDIA-GPU
            env.pop("NVIDIA_VISIBLE_DEVICES", None)
        return env

    def docker(self, method, *args, **kwargs):
        """DockerSpawner's Docker call (in its worker thread), with the GPU reservation on create."""
        if method == "create_service":
            configured = template_gpu_reservations(kwargs["task_template"])
            if configured:  # (extra_task_spec's resources; extra_resources_spec is refused at start)
                message = (f"This hub's configuration reserves GPUs for your server ({', '.join(configured)}) "
                           "besides the ones its profile asks for; gpu-swarm reserves exactly those. Ask an "
                           "administrator to remove the reservation from SwarmSpawner.extra_task_spec.")
                self.gpu_event(f"Failed: {message}", 100)
                raise user_error(500, message)
            gpus = self.gpu_allocation
            labels = allocation_labels(self.gpu_hub_id, self.gpu_owner, gpus)
            labels.pop(GPUS, None)  # Swarm picks them: read from the task
            kwargs["labels"] = {**(kwargs.get("labels") or {}), **labels}
            kwargs["task_template"] = add_gpu_reservation(
                kwargs["task_template"], len(gpus), gpus[0].name if gpus else None, self.gpu_model_label
            )
        return super().docker(method, *args, **kwargs)

    async def _bind_cpus(self):
        return None  # the node is Swarm's choice: its CPUs are not known here

    # ------------------------------------------------------------ reconciliation

    backend_name = "gpu-swarm"
    workload_word = "service"

    async def _labelled_servers(self) -> list[dict]:
        """This hub's services with their live task, in the shape of ``docker ps`` (GPUs Swarm assigned)."""
        services = await self.docker("services", filters={"label": f"{HUB}={self.gpu_hub_id}"})
        found = []
        for service in services:
            tasks = await self.docker("tasks", filters={"service": service["ID"], "desired-state": "running"})
            labels = (service.get("Spec") or {}).get("Labels") or {}
            found.append(as_container(service, tasks[0] if tasks else None, labels, GPUS))
        return found

    async def _found_gpus(self, plan) -> dict:
        """Each found server's GPUs, named from the nodes' inventory (labels carry no GPU list here)."""
        reading = await self.inventory.read()
        known = {g.uuid: g for g in reading.gpus}
        return {owner: tuple(known[u] for u in plan.holdings.get(owner, ()) if u in known)
                for owner in plan.allocations}

    def _check_inventory_source(self) -> None:
        pass  # the nodes' generic resources are the inventory

    # ------------------------------------------------------------ lifecycle

    async def _settle_leftover(self) -> None:
        """A service of this server left from before is removed (SwarmSpawner always removes services)."""
        obj = await self.get_object()
        self._kept = None
        self._absent = True
        if obj is None:
            return
        self.log.warning("%s: removing leftover service %s before placing GPUs", self._log_name, self.service_name)
        await self.docker("remove_service", obj["ID"])
        self.object_id = ""

    async def _remove_failed_container(self) -> None:
        if not self.object_id:
            return
        try:
            await self.docker("remove_service", self.object_id)
            self.log.info("%s: removed service %s of the failed start", self._log_name, self.service_name)
        except Exception as e:
            self.log.error("%s: could not remove service %s: %s", self._log_name, self.service_name, e)
            return
        self.object_id = ""

    async def remove_object(self):
        """Remove the service, then wait until Swarm has shut its task down.

        Swarm frees a task's generic resources only once the task is down; the GPUs
        go back to the hub's ledger after that, so the next server placed on them is
        not left pending on "insufficient resources".
        """
        tasks = await self.docker("tasks", filters={"service": self.object_id})
        await super().remove_object()
        ids = [t["ID"] for t in tasks if (t.get("Status") or {}).get("State") in LIVE_STATES]
        deadline = time.monotonic() + TASK_SHUTDOWN_WAIT
        while ids:  # (a removed service's tasks are found by their own IDs only)
            tasks = await self.docker("tasks", filters={"id": ids})
            ids = [t["ID"] for t in tasks if (t.get("Status") or {}).get("State") in LIVE_STATES]
            if ids and time.monotonic() > deadline:
                self.log.warning("%s: the task of removed service %s is still live after %d s",
                                 self._log_name, self.service_name, TASK_SHUTDOWN_WAIT)
                return
            if ids:
                await asyncio.sleep(0.2)

    async def create_object(self):
        gpus = len(self.gpu_allocation)
        what = f"{gpus} {self.gpu_allocation[0].name} GPU(s)" if gpus else "no GPU"
        self.gpu_event(f"Creating Swarm service {self.service_name} from {self.image} reserving {what}", 50)
        # SwarmSpawner's, named: the next in the MRO is gpu-docker's, which makes a container (its CPUs, words, errors)
        return await SwarmSpawner.create_object(self)

    async def get_task(self):
        task = await super().get_task()
        if task is not None and getattr(self, "_spawn_pending", False):
            await self._check_start_failure()
            if self.gpu_allocation:
                self._report_task(task)
        return task

    async def _check_start_failure(self) -> None:
        """Fail the spawn at once when Swarm could not start a task of it (SwarmSpawner would
        wait for its next try until start_timeout), with Swarm's reason."""
        tasks = await self.docker("tasks", filters={"service": self.service_name})
        failed = sorted((t for t in tasks if start_failure(t)), key=lambda t: t.get("UpdatedAt") or "")
        if not failed:
            return
        task = failed[-1]
        node = (task.get("NodeID") or "")[:12]
        why = start_failure(task)
        if missing_image(why):  # as gpu-docker answers an image its registry does not have
            message = (f"Image {self.image} could not be found on Swarm node {node} (Swarm: {why}). "
                       "Choose another image, or ask an administrator to publish it.")
            self.gpu_event(f"Failed: {message}", 100)
            raise user_error(400, message)
        check = "that node's NVIDIA runtime" if "nvidia" in why.lower() else "that node"
        message = (f"Swarm could not start your server (service {self.service_name}, node {node}): "
                   f"{why}. Ask an administrator to check {check} if this happens again.")
        self.gpu_event(f"Failed: {message}", 100)
        raise user_error(500, message)

    def _report_task(self, task) -> None:
        model = self.gpu_allocation[0].name
        words = waiting_words(task, len(self.gpu_allocation), model)
        if words and words != getattr(self, "_last_wait", None):
            self._last_wait = words
            self.gpu_event(words, 55)
        self.correct_claim(task_gpus(task))  # as soon as Swarm says, while the task starts

    #: Swarm picks the exact GPUs of the model and count the hub claimed (the mixin's correct_claim)
    picked_by = "Swarm"

    async def assigned_gpus(self) -> tuple[str, ...]:
        """The GPUs Swarm gave the started service's task (``DOCKER_RESOURCE_NVIDIA-GPU``)."""
        task = await super().get_task()  # SwarmSpawner's: the start is over, no start failure to look for
        return task_gpus(task) if task is not None else ()

    async def start_object(self):
        self.gpu_event(f"Waiting for Swarm to start service {self.service_name}", 60)
        # SwarmSpawner's, named: the next in the MRO is gpu-docker's, whose words and errors are a container's
        await SwarmSpawner.start_object(self)

    async def start(self):
        if self.network_name == "host":
            self.port = random_port()  # every server shares the node's network: a port of its own
        return await super().start()

    def get_state(self) -> dict:
        state = super().get_state()
        if self.network_name == "host" and self.object_id:
            state["host_port"] = self.port  # a restarted hub asks the server there (get_url)
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        if state.get("host_port"):
            self.port = int(state["host_port"])

    async def get_ip_and_port(self):
        if self.network_name == "host":
            return self.host_ip, self.port
        return await super().get_ip_and_port()
