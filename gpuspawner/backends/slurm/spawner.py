"""``gpu-slurm``: GPU profiles on batchspawner's SlurmSpawner.

Same form and user_options as the other backends; the choice becomes a Slurm
job on one node: ``--gres=gpu:TYPE:N`` (the GRES type of the chosen model, see
``slurm_gres_types``), with the profile's partition, time limit, QOS, CPUs
(``cpu_limit``) and memory (``mem_limit``). Slurm places the job and picks the
GPUs (it sets ``CUDA_VISIBLE_DEVICES`` in the job); the hub's ledger only
counts each server's GPUs so the hub's quotas apply, as on gpu-kube.

Before submitting, the request is checked against ``sinfo --json`` (cached for
``gpu_inventory_ttl`` seconds): one no node of the partition could ever run is
refused with HTTP 409 naming the GPU types and sizes there; one that must wait
is submitted and waits in Slurm's queue, and the progress page says why in
plain words (Slurm's reason), its place among the partition's pending GPU jobs
and Slurm's start estimate. Stopping a pending server cancels its job.

Every job carries the hub, user and server in its name and comment; the job id
is in the server's state (saved as soon as the job is submitted). Notebook GPU
jobs are Slurm batch jobs too (:mod:`gpuspawner.backends.slurm.jobs`), marked as
the server ``job/<id>`` of their user, their Slurm job id in the hub's job
record. Once per hub start, jobs of this hub (``gpu_hub_id``) that neither a
server's state nor an active notebook job's record names are cancelled, and the
GPUs of those that are are counted again.

The shared reservation path (:meth:`~gpuspawner.backends.base.GPUSpawnerMixin.reserve_gpus`)
calls this backend's :meth:`~GPUSlurmSpawner.claim`: a :class:`~gpuspawner.backends.claim.Claim`
of a counted cluster resource whose ``gres`` (``gpu:a100:2``) and node features
:meth:`~GPUSlurmSpawner.apply_claim` put on the job. The job's submission and progress
(:mod:`.submit`), the reading of Slurm (:mod:`.reading`) and the reconciliation with this
hub's jobs (:mod:`.reconciling`) are mixins of their own.
"""

from __future__ import annotations

import math
import re

from batchspawner import SlurmSpawner
from traitlets import Bool, Dict, TraitError, Unicode, default, validate

from ...accounts import SystemAccounts
from ...placement import GPURequest, PlacementError
from ...profiles import Choice, load_profiles
from ..base import GPUSpawnerMixin, checked_cuda_map
from ..claim import Claim
from .booking import SlurmBookingKeeper
from .capacity import UNTYPED, NeverFits, choose_type, cuda_constraint
from .cuda import DriverCuda
from .health import SlurmHealthReader
from .reading import SlurmReadingMixin
from .reconciling import SlurmReconcileMixin, ledger_resource
from .settings import join_gres, lenient_render, refused_settings, sbatch_directives
from .submit import SlurmJobMixin

_GRES_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: batchspawner traits a profile's ``slurm`` settings set
_SLURM_TRAITS = {"partition": "req_partition", "time": "req_runtime", "qos": "req_qos",
                 "account": "req_account", "reservation": "req_reservation"}
_PROFILE_TRAITS = (*_SLURM_TRAITS.values(), "req_nprocs", "req_memory", "req_gres", "req_options")
#: the batchspawner settings checked against the GPU choices when the spawner is configured
_CHECKED_TRAITS = ("req_gres", "req_ngpus", "req_options", "req_cluster")


def slurm_memory(limit: str | int) -> str:
    """A profile's ``mem_limit`` as ``sbatch --mem`` takes it: ``"8G"`` stays, bytes become MiB."""
    if isinstance(limit, int):
        return f"{math.ceil(limit / 2**20)}M"
    if re.fullmatch(r"[0-9]+[KMGT]?", limit):
        return limit
    number, unit = float(limit[:-1]), limit[-1]
    return f"{math.ceil(number * 1024 ** 'KMGT'.index(unit) / 1024)}M"  # "1.5G" -> "1536M"


class GPUSlurmSpawner(SlurmJobMixin, SlurmReadingMixin, SlurmReconcileMixin, GPUSpawnerMixin, SystemAccounts,
                      SlurmSpawner):
    """SlurmSpawner with gpuspawner's GPU profiles, Slurm's availability and its queue in words.

    Every batchspawner setting keeps working (``docs/compatibility.md``): the site's
    ``batch_script`` and ``batch_submit_cmd``, to which each job's GPUs and profile settings
    are added as sbatch options (:mod:`gpuspawner.backends.slurm.settings`), and ``exec_prefix``, through
    which every Slurm command the hub runs goes (batchspawner's own, and gpuspawner's
    ``sinfo``, ``squeue`` and cancellations of orphaned jobs), filled in for the user the hub
    acts for. Settings that would fight the GPU choices are refused when the spawner is
    configured, with a sentence naming them.

    With ``create_system_users`` a job runs as its user's account (made by the hub on first
    use): batchspawner's ``{username}`` is that account, so ``exec_prefix`` (e.g.
    ``runuser -u {username} --``, or its default ``sudo -E -u {username}``) submits as it.
    """

    slurm_gres_types = Dict(
        Unicode(),
        help="""
        Model slug -> Slurm GRES type, for sites whose GRES types are not the model
        slugs users should pick: ``{"a100": "nvidia_a100-sxm4-80gb", "t4": "tesla_t4"}``.
        A type not listed is offered as its own model slug (lower case, vendor words such as
        ``nvidia`` and ``tesla`` dropped, other characters between words made ``-``), so
        ``gpu:a100:2`` in ``gres.conf`` is offered as model ``a100`` and asked for as
        ``--gres=gpu:a100:N``, and ``gpu:tesla_t4:1`` as model ``t4``. Profiles' ``gpu_models``
        name slugs. GPUs of no type (``gpu:4``) are offered as model ``gpu`` and asked for as
        ``--gres=gpu:N``. A value that is no GRES type name (letters, digits, ``_``, ``.``,
        ``-``) is refused at hub start.
        """,
    ).tag(config=True)

    @validate("slurm_gres_types")
    def _check_gres_types(self, proposal):
        for slug, gres_type in proposal["value"].items():
            if not _GRES_TYPE.fullmatch(gres_type):
                raise TraitError(f"slurm_gres_types[{slug!r}]: {gres_type!r} is not a GRES type name")
        return proposal["value"]

    slurm_driver_cuda = Dict(
        Unicode(),
        help="""
        The newest CUDA version the NVIDIA driver of the GPU nodes supports, per GPU model
        (the GRES type's slug, as in ``slurm_gres_types``), with ``"*"`` for nodes of any
        other model: ``{"a100": "12.4", "*": "12.2"}`` (what ``nvidia-smi`` prints as
        "CUDA Version" on those nodes). A node feature says it per node and wins over this
        map: ``Feature=cuda12.4`` in ``slurm.conf`` (also ``cuda_12.4``, ``cuda-12.4``).
        A node known by neither is never the reason for a refusal. See ``environment_cuda``.
        A value that is no CUDA version is refused at hub start.
        """,
    ).tag(config=True)

    environment_cuda = Dict(
        Unicode(),
        help="""
        The CUDA version the software a job runs needs, per profile slug or image name
        (a site's ``batch_script`` may run the chosen ``{image}`` in a container):
        ``{"torch-cu126": "12.6", "ghcr.io/x/torch:2.5": "cuda>=12.4"}``. Values are versions
        or an image's ``NVIDIA_REQUIRE_CUDA`` value. The chosen image's entry counts, else the
        profile's. A GPU request whose every fitting node has a driver older than that
        (``slurm_driver_cuda``, node features) is refused with HTTP 409 before anything is
        submitted; when other GPU types would do, one whose nodes' driver is new enough is asked for,
        and where only some nodes of a type are new enough, the job's ``--constraint`` names their
        ``cuda`` features (where the nodes declare them). A value that is no CUDA requirement is
        refused at hub start.
        """,
    ).tag(config=True)

    @validate("slurm_driver_cuda", "environment_cuda")
    def _check_cuda_maps(self, proposal):
        return checked_cuda_map(proposal)

    home_dir_template = Unicode(
        "",
        help="""
        The directory a job starts in and writes its log to, and its ``HOME``
        (``{username}`` is replaced by the hub user's name; no other ``{...}``), for users
        the hub host's user database does not know. Empty: the user's home directory from
        that database, as batchspawner does. Not used with ``create_system_users`` (the
        account's home under ``system_user_home``).
        """,
    ).tag(config=True)

    @validate("home_dir_template")
    def _check_home_dir_template(self, proposal):
        try:
            proposal["value"].format(username="user")
        except (KeyError, IndexError, ValueError) as e:
            raise TraitError(f"home_dir_template {proposal['value']!r}: only {{username}} can be filled in "
                             f"({type(e).__name__}: {e})") from e
        return proposal["value"]

    slurm_cancel_orphans = Bool(
        True,
        help="""Cancel live jobs of this hub (their comment names ``gpu_hub_id``) that neither a server
        JupyterHub shows running or starting (its state) nor an active notebook GPU job names: the hub
        died between submitting them and saving their id, or stopped their server without ending
        them. Checked at hub start and every ``gpu_reconcile_interval`` seconds; the log names each
        job cancelled. False: such jobs run on, their GPUs counted against the user their comment
        names (also logged).""",
    ).tag(config=True)

    slurm_query_user = Unicode(
        "",
        help="""
        The account gpu-slurm's reads of the whole cluster run as, through ``exec_prefix``
        (its ``{username}``): ``sinfo --json`` (the form's availability, the checks before
        submitting) and ``squeue --json`` (the queue in words, the reconciliation of the hub's
        GPU charges with this hub's jobs). Empty: the user the hub acts for (the form's, the
        spawn's; the reconciliation's: the user whose server first reconciled), as batchspawner
        runs its own commands. Set it where Slurm's ``PrivateData=jobs`` hides other users' jobs
        from users, to an account Slurm shows every job (an operator): otherwise a user's
        ``squeue`` lists only their own jobs, and the reconciliation would free the charges of
        other users' running jobs.
        """,
    ).tag(config=True)

    slurm_reservation_user = Unicode(
        "",
        help="""
        The account that creates and removes the Slurm advance reservations holding GPU
        bookings (``scontrol create reservation``, ``scontrol delete reservation``, and the
        ``sinfo`` and ``scontrol show reservation`` they need), through ``exec_prefix`` (its
        ``{username}``). Slurm lets only its operators and administrators create
        reservations, so name such an account. Empty: the account the hub runs as.
        """,
    ).tag(config=True)

    job_python = Unicode(
        "python3",
        help="""
        The Python a notebook GPU job runs its notebook with on the Slurm node
        (``JOB_PYTHON -m gpuspawner.jobs.execute ...`` in the server's ``batch_script``):
        one with gpuspawner, nbclient and the kernels users pick, e.g. the path of the
        environment that also runs ``jupyterhub-singleuser`` there.
        """,
    ).tag(config=True)

    honours_slurm_settings = True
    gpu_job_runner = "gpuspawner.backends.slurm.jobs.SlurmJobs"
    #: set on a notebook GPU job's spawner: what its batch script runs instead of the server
    gpu_job_command: list[str] | None = None
    honours_interconnect = False  # the cluster places the GPUs

    @validate("gpu_profiles")
    def _check_profiles(self, proposal):
        """As for every backend, and no ``queue: true`` profile: jobs wait in Slurm's queue, not the hub's."""
        value = super()._check_profiles(proposal)
        queued = [p.slug for p in load_profiles(value) if p.queue]
        if queued:
            raise TraitError(f"Invalid GPU profile configuration: profile '{queued[0]}' sets 'queue': True, but "
                             "gpu-slurm has no hub queue: a job that must wait waits in Slurm's queue. "
                             "Remove 'queue' from it.")
        return value

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._configured = {name: getattr(self, name) for name in _PROFILE_TRAITS}
        self._announced_job = ""
        self._last_words = ""
        self._words_at = 0.0
        self._submitted_job = ""  # the last job sbatch gave this spawner, until it is stopped
        self._gpu_gres = ""  # this start's GPU request (``gpu:a100:1``), joined with the site's req_gres
        refused = self.refused_batch_settings()
        if refused:
            raise TraitError("gpu-slurm cannot honour " + "\n".join(refused))

    @classmethod
    def gpu_startup_problems(cls, config) -> list[str]:
        """The batchspawner settings of ``config`` gpu-slurm cannot honour, as sentences for the hub's start
        (:func:`gpuspawner.hub.setup.check_spawner`)."""
        try:
            cls(config=config)  # the settings only: no user
        except TraitError as e:
            return [str(e)]
        return []

    @classmethod
    def booking_keeper(cls, config) -> SlurmBookingKeeper:
        """Bookings held as Slurm advance reservations (:mod:`.booking`), made with ``config``'s settings."""
        return SlurmBookingKeeper.of(cls(config=config))

    @classmethod
    def cluster_health_reader(cls, config) -> SlurmHealthReader:
        """The reader of the nodes' health (drained, down: :mod:`.health`), made with ``config``'s settings."""
        return SlurmHealthReader.of(cls(config=config))

    def offers_gpus(self) -> bool:
        """Whether some profile lets a user pick GPUs (then the site's own GPU settings are refused)."""
        return any(count > 0 for p in self.all_profiles() for count in p.gpu_counts)

    def refused_batch_settings(self) -> list[str]:
        """The configured batchspawner settings that would fight the GPU choices, each in a sentence naming it
        (:func:`gpuspawner.backends.slurm.settings.refused_settings`); the site's own user-independent values only."""
        blank = {name[4:]: "" for name in self.trait_names() if name.startswith("req_")}
        try:
            directives = sbatch_directives(lenient_render(self.batch_script, blank))
        except Exception:  # a template batchspawner could not fill in either: its own error at submission
            directives = ""
        try:
            command = lenient_render(self.batch_submit_cmd, {**blank, "job_name": "NAME", "job_comment": "COMMENT"})
        except Exception:
            command = self.batch_submit_cmd
        settings = {name: getattr(self, name) for name in _CHECKED_TRAITS}
        return [f"c.SlurmSpawner.{sentence}" for sentence in
                refused_settings(settings, directives, command, self.offers_gpus())]

    # ------------------------------------------------------------ where jobs run

    @default("req_username")
    def _req_username_default(self):
        return self.account()  # the hub user's name, or the account the hub makes for them

    @default("req_homedir")
    def _req_homedir_default(self):
        if self.create_system_users:
            return self.account_home()
        if self.home_dir_template:
            return self.home_dir_template.format(username=self.user.name)
        return super()._req_homedir_default()

    def user_env(self, env):
        """batchspawner's USER, HOME and SHELL; HOME from ``home_dir_template`` when it is set."""
        if not (self.home_dir_template or self.create_system_users):
            return super().user_env(env)
        env["USER"] = self.req_username
        env["HOME"] = self.req_homedir
        return env

    # ------------------------------------------------------------ applying a choice

    def apply_profile(self, choice: Choice) -> None:
        """The profile's Slurm settings, CPUs and memory on the job (configured values otherwise)."""
        for name, value in self._configured.items():
            setattr(self, name, value)
        super().apply_profile(choice)
        for key, value in choice.profile.slurm:
            if key in _SLURM_TRAITS:
                setattr(self, _SLURM_TRAITS[key], value)
            elif key == "constraint":
                self.req_options = f"{self.req_options} --constraint={value}".strip()
        if choice.profile.cpu_limit is not None:
            self.req_nprocs = str(math.ceil(choice.profile.cpu_limit))
        if choice.profile.mem_limit is not None:
            self.req_memory = slurm_memory(choice.profile.mem_limit)

    async def never_fits(self, choice: Choice) -> PlacementError | None:
        """Slurm's nodes' "no node of the partition could ever run it" (:func:`choose_type`), or None."""
        if not choice.gpus:
            return None
        reading = await (await self.slurm()).nodes()
        if reading.unknown is not None:
            return None
        try:
            choose_type(reading.value, self.gres_types, choice.models, choice.gpus, self.partitions(choice),
                        self.cuda_need(choice), DriverCuda(dict(self.slurm_driver_cuda)))
        except NeverFits as e:
            return e
        return None

    # ------------------------------------------------------------ claiming: Slurm places

    async def choice_for_start(self) -> Choice:
        """This start's choice; the words of the last start's job forgotten."""
        choice = await super().choice_for_start()
        self._announced_job = self._last_words = self._gpu_gres = ""
        self.gpu_wait = None
        return choice

    opening_words = ("Checking Slurm for {}", "Submitting {} to Slurm")

    async def reconcile_before_claim(self, choice: Choice) -> None:
        """Once per hub, before its first job: this hub's jobs counted, orphans cancelled. A failure is
        logged and the start goes on (tried again next time; Slurm still enforces its own limits)."""
        try:
            await self.ensure_reconciled()
        except Exception as e:
            self.log.warning("%s: Slurm jobs of this hub not counted yet: %s", self._log_name, e)

    async def claim(self, choice: Choice) -> Claim:
        """Check the request against Slurm's nodes and count it against the quotas: ``--gres=gpu:TYPE:N``.

        Slurm picks the GPUs: the ledger counts ``N`` of the GRES type. A request no node of
        the partition could ever run, or over a hub quota, is refused and nothing is submitted.
        Where the image or profile needs a CUDA version, the claim names the node features
        whose driver supports it.
        """
        partitions = self.partitions(choice)
        reading = await (await self.slurm()).nodes()
        refusal, constraint = None, ""
        types = self.gres_types
        if reading.unknown is None:
            need, drivers = self.cuda_need(choice), DriverCuda(dict(self.slurm_driver_cuda))
            try:
                gres_type = choose_type(reading.value, types, choice.models, choice.gpus, partitions, need, drivers)
            except NeverFits as e:  # a PlacementError: refused below, after the quotas are counted
                refusal = e
                gres_type = UNTYPED
            else:
                if need is not None:
                    constraint = cuda_constraint(reading.value, types, gres_type, choice.gpus, partitions, need,
                                                 drivers)
        else:
            gres_type = types.gres_type(choice.models[0]) if choice.models else UNTYPED
            self.gpu_event(f"GPU availability unknown (Slurm does not answer: {reading.unknown}); "
                           "submitting to Slurm, which decides", 20)
        resource = ledger_resource(gres_type)
        request = GPURequest(owner=self.gpu_owner, count=choice.gpus, models=choice.models)
        self.claim_cluster_gpus(request, {resource: choice.gpus}, refusal)
        gres = f"gpu:{gres_type}:{choice.gpus}" if gres_type else f"gpu:{choice.gpus}"
        name = types.slug(gres_type) if gres_type else "GPU"
        where = f" in partition {','.join(partitions)}" if partitions else ""
        asked = join_gres(self._configured["req_gres"], gres)
        return Claim(count=choice.gpus, resource=resource, name=name, gres=gres, constraint=constraint,
                     progress=f"Asking Slurm for {choice.gpus} x {name} (--gres={asked}){where}")

    def apply_claim(self, claim: Claim) -> None:
        """The job's ``--gres`` (this claim's, with the site's other GRES) and its node features."""
        self._gpu_gres = claim.gres
        if claim.gres:
            self.req_gres = join_gres(self._configured["req_gres"], claim.gres)
        self._constrain(claim.constraint)

    def _constrain(self, features: str) -> None:
        """Add ``features`` (``"cuda12.4|cuda12.6"``) to the job's ``--constraint``, with the profile's own."""
        if not features:
            return
        found = re.search(r"--constraint=(\S+)", self.req_options or "")
        if found is None:
            self.req_options = f"{self.req_options} --constraint={features}".strip()
        elif "[" not in found.group(1):  # Slurm's brackets do not group: leave the profile's as it is
            combined = f"--constraint=({features})&({found.group(1)})"
            self.req_options = self.req_options.replace(found.group(0), combined)

    async def stop(self, now: bool = False):
        if not self.job_id and self._submitted_job:
            # batchspawner forgets its job when a start is interrupted (a cancelled spawn kills its
            # squeue, which reads as "neither pending nor running"), while Slurm may still queue it
            self.log.info("%s: cancelling Slurm job %s of an interrupted start", self._log_name, self._submitted_job)
            self.job_id = self._submitted_job
        try:
            await super().stop(now=now)
        finally:
            self._submitted_job = self._gpu_gres = ""
            for name, value in self._configured.items():
                setattr(self, name, value)
            self.gpu_choice = None

    async def poll(self):
        """batchspawner's poll; the first one after a hub start also reconciles this hub's jobs."""
        try:
            await self.ensure_reconciled()
        except Exception as e:
            self.log.warning("%s: Slurm jobs of this hub not reconciled yet: %s", self._log_name, e)
        return await super().poll()


__all__ = ["GPUSlurmSpawner", "slurm_memory"]
