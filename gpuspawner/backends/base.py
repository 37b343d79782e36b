"""The mixin every gpuspawner backend shares.

It owns what is the same whatever runs the server: profiles and the spawn form,
checking user_options, reserving exact GPUs in the hub's ledger before start,
keeping them in spawner state across hub restarts, and giving them back on
stop and on every failed start. A backend subclass only turns
``self.gpu_allocation`` into its runtime's options (environment variables,
device requests, pod resources).

Where the cluster holds the truth of what runs (``reconciles_with_cluster``:
gpu-slurm, gpu-kube, gpu-docker, gpu-swarm), the mixin also reconciles the
ledger with it, at start and every ``gpu_reconcile_interval`` seconds, in one
way for all of them (:mod:`gpuspawner.reconcile` decides): a backend only says
how it lists this hub's live workloads (:meth:`GPUSpawnerMixin.live_workloads`),
which ones the hub's database names, and how it ends an orphan.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from jupyterhub.utils import maybe_future
from sqlalchemy.orm import Session, object_session
from tornado import web
from traitlets import Bool, Dict, List, TraitError, default, observe, validate
from traitlets.config import Application

from ..compat import min_cuda
from ..form import form_context, has_choices
from ..gpu import GPU, gpu_from_record
from ..inventory import CachedInventory
from ..ledger import Ledger
from ..owner import Owner, user_of
from ..placement import GPURequest, PlacementError, never_fits
from ..profiles import (
    OPTION_KEYS,
    Choice,
    OfferedImages,
    OptionsError,
    Profile,
    is_form_field,
    load_profiles,
    options_from_form,
    parse_options,
)
from ..reconcile import Plan, Workload, plan
from ..state import GPUHubSettings, HubState, hub_state
from .policies import GPUPolicyMixin

_templates = Environment(
    loader=PackageLoader("gpuspawner", "templates"),
    autoescape=select_autoescape(["html"]),
)


def user_error(status: int, message: str) -> web.HTTPError:
    """An HTTP error whose message JupyterHub shows to the user as it is."""
    error = web.HTTPError(status, "%s", message)
    error.jupyterhub_message = message
    return error


class GPUSpawnerMixin(GPUPolicyMixin, GPUHubSettings):
    """GPU profiles, placement and the GPU ledger for any JupyterHub spawner."""

    gpu_profiles = List(
        Dict(),
        help="""
        The profiles users choose from: a list of dicts with these keys (only
        ``display_name`` is required; any other key is refused):

        - ``display_name``: the name shown in the form (a non-empty string).
        - ``slug``: the profile's id in spawn options and the REST API (lowercase
          letters, digits and dashes, at most 63; default: made from ``display_name``).
          Unique.
        - ``description``: text shown with the name.
        - ``gpu_models``: model slugs the user picks from, such as ``"a100"`` or
          ``"t4"`` (a slug also matches the models it begins, up to a dash: ``"a100"``
          matches ``a100-sxm4-80gb``, not ``a1000``), or ``["any"]`` (the default).
        - ``gpu_counts``: the GPU counts offered, integers from 0 to 1024, e.g.
          ``[0, 1, 2, 4]`` (default ``[0]``: a CPU-only profile).
        - ``default_gpus``: the count preselected, one of ``gpu_counts`` (default: the smallest).
        - ``images``: images the user may pick from (default: none to pick; the
          spawner's own image). gpu-docker and gpu-swarm run the image, gpu-kube puts it
          in the pod, gpu-slurm gives it to the site's ``batch_script`` as ``{image}``;
          gpu-local ignores it.
        - ``cpu_limit``: CPUs for the server (a number above 0; sets the spawner's
          ``cpu_limit``: a container's or pod's CPU limit, gpu-slurm's ``--cpus-per-task``,
          rounded up; JupyterHub's local process spawners do not enforce it).
        - ``mem_limit``: memory for the server, bytes or a size such as ``"8G"`` (suffix
          K, M, G or T; sets the spawner's ``mem_limit``: a container's or pod's memory
          limit, gpu-slurm's ``--mem``; JupyterHub's local process spawners do not enforce it).
        - ``default``: ``True`` for the profile preselected in the form (at most one).
        - ``capabilities``: NVIDIA driver capabilities the server's GPUs get
          (default ``["compute", "utility"]``): gpu-docker's device request and gpu-kube's
          ``NVIDIA_DRIVER_CAPABILITIES``; the other backends ignore it.
        - ``groups``: JupyterHub group names (or one name); only their members see and
          may use the profile (default: empty, everyone). A spawn naming it for anyone
          else gets HTTP 403.
        - ``queue``: ``True`` to wait in the hub's GPU queue while no GPU is free instead
          of being refused (default ``False``; the wait is bounded by ``gpu_queue_timeout``).
          Refused on gpu-slurm (Slurm is the queue) and with a Kueue queue on gpu-kube (Kueue is).
        - ``kueue``: gpu-kube only: the Kueue LocalQueue (in the server's namespace) the
          profile's pods go to, overriding ``GPUKubeSpawner.kueue_queue_name``; the pod gets
          the label ``kueue.x-k8s.io/queue-name``, Kueue admits it against its ClusterQueue's
          quota, and the form shows that quota. Other backends refuse it.
        - ``interconnect``: ``"nvlink"`` to give multi-GPU servers only GPUs that NVLink
          joins (all-to-all or through each other); refused with a sentence when no such
          set is free. gpu-local and gpu-docker only (there the hub picks the GPUs; every
          profile already prefers the best-connected free GPUs).
        - ``slurm``: gpu-slurm only: the job's ``partition``, ``time`` (limit, e.g.
          ``"8:00:00"``), ``qos``, ``account``, ``reservation`` and ``constraint``
          (node features), each passed to ``sbatch``; other backends refuse it.
        - ``kubespawner_override``: as in KubeSpawner's ``profile_list``; its GPU
          resource (``nvidia.com/gpu``, a MIG slice such as ``nvidia.com/mig-1g.10gb``,
          ``nvidia.com/gpu.shared``) becomes ``gpu_counts`` and ``gpu_models``. gpu-kube
          applies every key as KubeSpawner does; other backends use ``image`` as
          ``images`` and ``cpu_limit``/``mem_limit`` as above, and refuse any other key.

        Empty: a CPU-only profile and a GPU profile of 1, 2 or 4 GPUs of any model (1
        preselected, the default profile). A profile that breaks any of these rules is
        refused at hub start with a sentence naming the profile and the key.
        """,
    ).tag(config=True)

    #: True where the backend applies every kubespawner_override key (gpu-kube); elsewhere
    #: keys it cannot apply are refused instead of dropped.
    honours_kubespawner_override = False

    #: True where profiles' ``slurm`` settings are applied (gpu-slurm); elsewhere they are refused.
    honours_slurm_settings = False

    pin_cpus = Bool(
        True,
        help="""
        gpu-local, gpu-local-simple and gpu-docker: run each GPU server on the CPUs next
        to its GPUs (their NUMA node, from NVML or the ``cpus`` of ``static_gpus``):
        gpu-docker sets the container's ``cpuset_cpus``, and ``cpuset_mems`` to the GPUs'
        NUMA nodes where the engine is this machine (a ``unix://`` engine); gpu-local
        starts the server under ``taskset -c`` (not pinned, and logged, where ``taskset``
        is not installed). The CPUs are intersected with those that exist where the server
        runs (the engine's CPUs; the hub's own CPU affinity for gpu-local) and widened with
        other CPUs when fewer than ``cpu_limit``; when the GPUs' CPUs are not known or none
        of them exists there, nothing is pinned and the log says why
        (``gpuspawner/cpus.py``). A ``cpuset_cpus`` in gpu-docker's ``extra_host_config``
        wins. Notebook GPU jobs are not pinned. gpu-swarm ignores it (Swarm picks the
        node), and gpu-kube and gpu-slurm leave it to the kubelet's Topology Manager and
        Slurm's ``gres.conf`` ``Cores=`` (README, topology section).
        """,
    ).tag(config=True)

    #: True where profiles' ``kueue`` queue names are applied (gpu-kube); elsewhere they are refused.
    honours_kueue = False

    #: True where the hub picks the exact GPUs, so a profile's ``interconnect`` can be honoured
    #: (gpu-local, gpu-docker); where the cluster places (gpu-kube, gpu-slurm) it is refused.
    honours_interconnect = True

    @validate("gpu_profiles")
    def _check_profiles(self, proposal):
        try:
            profiles = load_profiles(proposal["value"], honour_all=self.honours_kubespawner_override)
        except OptionsError as e:
            raise TraitError(f"Invalid GPU profile configuration: {e}") from e
        if not self.honours_slurm_settings:
            slurm = [p.slug for p in profiles if p.slurm]
            if slurm:
                raise TraitError(f"Invalid GPU profile configuration: profile '{slurm[0]}': 'slurm' settings "
                                 "are only applied by gpu-slurm")
        if not self.honours_kueue:
            queued = [p.slug for p in profiles if p.kueue]
            if queued:
                raise TraitError(f"Invalid GPU profile configuration: profile '{queued[0]}': 'kueue' queues "
                                 "are only used by gpu-kube")
        if not self.honours_interconnect:
            linked = [p.slug for p in profiles if p.interconnect]
            if linked:
                raise TraitError(f"Invalid GPU profile configuration: profile '{linked[0]}': 'interconnect' "
                                 "needs a backend whose hub picks the GPUs (gpu-local, gpu-docker); here the "
                                 "cluster places them (see the README's topology section)")
        return proposal["value"]

    # ------------------------------------------------------------ collaborators

    _hub_state: HubState | None = None

    @property
    def hub_state(self) -> HubState:
        """The hub's shared GPU state (ledger, queue, inventory, metrics), owned by the hub app.

        Tests may set their own.
        """
        if self._hub_state is None:
            self._hub_state = hub_state(self.config, type(self), settings=self, app=self._hub_app())
            db = getattr(getattr(self, "user", None), "db", None)
            if isinstance(db, Session):  # the hub's session: usage records go there
                self._hub_state.usage.attach(db)
        return self._hub_state

    @hub_state.setter
    def hub_state(self, state: HubState) -> None:
        self._hub_state = state

    def _hub_app(self) -> Application | None:
        """The JupyterHub app that owns this spawner's hub state (None for a spawner made outside a hub)."""
        settings = getattr(getattr(self, "user", None), "settings", None)  # the hub's tornado settings
        app = settings.get("app") if isinstance(settings, dict) else None
        return app if isinstance(app, Application) else None

    @property
    def ledger(self) -> Ledger:
        return self.hub_state.ledger

    @property
    def inventory(self) -> CachedInventory:
        return self.hub_state.inventory

    @property
    def profiles(self) -> tuple[Profile, ...]:
        """The profiles this user may see (``groups`` on a profile limits who)."""
        return self.visible_profiles(self.all_profiles())

    def all_profiles(self) -> tuple[Profile, ...]:
        """Every configured profile, whoever may see it; gpu-kube adds KubeSpawner's profile_list."""
        return load_profiles(self.gpu_profiles, honour_all=self.honours_kubespawner_override)

    #: set on the spawner object a notebook GPU job runs through: its ledger key ``user/job/<id>``
    gpu_owner_override: str | None = None

    #: the import path of the backend's notebook GPU job runner (a :class:`~gpuspawner.jobmodel.runner.JobRunner`);
    #: None: this backend runs no GPU jobs. A path, imported when the hub's job manager starts, so
    #: that importing a backend does not import the job machinery and the other way round
    gpu_job_runner: str | None = None

    @property
    def gpu_owner(self) -> str:
        """The ledger key of this server (one per user server), or of the job it runs."""
        return self.gpu_owner_override or str(Owner.of_server(self.user.name, self.name))

    # ------------------------------------------------------------ runtime state

    gpu_choice: Choice | None = None
    gpu_allocation: tuple[GPU, ...] = ()
    _gpu_events: list

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpu_allocation)

    # ------------------------------------------------------------ the form
    #
    # A site's own Spawner hooks compose with gpuspawner's; none is replaced silently:
    # ``options_form`` (the site's form is shown below the GPU choices), ``options_from_form``
    # (the site's function reads the form's other fields; its keys are added to the GPU ones)
    # and ``apply_user_options`` (run after gpuspawner has checked and applied the GPU keys).
    # Where gpuspawner's form is the parent's own form (gpu-kube: KubeSpawner's profile form),
    # the site's form and form reader replace it, as they replace the parent's.

    #: True where gpuspawner's form stands in for the parent spawner's own (gpu-kube): a site's
    #: ``options_form`` and ``options_from_form`` then replace it, as on the parent, and it is
    #: drawn even with nothing to choose, as the parent draws its own.
    form_is_the_parents = False

    @default("options_form")
    def _gpu_default_options_form(self):
        return self._render_options_form

    async def get_options_form(self) -> str:
        """The spawn form: the GPU choices, then the site's own ``options_form`` if it set one.

        Empty (JupyterHub then starts the server without a form) when there is nothing to
        choose and the site has no form: one profile, one GPU count, no model or image to pick.
        """
        theirs = self.options_form
        if theirs == self._render_options_form:
            return await self._render_options_form()
        if callable(theirs):
            theirs = await maybe_future(theirs(self))
        if self.form_is_the_parents:
            return theirs or ""
        return await self._render_options_form() + (theirs or "")

    async def _render_options_form(self, spawner=None) -> str:
        try:
            await self.ensure_reconciled()
        except Exception as e:  # the form still renders; a spawn will say what is wrong
            self.log.warning("%s: ledger not reconciled yet: %s", self._log_name, e)
        context = await self.options_form_context()
        if not (self.form_is_the_parents or has_choices(context)):
            return ""
        return _templates.get_template("form.html").render(**context)

    async def options_form_context(self) -> dict:
        """What the form shows; backends that count GPUs their own way override this."""
        reading = await self.inventory.read()
        return form_context(self.profiles, reading, self.ledger.held(), self.user_options or {},
                            offered_images=self.offered_images(), default_image=self.default_image())

    async def offered_models(self) -> set[str]:
        """The model slugs users may pick (``gpu_model``); backends override with their inventory."""
        reading = await self.inventory.read()
        return {g.model for g in reading.gpus}

    def offered_images(self) -> OfferedImages:
        """The images a profile without ``images`` offers (:data:`~gpuspawner.profiles.OfferedImages`):
        none here; gpu-docker offers DockerSpawner's ``allowed_images``."""
        return None

    def default_image(self) -> str | None:
        """The image a server gets when the user picks none (preselected among :meth:`offered_images`)."""
        return None

    async def gpus_found(self) -> bool:
        """Whether this hub found any GPU to give out. Where it found none (NVML finds none, an
        empty static inventory, a cluster without GPU nodes), the profiles that run without a GPU
        are offered and are the default (:func:`~gpuspawner.profiles.without_gpus`)."""
        return not (await self.options_form_context())["no_gpus"]

    @default("options_from_form")
    def _gpu_default_options_from_form(self):
        return self.gpu_options_from_form

    def gpu_options_from_form(self, formdata) -> dict:
        """gpuspawner's spawn-form fields as user_options (400 naming a malformed field).

        Backends whose form names its fields otherwise (gpu-kube) override this and
        :meth:`gpu_form_field`.
        """
        try:
            return options_from_form(formdata)
        except OptionsError as e:
            raise user_error(400, str(e)) from e

    def gpu_form_field(self, name: str) -> bool:
        """Whether the spawn form field ``name`` is gpuspawner's (not the site's own form's)."""
        return is_form_field(name, [p.slug for p in self.all_profiles()])

    def run_options_from_form(self, form_data):
        """A submitted spawn form as user_options.

        gpuspawner's fields give the GPU options. A site's own ``options_from_form``
        (``c.Spawner.options_from_form``) is called, as JupyterHub calls it, with the
        form's other fields, and its keys are added; where both give a key, the site's wins.
        Where the form is the parent's (``form_is_the_parents``), the site's reads it all and
        its answer is the user_options, as on the parent.
        """
        if self.options_from_form == self.gpu_options_from_form:
            return self.gpu_options_from_form(form_data)
        if self.form_is_the_parents:
            return super().run_options_from_form(form_data)
        ours = {key: value for key, value in form_data.items() if self.gpu_form_field(key)}
        theirs = {key: value for key, value in form_data.items() if key not in ours}
        options = self.gpu_options_from_form(ours)
        options.update(super().run_options_from_form(theirs))
        return options

    def options_from_query(self, query_data):
        """``/hub/spawn?profile=gpu&gpus=2``: read as a submitted form is."""
        return self.run_options_from_form(query_data)

    def site_reads_options(self) -> bool:
        """Whether the site's own hooks read user_options keys of their own (its ``options_form``,
        ``options_from_form`` or ``apply_user_options`` is configured): those keys are then kept
        for them, not refused."""
        return (self.apply_user_options is not None
                or self.options_from_form != self.gpu_options_from_form
                or self.options_form != self._render_options_form)

    # ------------------------------------------------------------ user options

    #: the user_options before this spawn's (JupyterHub saves a spawn's options before checking them)
    _gpu_previous_options: dict | None = None

    @observe("user_options")
    def _remember_previous_options(self, change) -> None:
        self._gpu_previous_options = change["old"] if isinstance(change["old"], dict) else {}

    async def _run_apply_user_options(self, user_options):
        """JupyterHub's step that applies a spawn's user_options (JupyterHub >= 5.3).

        First :meth:`_apply_gpu_options` (400 on bad input), then the site's own
        ``apply_user_options`` hook, if any, as JupyterHub runs it (a dict hook is given
        only the keys it names besides the site's own). A refused request leaves the
        server's saved options as they were (JupyterHub stored them before asking), so
        nothing refused is kept, and every later answer about the server (its model, the
        form) is valid JSON.
        """
        try:
            await self._apply_gpu_options(user_options)
            hook = self.apply_user_options
            if isinstance(hook, dict):
                user_options = {k: v for k, v in user_options.items() if k in hook or k not in OPTION_KEYS}
            elif hook is None:  # JupyterHub warns about keys nobody handles: gpuspawner handled its own
                user_options = {k: v for k, v in user_options.items() if k not in OPTION_KEYS}
            await super()._run_apply_user_options(user_options)
        except web.HTTPError:
            self._restore_previous_options()
            raise

    def _restore_previous_options(self) -> None:
        previous = dict(self._gpu_previous_options or {})
        self.user_options = previous
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is not None and orm_spawner.user_options != previous:
            orm_spawner.user_options = previous
            session = object_session(orm_spawner)
            if session is not None:
                session.commit()

    async def _apply_gpu_options(self, user_options: dict[str, Any]) -> None:
        """Check user_options (form or REST) and apply the profile; 400 on bad input."""
        models = await self.offered_models()
        try:
            choice = parse_options(user_options, self.profiles_for_options(user_options), models,
                                   offered_images=self.offered_images(), no_gpus=not await self.gpus_found(),
                                   site_keys=self.site_reads_options())
        except OptionsError as e:
            raise user_error(400, str(e)) from e
        self.gpu_choice = choice
        self.apply_profile(choice)
        self.apply_queue_policy(choice)

    def apply_profile(self, choice: Choice) -> None:
        """Copy the profile's limits and image to the spawner; backends extend this."""
        if choice.profile.cpu_limit is not None:
            self.cpu_limit = float(choice.profile.cpu_limit)
        if choice.profile.mem_limit is not None:
            self.mem_limit = choice.profile.mem_limit

    # ------------------------------------------------------------ progress

    def gpu_event(self, message: str, progress: int) -> None:
        """Record a plain-words step for JupyterHub's progress bar."""
        if not hasattr(self, "_gpu_events"):
            self._gpu_events = []
        self._gpu_events.append({"progress": progress, "message": message})
        self.log.info("%s: %s", self._log_name, message)

    async def progress(self):
        sent = 0
        while True:
            events = getattr(self, "_gpu_events", [])
            while sent < len(events):
                yield events[sent]
                sent += 1
            if not self._spawn_pending:
                break
            await asyncio.sleep(0.2)

    # ------------------------------------------------------------ lifecycle

    async def reserve_gpus(self) -> tuple[GPU, ...]:
        """Place this server's request and hold the GPUs; a refusal becomes HTTP 409."""
        choice = self.gpu_choice
        if choice is None:  # spawned without apply_user_options (should not happen on JupyterHub >= 5.3)
            await self._apply_gpu_options(self.user_options or {})
            choice = self.gpu_choice
        self._gpu_events = []
        self.gpu_event(f"Placing {self.describe_request(choice)}", 10)
        await self.ensure_reconciled()
        reading = await self.inventory.read()
        self.ledger.release(self.gpu_owner)  # a failed earlier start of this server holds nothing
        request = self.gpu_request(choice)
        try:
            self.gpu_allocation = await self.place_request(reading, request, choice)
        except PlacementError as e:
            self.gpu_event(f"Refused: {e}", 100)
            raise user_error(409, str(e)) from e
        if self.gpu_allocation:
            names = ", ".join(f"{g.name} #{g.index} ({g.uuid})" for g in self.gpu_allocation)
            self.gpu_event(f"Reserved {len(self.gpu_allocation)} GPU(s) on {self.gpu_allocation[0].host}: {names}", 30)
        return self.gpu_allocation

    def gpu_request(self, choice: Choice) -> GPURequest:
        """What placement is asked for this server's (or job's) ``choice``."""
        return GPURequest(owner=self.gpu_owner, count=choice.gpus, models=choice.models,
                          interconnect=choice.profile.interconnect)

    async def never_fits(self, choice: Choice) -> PlacementError | None:
        """Why ``choice`` could never get GPUs here, however many are given back; ``None`` when it could.

        More GPUs of a model than any one machine has, a model or NVLink set this hub
        lacks: placement's own sentence (:func:`~gpuspawner.placement.never_fits`).
        Backends whose cluster places the GPUs answer from the cluster.
        """
        if not choice.gpus:
            return None
        reading = await self.inventory.read()
        return never_fits(reading.gpus, self.gpu_request(choice))

    @staticmethod
    def describe_request(choice: Choice) -> str:
        if choice.gpus == 0:
            return "a CPU-only server (no GPU)"
        model = "any model" if choice.gpu_model == "any" else choice.gpu_model
        return f"{choice.gpus} GPU(s), {model}"

    def release_gpus(self) -> None:
        freed = self.ledger.release(self.gpu_owner)
        if freed:
            self.log.info("%s: released GPUs %s", self._log_name, ", ".join(freed))
        self.gpu_allocation = ()
        self.gpu_released(freed)

    #: this start's own mark (new for every start), on its workload where the backend marks one
    gpu_start_mark: str = ""

    async def start(self):
        self.gpu_start_mark = uuid.uuid4().hex[:12]
        with self.hub_state.flights.flying(self.gpu_owner, self.gpu_start_mark):
            await self.reserve_gpus()
            try:
                self.save_state()  # the GPUs are in the database before anything is created
                result = await super().start()
                self.save_state()  # with what the backend learnt (pid, container)
                return result
            except BaseException:
                self.gpu_end_reason("failed")
                self.release_gpus()
                raise

    async def poll(self):
        status = await super().poll()
        # ended on its own while the hub ran (a stop polls too: JupyterHub marks it pending first)
        if status is not None and self.gpu_allocation and not getattr(self, "_stop_pending", False):
            self.gpu_end_reason("failed")
        return status

    def gpu_end_reason(self, reason: str) -> None:
        """Tell the usage records why this server's GPUs are about to be given back."""
        self.hub_state.usage.end_reason(self.gpu_owner, reason)

    async def stop(self, now: bool = False):
        with self.hub_state.flights.flying(self.gpu_owner):
            try:
                await super().stop(now=now)
            finally:
                self.release_gpus()

    # ------------------------------------------------------------ the runtime's truth

    #: True where the cluster (or engine) holds the truth of what runs: the ledger is reconciled
    #: with its list of this hub's workloads at start and every ``gpu_reconcile_interval`` seconds,
    #: the shared way (:meth:`reconcile_with_cluster`). False: the backend reconciles once, its
    #: own way (:meth:`reconcile_allocations`; gpu-local).
    reconciles_with_cluster = False
    #: how the log names this backend's workloads ("Slurm job", "pod", ...)
    workload_word = "workload"

    async def reconcile_allocations(self) -> None:
        """Make the ledger hold what the runtime's servers really hold; backends override.

        Runs once per hub (:meth:`ensure_reconciled`), before anything is placed.
        """

    async def live_workloads(self) -> Sequence[Workload]:
        """This hub's live workloads as the cluster lists them (``reconciles_with_cluster`` backends)."""
        raise NotImplementedError

    async def recorded_workloads(self) -> Mapping[str, set[str]] | None:
        """Owner -> the workload ids the hub's database names, for every server JupyterHub shows
        running or starting and every active notebook job; None where the backend keeps no such
        record (then every live workload is its owner's, and none is an orphan)."""
        return None

    def stops_orphans(self) -> bool:
        """Whether a live workload no record names is ended (:meth:`end_orphan`) rather than adopted."""
        return False

    async def end_orphan(self, workload: Workload) -> None:
        """End a live workload of this hub that no record names; log what was done."""
        raise NotImplementedError

    async def ensure_reconciled(self) -> None:
        """Reconcile the ledger with the runtime once per hub; concurrent callers wait for it.

        Where the cluster holds the truth, the hub state's timer reconciles again every
        ``gpu_reconcile_interval`` seconds from then on.
        """
        state = self.hub_state
        key = ("reconcile", type(self).__name__)
        if self.reconciles_with_cluster:
            await state.once(key, lambda: self.reconcile_with_cluster(first=True))
            state.every(key, state.reconcile_interval, self._reconcile_again)
            return

        async def reconcile() -> None:
            # an allocation released here and not adopted again was gone: usage records say "crashed"
            with state.usage.reconciling(state.ledger.allocations):
                await self.reconcile_allocations()

        await state.once(key, reconcile)

    async def _reconcile_again(self) -> None:
        try:
            await self.reconcile_with_cluster(first=False)
        except Exception as e:  # the next round tries again; placement goes on meanwhile
            self.log.warning("%s: the GPU ledger was not reconciled with the cluster this time (tried again in "
                             "%g s): %s", self.backend_name, self.hub_state.reconcile_interval, e)

    #: how this backend's log lines begin
    backend_name = "gpuspawner"

    async def reconcile_with_cluster(self, first: bool) -> Plan:
        """One pass: read this hub's live workloads and its records, and make the ledger agree.

        ``first``: the pass at hub start (charges found gone end as ``crashed`` in the usage
        records; later passes: ``failed``, they ended while the hub ran). Owners whose start or
        stop is in flight at any moment of the pass are left alone (:mod:`gpuspawner.reconcile`).
        Passes of one hub never overlap.
        """
        state = self.hub_state
        async with state.reconcile_locks.setdefault(type(self).__name__, asyncio.Lock()):
            began = state.flights.mark()
            ledger = state.ledger
            held = ledger.allocations()
            since = {owner: ledger.since(owner) for owner in held}
            live = await self.live_workloads()
            recorded = await self.recorded_workloads()
            stop = self.stops_orphans()
            result = plan(held, live, recorded, state.flights.since(began), adopt_orphans=not stop)
            self._apply_plan(result, held, since, first, stop)
            state.flights.forget(began)
            if stop:
                for workload in result.orphans:
                    await self.end_orphan(workload)
        if first:
            self.log.info("%s: GPU ledger reconciled with %d live %s(s) of this hub: %d owner(s) hold %d GPU(s)",
                          self.backend_name, len(live), self.workload_word, len(ledger.allocations()),
                          sum(len(k) for k in ledger.allocations().values()))
        return result

    def _apply_plan(self, result: Plan, held: Mapping[str, tuple[str, ...]], since: Mapping[str, float | None],
                    first: bool, stop: bool) -> None:
        """Change the ledger as ``result`` says, only for owners whose charge nothing changed meanwhile."""
        state = self.hub_state
        ledger = state.ledger

        def unchanged(owner: str) -> bool:
            return ledger.allocations().get(owner) == held.get(owner) and ledger.since(owner) == since.get(owner)

        freed: list[str] = []
        adopted = {w.owner: w for w in result.adopted}
        orphans = {w.owner for w in result.orphans}
        with state.usage.reconciling(ledger.allocations, "crashed" if first else "failed"):
            for owner in result.release:
                if unchanged(owner):
                    freed += ledger.release(owner)
                    self.log.warning("%s: %s's GPU charge (%d) freed: no live %s of it", self.backend_name, owner,
                                     len(held[owner]), self.workload_word)
            for owner, keys in result.hold.items():
                if not unchanged(owner):
                    continue
                if owner in held:
                    freed += ledger.release(owner)
                refused = ledger.adopt(owner, keys)
                if refused:
                    self.log.error("%s: %s's %s holds GPUs %s that another owner holds; not counted twice",
                                   self.backend_name, owner, self.workload_word, ", ".join(refused))
                if owner in adopted and owner not in orphans:
                    say = self.log.info if first else self.log.warning
                    say("%s: %s of %s counted: it holds %d GPU(s)%s", self.backend_name, adopted[owner], owner,
                        len(keys), "" if first else " the hub did not count")
                elif owner in held:
                    self.log.warning("%s: %s's charge changed from %d to %d GPU(s), as its %s holds",
                                     self.backend_name, owner, len(held[owner]), len(keys), self.workload_word)
        for workload in () if stop else result.orphans:
            self.log.warning("%s: adopted %s of %s: no server or notebook job of this hub's database names it; "
                             "its GPUs count against %s", self.backend_name, workload, workload.owner,
                             user_of(workload.owner))
        self.gpu_released(tuple(freed))

    # ------------------------------------------------------------ state

    #: whether :meth:`save_state` wrote this spawner's state since it was last cleared
    _gpu_state_written = False

    def save_state(self) -> None:
        """Write this server's state (its GPUs first) to the hub's database now.

        JupyterHub saves it only after ``start`` returns; a hub that dies before
        that must still know, when it comes back, which GPUs its servers hold.
        """
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is None or getattr(self, "db", None) is None:
            return
        orm_spawner.state = self.get_state()
        self.db.commit()
        self._gpu_state_written = True

    def get_state(self) -> dict:
        state = super().get_state()
        if self.gpu_allocation:
            state["gpus"] = [g.to_dict() for g in self.gpu_allocation]
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        records = state.get("gpus") or []
        if not records:
            return
        gpus = tuple(_gpu_from_state(r) for r in records)
        refused = self.ledger.adopt(self.gpu_owner, [g.uuid for g in gpus])
        if refused:
            self.log.error(
                "%s: state says it holds GPUs %s, but another server holds them",
                self._log_name, ", ".join(refused),
            )
        self.gpu_allocation = tuple(g for g in gpus if g.uuid not in refused)

    def clear_state(self) -> None:
        """The parent's; the GPUs released; and where :meth:`save_state` wrote the state early, the cleared
        state written too, so that what the spawner forgot (a job id, a container) is not read back by the
        next spawner object of this server (JupyterHub itself saves it only where it cleared it)."""
        super().clear_state()
        if self.gpu_allocation:
            self.release_gpus()
        if self._gpu_state_written:
            self.save_state()
            self._gpu_state_written = False

    # ------------------------------------------------------------ notebook GPU jobs

    async def apply_job_options(self, options: dict[str, Any]) -> Choice:
        """A notebook GPU job's GPU choice (its body's ``profile``, ``gpus``, ``gpu_model``, ``image``),
        checked and applied as a server's user_options are (400/403 with a sentence; gpu-kube:
        checked now, its profile applied when the job's pod is made). The one step the job manager
        takes into the spawner itself; everything else goes through the backend's job runner."""
        self.user_options = dict(options)
        await self._apply_gpu_options(self.user_options)
        return self.gpu_choice


def _gpu_from_state(record: dict) -> GPU:
    return gpu_from_record(record)


def checked_cuda_map(proposal) -> dict:
    """A traitlets validator's body for ``{key: CUDA requirement}`` traits: every value parses."""
    for key, text in proposal["value"].items():
        try:
            min_cuda(text)
        except ValueError as e:
            raise TraitError(f"{proposal['trait'].name}[{key!r}]: {e}") from e
    return proposal["value"]


# ---------------------------------------------------------------- at hub start


def refusal_at_start(spawner_class: type, config) -> str | None:
    """Why the hub's configuration of ``spawner_class`` is refused, or None: the sentence of
    the first setting a validator of the class refuses (a :class:`~traitlets.TraitError`).

    The class is built once from ``config``, for a stand-in user (KubeSpawner names its pod
    after one); a class that cannot be built so (say, it needs a cluster that does not answer)
    is not checked here, and says what is wrong at its first spawn.
    """
    probe = SimpleNamespace(name="gpuspawner-configuration-check", id=0, url="/", groups=[])
    try:
        spawner_class(config=config, user=probe)
    except TraitError as e:
        return f"{spawner_class.__name__}: {e}"
    except Exception:
        return None
    return None


def _check_configuration_at_hub_start() -> None:
    """Make a starting JupyterHub check its gpuspawner class's configuration before anything else:
    a setting the class refuses (:func:`refusal_at_start`) stops the hub at start with its
    sentence, instead of a bare 500 at the first spawn.

    JupyterHub has no hook for this, and loads every spawner class it knows (gpuspawner's
    among them) before its configuration exists. So the first import of a gpuspawner backend
    in a process that runs JupyterHub wraps, once, ``JupyterHub.init_spawners``, which every
    hub start awaits once its configuration and database are loaded; a hub whose spawner
    class is not gpuspawner's is not affected. Outside a hub process nothing changes.
    """
    app_module = sys.modules.get("jupyterhub.app")
    if app_module is None:
        return
    hub = app_module.JupyterHub
    original = hub.init_spawners
    if getattr(original, "gpuspawner_checks_configuration", False):
        return

    async def init_spawners(self, *args, **kwargs):
        spawner_class = self.spawner_class
        if isinstance(spawner_class, type) and issubclass(spawner_class, GPUSpawnerMixin):
            refusal = refusal_at_start(spawner_class, self.config)
            if refusal is not None:
                self.log.critical("Refusing to start: %s", refusal)
                self.exit(1)
        return await original(self, *args, **kwargs)

    init_spawners.gpuspawner_checks_configuration = True
    init_spawners.__doc__ = original.__doc__
    hub.init_spawners = init_spawners


_check_configuration_at_hub_start()
