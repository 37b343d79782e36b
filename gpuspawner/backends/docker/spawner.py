"""``gpu-docker``: each user's container gets exactly the GPUs placed for it.

A :class:`dockerspawner.DockerSpawner` through the shared mixin. The
placement becomes a Docker ``DeviceRequest`` naming the GPUs by UUID (never a
count: Docker's ``count=N`` is always GPUs 0..N-1, which puts every user on
the same GPU), and is written on the container as labels and in spawner state.

The running containers are the truth: the first time the hub needs the
ledger (a poll at hub start, a spawn, the form), and then every
``gpu_reconcile_interval`` seconds, it lists this hub's labelled containers
and makes the ledger hold exactly what the running ones hold, including
containers the hub's database forgot (a hub killed mid-spawn: adopted, and
logged). Exited or removed containers hold nothing (a container removed behind
the hub's back stops counting without a restart). Every Docker call runs in
DockerSpawner's worker thread, off the event loop; the decisions are the pure
functions of :mod:`gpuspawner.backends.docker.objects` and
:mod:`gpuspawner.compat`.

DockerSpawner's own settings keep working (``docs/compatibility.md``): its
``allowed_images`` and their picker beside the profiles' images, ``pull_policy``
and its errors, ``remove = False`` (a kept container restarts on the GPUs it was
made with). Configuration that would give a container other GPUs (an NVIDIA
device request or device node in ``extra_host_config``, ``NVIDIA_VISIBLE_DEVICES``
in ``environment``) is refused with a sentence, never dropped.
"""

from __future__ import annotations

import os
from typing import Any

import docker.errors
from dockerspawner import DockerSpawner
from tornado import web
from traitlets import Bool, TraitError, default, observe, validate

from ...cpus import Binding, cpu_binding, host_numa_nodes
from ...placement import PlacementError
from ...profiles import Choice, OfferedImages
from ...refusals import refuse
from ..base import Claim, GPUSpawnerMixin, user_error
from .engine import ImageUnavailable, is_unreachable
from .images import DockerImagesMixin
from .objects import (
    HUB,
    OWNER,
    VISIBLE_DEVICES,
    allocation_from_labels,
    allocation_labels,
    device_request,
    other_gpu_access,
    visible_devices_env,
)
from .reconciling import DockerReconcileMixin


def add_gpus_to_create_kwargs(
    kwargs: dict[str, Any], labels: dict[str, str], request: dict | None, binding: Binding | None = None
) -> tuple[dict[str, Any], list[dict]]:
    """``create_container`` arguments with this server's labels and only its GPU request.

    Any NVIDIA device request from configuration (``extra_host_config``, e.g.
    ``count=-1`` for all GPUs) is dropped: the placed GPUs are the only ones a
    container gets. ``binding``: the CPUs and memory nodes next to the GPUs
    (``CpusetCpus``/``CpusetMems``), unless configuration set a cpuset already.
    Returns the new arguments and the requests dropped.
    """
    kwargs = dict(kwargs)
    kwargs["labels"] = {**(kwargs.get("labels") or {}), **labels}
    host_config = dict(kwargs.get("host_config") or {})
    if binding is not None and binding.cpus and not host_config.get("CpusetCpus"):
        host_config["CpusetCpus"] = binding.cpuset_cpus
        if binding.mems and not host_config.get("CpusetMems"):
            host_config["CpusetMems"] = binding.cpuset_mems
    existing = list(host_config.get("DeviceRequests") or [])
    kept = [r for r in existing if (r.get("Driver") or r.get("driver") or "") not in ("nvidia", "")]
    dropped = [r for r in existing if r not in kept]
    if request is not None:
        kept.append(request)
    if kept:
        host_config["DeviceRequests"] = kept
    else:
        host_config.pop("DeviceRequests", None)
    kwargs["host_config"] = host_config
    return kwargs, dropped


class GPUDockerSpawner(DockerReconcileMixin, DockerImagesMixin, GPUSpawnerMixin, DockerSpawner):
    """DockerSpawner whose containers get exactly their placed GPUs, by UUID."""

    gpu_job_runner = "gpuspawner.backends.docker.jobs.DockerJobs"

    check_cuda_compatibility = Bool(
        True,
        help="""
        Refuse to start a GPU server (or notebook GPU job) whose image needs a newer CUDA
        than the driver on the GPUs' host supports: the image's ``NVIDIA_REQUIRE_CUDA``,
        ``CUDA_VERSION`` or label ``com.nvidia.cuda.version`` against the GPUs' CUDA driver
        version (NVML's, or ``cuda_driver_version`` in ``static_gpus``), refused with HTTP
        409 and a sentence naming both versions. Not checked where either is unknown: an
        image not on the engine after the pull (``pull_policy`` ``"skip"``), GPUs whose
        driver version the hub does not know (gpu-swarm's nodes never say it); CPU-only
        servers are never checked. Turn off to let such containers start anyway.
        """,
    ).tag(config=True)

    use_device_requests = Bool(
        True,
        help="""
        Give each container (server or notebook GPU job) its GPUs as a Docker DeviceRequest
        by UUID, with the profile's ``capabilities``, which needs the NVIDIA container toolkit
        on the Docker host. Turn off only where GPUs are simulated on an engine without the
        toolkit: containers then get ``NVIDIA_VISIBLE_DEVICES`` only (jobs also
        ``CUDA_VISIBLE_DEVICES``), which isolates nothing. gpu-swarm ignores it: its
        services reserve generic resources instead.
        """,
    ).tag(config=True)

    @default("remove")
    def _default_remove(self):
        # A container's GPUs are fixed when it is created: a kept one restarts only on the
        # GPUs it was made with (remove = False), which may belong to someone else by then.
        return True

    @observe(*DockerSpawner._deprecated_aliases)
    def _deprecated_trait(self, change):
        """DockerSpawner's old setting names still work, with its warning, which names the setting
        as the site's configuration does (``DockerSpawner.image_whitelist``), not this class."""
        new, version = self._deprecated_aliases[change.name]
        if getattr(self, new) != change.new:
            parent = next(c.__name__ for c in type(self).__mro__ if c.__module__.startswith("dockerspawner."))
            self.log.warning("%s.%s is deprecated in DockerSpawner %s, use %s.%s instead",
                             parent, change.name, version, parent, new)
            setattr(self, new, change.new)

    @validate("extra_host_config", "extra_create_kwargs", "environment")
    def _refuse_other_gpus(self, proposal):
        """Configuration that would give containers GPUs besides their own is refused, never dropped."""
        value, name = proposal["value"], proposal["trait"].name
        if callable(value):  # its result is checked on each create (docker())
            return value
        if name == "extra_host_config":
            found = other_gpu_access(value)
        elif name == "extra_create_kwargs":
            found = other_gpu_access(value.get("host_config"), value.get("environment"))
        else:
            found = other_gpu_access(None, value)
        if found:
            owner = "Spawner" if name == "environment" else "DockerSpawner"
            raise TraitError(
                f"{owner}.{name} gives containers GPUs besides their own ({'; '.join(found)}): "
                f"{type(self).__name__} gives each server exactly the GPUs placed for it, so it refuses "
                "this setting rather than ignore it. Remove it, and offer GPUs through gpu_profiles."
            )
        return value

    # ------------------------------------------------------------ profile -> options

    def offered_images(self) -> OfferedImages:
        """DockerSpawner's ``allowed_images`` (a callable's answer for this server): what a profile
        without ``images`` lets users pick, by the names DockerSpawner's picker shows."""
        return self._get_allowed_images()

    def default_image(self) -> str | None:
        return getattr(self, "_configured_image", self.image)

    def apply_profile(self, choice: Choice) -> None:
        super().apply_profile(choice)
        if not hasattr(self, "_configured_image"):
            self._configured_image = self.image
        if choice.image and choice.image in choice.profile.images:
            self.image = choice.image
        elif choice.image:  # one of allowed_images, by its name there (as DockerSpawner.start resolves it)
            allowed = self._get_allowed_images()
            self.image = choice.image if allowed == "*" else allowed[choice.image]
        elif choice.profile.images:
            self.image = choice.profile.images[0]
        else:
            self.image = self._configured_image

    async def check_allowed(self, image):
        # user_options["image"] was checked already: a profile's image, else DockerSpawner's check
        choice = self.gpu_choice
        if choice is not None and image in choice.profile.images:
            return image
        return await super().check_allowed(image)

    def get_env(self):
        env = super().get_env()
        env.update(visible_devices_env(self.gpu_uuids))
        return env

    @property
    def _capabilities(self) -> tuple[str, ...]:
        choice = self.gpu_choice
        return choice.profile.capabilities if choice is not None else ("compute", "utility")

    def docker(self, method, *args, **kwargs):
        """DockerSpawner's Docker call (in its worker thread), with the GPUs added on create.

        A container whose configuration (``extra_host_config``, ``extra_create_kwargs``,
        ``environment``, callables included) would reach other GPUs is refused (500).
        """
        if method == "create_container":
            ours = visible_devices_env(self.gpu_uuids)[VISIBLE_DEVICES]
            found = other_gpu_access(kwargs.get("host_config"), kwargs.get("environment"), ours)
            if found:
                message = (f"This hub's configuration would give your server GPUs besides its own "
                           f"({'; '.join(found)}); gpu-docker gives each server exactly the GPUs placed for it. "
                           "Ask an administrator to remove that from DockerSpawner.extra_host_config, "
                           "extra_create_kwargs or environment.")
                self.gpu_event(f"Failed: {message}", 100)
                raise user_error(500, message)
            labels = allocation_labels(self.gpu_hub_id, self.gpu_owner, self.gpu_allocation)
            request = device_request(self.gpu_uuids, self._capabilities) if self.use_device_requests else None
            kwargs, _ = add_gpus_to_create_kwargs(kwargs, labels, request, self._cpu_binding)
        return super().docker(method, *args, **kwargs)

    @property
    def engine_url(self) -> str:
        return (
            self.client_kwargs.get("base_url")
            or os.environ.get("DOCKER_HOST")
            or "unix:///var/run/docker.sock"
        )

    def _unreachable(self, error: BaseException, what: str) -> Exception:
        message = (
            f"The Docker engine at {self.engine_url} cannot be reached ({type(error).__name__}). "
            f"{what} Try again later, or ask an admin to check the engine."
        )
        self.log.error("%s: %s: %s", self._log_name, message, error)
        return user_error(503, message)

    # ------------------------------------------------------------ lifecycle

    async def poll(self):
        await self.ensure_reconciled()
        status = await super().poll()
        if status is None:
            self._adopt_reconciled_allocation()
        return status

    async def get_url(self):
        """Where the server runs, asked of the container (JupyterHub asks after a restart).

        A hub killed between starting a container and recording its address has no
        address for it in its database; without this, it would wait ``http_timeout``
        for nothing and then stop a healthy server.
        """
        try:
            ip, port = await self.get_ip_and_port()
        except Exception as e:
            self.log.warning("%s: cannot ask the container for its address: %s", self._log_name, e)
            return await super().get_url()
        scheme = "https" if self.internal_ssl else "http"
        host = f"[{ip}]" if ":" in ip else ip
        return f"{scheme}://{host}:{port}"

    async def start(self):
        try:
            await self.ensure_reconciled()
            await self._settle_leftover()
        except web.HTTPError:
            raise
        except Exception as e:
            if is_unreachable(e):
                raise self._unreachable(e, "No GPU was reserved.") from e
            raise
        try:
            result = await super().start()  # mixin: place and reserve, then DockerSpawner.start
        except BaseException as e:
            self._absent = False
            # the mixin has released the GPUs; a refused or failed start leaves no container
            if self._kept is None:
                await self._remove_failed_container()
            if isinstance(e, ImageUnavailable):
                self.gpu_event(f"Failed: {e.sentence}", 100)
                raise user_error(400, e.sentence) from e
            if isinstance(e, Exception) and is_unreachable(e):
                raise self._unreachable(e, "Its GPUs were released.") from e
            raise
        finally:
            self._kept = None
        self.gpu_event("Container started; waiting for the Jupyter server in it to answer", 80)
        return result

    #: this server's container that ``remove = False`` kept, which this start restarts
    _kept: dict | None = None

    async def _settle_leftover(self) -> None:
        """A container of this server left from before: restart it (``remove = False``) or remove it.

        With ``remove = False``, as DockerSpawner does, a kept container of this server
        (stopped, or forgotten by the hub) is started again, on the GPUs it was made with
        (its :meth:`claim`). Otherwise it is removed before placing, so its GPUs are free
        again only once it is gone.
        """
        obj = await self.get_object()
        self._kept = None
        self._absent = obj is None  # DockerSpawner.start need not ask again
        if obj is None:
            return
        labels = (obj.get("Config") or {}).get("Labels") or {}
        ours = labels.get(HUB) is None or (labels.get(HUB) == self.gpu_hub_id and labels.get(OWNER) == self.gpu_owner)
        if not self.remove and ours:
            self._kept = obj
            return
        self.log.warning(
            "%s: removing leftover container %s (%s) before placing GPUs",
            self._log_name, self.object_name, obj.get("State", {}).get("Status", "?"),
        )
        await self.docker("remove_container", obj["Id"], v=True, force=True)
        self.object_id = ""
        self._absent = True

    def _kept_uuids(self) -> tuple[str, ...]:  # the GPUs the kept container was made with (its labels)
        allocation = allocation_from_labels((self._kept.get("Config") or {}).get("Labels"))
        return allocation.uuids if allocation is not None else ()

    def claim_opening(self, choice: Choice) -> str:
        if self._kept is None:
            return super().claim_opening(choice)
        return (f"Restarting your kept container {self.object_name} (DockerSpawner.remove is False) on the GPUs "
                f"it was made with: {', '.join(self._kept_uuids()) or 'none'}")

    def claims_nothing(self, choice: Choice) -> bool:
        return self._kept is None and super().claims_nothing(choice)  # a kept container has its GPUs

    async def claim(self, choice: Choice) -> Claim:
        """The GPUs placed for ``choice``; a kept container (``remove = False``) claims exactly its own."""
        if self._kept is None:
            return await super().claim(choice)
        uuids = self._kept_uuids()
        reading = await self.inventory.read()
        known = {g.uuid: g for g in reading.gpus}
        gone = [u for u in uuids if u not in known]
        try:
            if gone:
                raise refuse("gpus_gone", {"gpus": ", ".join(gone)})
            return Claim(gpus=self.hold_exactly(tuple(known[u] for u in uuids)) if uuids else ())
        except PlacementError as e:  # the refusal, in the kept container's words
            message = (f"Your kept container {self.object_name} cannot start again: {e}. It runs only on the GPUs "
                       "it was made with; try again when they are free, or ask an administrator to remove the "
                       "container (the next start then places new GPUs).")
            self.gpu_event(f"Refused: {message}", 100)
            raise user_error(409, message) from e

    async def get_object(self):
        if getattr(self, "_absent", False):
            self._absent = False
            return None
        return await super().get_object()

    async def _remove_failed_container(self) -> None:
        if not self.object_id:
            return
        try:
            await self.docker("remove_container", self.object_id, v=True, force=True)
            self.log.info("%s: removed container %s of the failed start", self._log_name, self.object_name)
        except docker.errors.NotFound:
            pass
        except Exception as e:  # the engine may be the reason the start failed
            self.log.error("%s: could not remove container %s: %s", self._log_name, self.object_name, e)
            return
        self.object_id = ""

    _cpu_binding: Binding | None = None

    async def _bind_cpus(self) -> Binding | None:
        """The CPUs next to this server's GPUs on the engine's host (``pin_cpus``); logs the decision."""
        if not self.pin_cpus or not self.gpu_allocation:
            return None
        try:
            info = await super().docker("info")
        except docker.errors.APIError as e:
            self.log.warning("%s: not pinning CPUs: the engine did not say its CPUs (%s)", self._log_name, e)
            return None
        # Containers run on the engine's host: its CPUs (NCPU), its NUMA nodes where it is this machine.
        local = self.engine_url.startswith("unix://")
        binding = cpu_binding(
            self.gpu_allocation, range(int(info.get("NCPU") or 0)), host_numa_nodes() if local else (), self.cpu_limit
        )
        self.log.info("%s: %s", self._log_name, binding.reason)
        return binding

    async def create_object(self):
        gpus = ", ".join(g.uuid for g in self.gpu_allocation) or "no GPU"
        self._cpu_binding = await self._bind_cpus()
        if self._cpu_binding is not None and self._cpu_binding.cpus:
            self.gpu_event(f"CPUs {self._cpu_binding.cpuset_cpus}, next to the GPUs", 45)
        self.gpu_event(f"Creating container {self.object_name} from {self.image} with {gpus}", 50)
        try:
            return await super().create_object()
        except docker.errors.ImageNotFound as e:  # pull_policy "skip": the hub did not pull it
            raise ImageUnavailable(e, f"Image {self.image} is not on the Docker host, and pull_policy "
                                      f"{self.pull_policy!r} keeps the hub from pulling it. Choose another image, "
                                      "or ask an administrator to pull it.") from e
        except docker.errors.APIError as e:
            raise self._engine_refused(e, "create") from e

    async def start_object(self):
        self.gpu_event(f"Starting container {self.object_name}", 60)
        try:
            await super().start_object()
        except docker.errors.APIError as e:
            # e.g. the NVIDIA runtime hook refusing a device: "unknown device"
            raise self._engine_refused(e, "start") from e

    def _engine_refused(self, error: docker.errors.APIError, action: str) -> Exception:
        message = f"Docker could not {action} container {self.object_name}: {error.explanation or error}"
        self.gpu_event(f"Failed: {message}", 100)
        return user_error(500, message)

    # a leftover container may still run when JupyterHub clears the state, or after a stop that failed:
    # its GPUs go back once it is gone (a stop that worked, the next start, a reconciliation)
    gpus_outlive_state = True

    def clear_state(self) -> None:
        super().clear_state()
        self.gpu_allocation = ()

    async def stop(self, now: bool = False):
        try:
            await super().stop(now=now)
        except Exception as e:
            if is_unreachable(e):
                self.log.error("%s: the Docker engine cannot be reached to stop %s; its GPUs stay held",
                               self._log_name, self.object_name)
            raise
