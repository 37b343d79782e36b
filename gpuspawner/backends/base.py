"""The mixin every gpuspawner backend shares: :class:`GPUSpawnerMixin`.

It owns what is the same whatever runs the server: profiles and the spawn form
(:mod:`~gpuspawner.backends.options`), checking user_options, reserving GPUs in the
hub's ledger before start, keeping them in spawner state across hub restarts
(:mod:`~gpuspawner.backends.saved_state`), giving them back on stop and on every
failed start, and reconciling the ledger with what runs
(:mod:`~gpuspawner.backends.reconciling`).

Reservation has one path, :meth:`GPUSpawnerMixin.reserve_gpus` (a template method), and
one hook a backend implements, :meth:`GPUSpawnerMixin.claim`: what it takes for a
choice, as a :class:`~gpuspawner.backends.claim.Claim` (exact GPUs where the hub
places; a counted cluster resource where the cluster places). The backend then applies
the Claim to its workload (:meth:`GPUSpawnerMixin.apply_claim`: environment variables,
device requests, pod resources, sbatch ``--gres``). Where the runtime picks other GPUs
than the hub's claim named (gpu-swarm), :meth:`GPUSpawnerMixin.correct_claim` is the
explicit second step.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from traitlets import Bool, Dict, List, TraitError, validate
from traitlets.config import Application

from ..compat import min_cuda
from ..gpu import GPU
from ..health import GPUHealthSettings
from ..inventory import CachedInventory
from ..ledger import Ledger
from ..owner import Owner
from ..placement import GPURequest, PlacementError, never_fits
from ..profiles import Choice, OptionsError, Profile, load_profiles
from ..state import GPUHubSettings, HubState, hub_state
from .budget_at_zero import GPUBudgetAtZeroMixin
from .budgets import GPUBudgetSettings
from .claim import Claim
from .errors import user_error
from .options import GPUOptionsMixin
from .policies import GPUPolicyMixin
from .queue_order import GPUQueueOrderMixin
from .reconciling import GPUReconcileMixin
from .saved_state import GPUStateMixin
from .startup import check_configuration_at_hub_start
from .telling import GPUTellingMixin

__all__ = ["Claim", "GPUSpawnerMixin", "checked_cuda_map", "user_error"]


#: profile keys only some backends honour, each refused at hub start elsewhere rather than dropped:
#: (the class attribute that says a backend honours it, the profile's field, the sentence)
_HONOURED_ONLY_BY = (
    ("honours_slurm_settings", "slurm", "'slurm' settings are only applied by gpu-slurm"),
    ("honours_kueue", "kueue", "'kueue' queues are only used by gpu-kube"),
    ("honours_interconnect", "interconnect", "'interconnect' needs a backend whose hub picks the GPUs (gpu-local, "
     "gpu-docker); here the cluster places them (see the README's topology section)"),
    ("honours_images", "images", "'images' (or a kubespawner_override 'image') needs a backend that runs images "
     "(gpu-docker, gpu-swarm, gpu-kube, gpu-slurm's batch_script); gpu-local servers run on this host"),
)


class GPUSpawnerMixin(GPUOptionsMixin, GPUReconcileMixin, GPUStateMixin, GPUTellingMixin, GPUQueueOrderMixin,
                      GPUPolicyMixin, GPUBudgetSettings, GPUBudgetAtZeroMixin, GPUHubSettings, GPUHealthSettings):
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
          refused at hub start on gpu-local, which runs no image.
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

    #: True where a server runs an image (gpu-docker, gpu-swarm, gpu-kube; gpu-slurm gives it to the
    #: site's ``batch_script``); gpu-local runs none, so a profile's ``images`` is refused there.
    honours_images = True

    @validate("gpu_profiles")
    def _check_profiles(self, proposal):
        try:
            profiles = load_profiles(proposal["value"], honour_all=self.honours_kubespawner_override)
        except OptionsError as e:
            raise TraitError(f"Invalid GPU profile configuration: {e}") from e
        for flag, key, why in _HONOURED_ONLY_BY:
            if not getattr(self, flag):
                found = [p.slug for p in profiles if getattr(p, key)]
                if found:
                    raise TraitError(f"Invalid GPU profile configuration: profile '{found[0]}': {why}")
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
            db = self.hub_session()
            if db is not None:  # the hub's session: usage records go there
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

    # ------------------------------------------------------------ reserving: one path, one hook

    async def reserve_gpus(self) -> tuple[GPU, ...]:
        """Reserve this start's GPUs: the one reservation path of every backend (a template method).

        1. This start's choice (:meth:`choice_for_start`); its progress begins with
           :meth:`claim_opening`.
        2. The ledger made to agree with the runtime (:meth:`reconcile_before_claim`), and
           whatever a failed earlier start of this server held given back.
        3. The claim: nothing for a CPU-only choice (:meth:`claims_nothing`), else the
           backend's hook :meth:`claim`. A :class:`~gpuspawner.placement.PlacementError` (no
           room, a quota, a model the cluster lacks) is refused with HTTP 409 and its sentence,
           in the progress too, and nothing is held; one a wait would cure names a profile
           that would queue instead, if there is one (:meth:`queue_pointer`).
        4. The claim applied to the workload (:meth:`apply_claim`); its sentence in the progress.

        Returns the exact GPUs held (none where the cluster places). Where the runtime then
        gives other GPUs than the claim named, :meth:`correct_claim` is the second step.
        Notebook GPU jobs come through here too (owner ``user/job/<id>``).
        """
        choice = await self.choice_for_start()
        self._gpu_events = []
        self.gpu_event(self.claim_opening(choice), 10)
        await self.reconcile_before_claim(choice)
        self.release_gpus()  # a failed earlier start of this server holds nothing
        try:
            claim = Claim() if self.claims_nothing(choice) else await self.claim(choice)
        except PlacementError as e:
            said = str(e) + await self.queue_pointer(choice, e)
            self.gpu_event(f"Refused: {said}", 100)
            raise user_error(409, said) from e
        self.gpu_allocation = claim.gpus
        self.apply_claim(claim)
        if claim.progress:
            self.gpu_event(claim.progress, 30)
        return self.gpu_allocation

    async def choice_for_start(self) -> Choice:
        """This start's checked choice: the one JupyterHub's ``apply_user_options`` step made, else
        made now from user_options (a spawn without that step). gpu-kube loads its options here."""
        if self.gpu_choice is None:
            await self._apply_gpu_options(self.user_options or {})
        return self.gpu_choice

    #: the first words of a start's progress, for a GPU request and for a CPU-only one ("{}": what is
    #: asked for, as :meth:`describe_request` says it)
    opening_words = ("Placing {}", "Placing {}")

    def claim_opening(self, choice: Choice) -> str:
        """The first words of this start's progress (:attr:`opening_words`)."""
        return self.opening_words[0 if choice.gpus else 1].format(self.describe_request(choice))

    async def reconcile_before_claim(self, choice: Choice) -> None:
        """Make the ledger agree with the runtime before anything is taken (:meth:`ensure_reconciled`).

        Its failure fails the start here; a backend says otherwise where it must (gpu-slurm
        goes on: Slurm enforces its own limits; gpu-kube refuses with a sentence).
        """
        await self.ensure_reconciled()

    def claims_nothing(self, choice: Choice) -> bool:
        """Whether this start takes no GPU (a CPU-only choice): no :meth:`claim`, ``Claim()`` is applied."""
        return not choice.gpus

    async def claim(self, choice: Choice) -> Claim:
        """The hook: take what ``choice`` needs and say what was taken.

        Here, where the hub places (gpu-local, gpu-docker, gpu-swarm): exact GPUs of the
        inventory, placed and held in the ledger within the quotas, after a wait in the hub's
        queue for a ``queue: true`` profile (:meth:`place_request`). Where the cluster places
        (gpu-kube, gpu-slurm), the backend counts a cluster resource instead
        (:meth:`claim_cluster_gpus`). Raises :class:`~gpuspawner.placement.PlacementError`
        with the sentence for the user; nothing is held then.
        """
        reading = await self.inventory.read()
        gpus = await self.place_request(reading, self.gpu_request(choice), choice)
        if not gpus:
            return Claim()
        names = ", ".join(f"{g.name} #{g.index} ({g.uuid})" for g in gpus)
        return Claim(gpus=gpus, progress=f"Reserved {len(gpus)} GPU(s) on {gpus[0].host}: {names}")

    def apply_claim(self, claim: Claim) -> None:
        """Apply ``claim`` to this start's workload. Nothing here: the exact GPUs (``gpu_allocation``)
        are read when the workload is made (environment, device requests, labels); gpu-kube and
        gpu-slurm set their pod's resources and the job's ``--gres`` from it."""

    #: who picks the exact GPUs after the hub's claim, in :meth:`correct_claim`'s words
    picked_by = "The cluster"

    async def assigned_gpus(self) -> tuple[str, ...]:
        """The GPUs (UUIDs) the runtime gave this start, where it picks them after the hub's claim
        (gpu-swarm); none (here) where the claim is what runs."""
        return ()

    def correct_claim(self, assigned: Sequence[str]) -> None:
        """The second step, where the runtime picks the exact GPUs after the hub's claim (gpu-swarm:
        Swarm gives a task GPUs of the model and count the hub claimed, not always the hub's pick):
        hold ``assigned`` (UUIDs) instead, so the ledger, the admin's overview and the server's state
        name the GPUs it really has. Nothing changes where ``assigned`` is empty or the claim's own.

        The ledger changes one way: this owner's claim is released and ``assigned`` adopted. A GPU
        of ``assigned`` another start in flight holds (the hub had picked it for them; the runtime
        gave it here) comes here, and that start holds one of this claim's GPUs the runtime left
        free instead, until its own correction. The state is saved; the progress says so.
        """
        if not assigned or set(assigned) == set(self.gpu_uuids):
            return
        reading = self.inventory.last_reading()
        known = {g.uuid: g for g in (reading.gpus if reading else ())}
        picked, ledger = self.gpu_uuids, self.ledger
        ledger.release(self.gpu_owner)
        for key in ledger.adopt(self.gpu_owner, assigned):
            other = ledger.holder(key)
            if other is None:
                continue
            theirs = [u for u in ledger.release(other) if u != key]
            spare = [u for u in picked if u not in assigned and u not in theirs]
            ledger.adopt(other, theirs + spare[:1])
            ledger.adopt(self.gpu_owner, [key])
        self.gpu_allocation = tuple(known[u] for u in assigned if u in known)
        self.save_state()
        self.gpu_event(f"{self.picked_by} assigned GPU(s) {', '.join(assigned)}", 65)

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

    @classmethod
    def booking_keeper(cls, config) -> Any | None:
        """What holds the hub's bookings on the cluster, made from ``config`` (the hub calls it once,
        :mod:`gpuspawner.hub.booking_keeper` says what it must do); None (here): the hub's own
        placement keeps them. gpu-slurm's holds them as Slurm reservations."""
        return None

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
                self.correct_claim(await self.assigned_gpus())  # the second step, where the runtime picks
                self.save_state()  # with what the backend learnt (pid, container, the runtime's GPUs)
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
        """The parent's stop, then the GPUs given back; where the workload may outlive what the hub knows
        (``gpus_outlive_state``), a stop that failed gives nothing back: it may still run on its GPUs (a
        later reconciliation settles it)."""
        with self.hub_state.flights.flying(self.gpu_owner):
            try:
                await super().stop(now=now)
            except BaseException:
                if not self.gpus_outlive_state:
                    self.release_gpus()
                raise
            self.release_gpus()


def checked_cuda_map(proposal) -> dict:
    """A traitlets validator's body for ``{key: CUDA requirement}`` traits: every value parses."""
    for key, text in proposal["value"].items():
        try:
            min_cuda(text)
        except ValueError as e:
            raise TraitError(f"{proposal['trait'].name}[{key!r}]: {e}") from e
    return proposal["value"]


check_configuration_at_hub_start(GPUSpawnerMixin)
