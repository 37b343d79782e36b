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
"""

from __future__ import annotations

import math
import re
import shlex
import time

from batchspawner import JobStatus, SlurmSpawner, format_template
from traitlets import Bool, Dict, TraitError, Unicode, default, validate

from ...accounts import AccountError, SystemAccounts, account_name
from ...compat import min_cuda
from ...form import form_context
from ...gpu import GPU
from ...inventory import InventoryReading
from ...ledger import cluster_tokens
from ...owner import Owner, OwnerError, user_of
from ...placement import GPURequest, PlacementError
from ...profiles import Choice, load_profiles
from ...reconcile import Workload
from ..base import GPUSpawnerMixin, checked_cuda_map, user_error
from .caches import SlurmCaches
from .capacity import UNTYPED, GresTypes, NeverFits, choose_type, cuda_constraint, gpu_availability, parse_gres
from .commands import SlurmReader, prefixed, run_command_line
from .cuda import CudaNeed, DriverCuda
from .queue import ENDED, comment_start, job_comment, parse_comment, submit_refusal, wait_words
from .settings import (
    CHOICE_FLAGS,
    join_gres,
    lenient_render,
    refused_settings,
    sbatch_directives,
    sbatch_options,
)

_GRES_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: batchspawner traits a profile's ``slurm`` settings set
_SLURM_TRAITS = {"partition": "req_partition", "time": "req_runtime", "qos": "req_qos",
                 "account": "req_account", "reservation": "req_reservation"}
_PROFILE_TRAITS = (*_SLURM_TRAITS.values(), "req_nprocs", "req_memory", "req_gres", "req_options")
#: the batchspawner settings checked against the GPU choices when the spawner is configured
_CHECKED_TRAITS = ("req_gres", "req_ngpus", "req_options", "req_cluster")


def _ledger_resource(gres_type: str) -> str:
    """The ledger's resource name for GPUs of a GRES type (no colon: see :func:`cluster_tokens`)."""
    return f"slurm-gpu.{gres_type or 'untyped'}"


def slurm_memory(limit: str | int) -> str:
    """A profile's ``mem_limit`` as ``sbatch --mem`` takes it: ``"8G"`` stays, bytes become MiB."""
    if isinstance(limit, int):
        return f"{math.ceil(limit / 2**20)}M"
    if re.fullmatch(r"[0-9]+[KMGT]?", limit):
        return limit
    number, unit = float(limit[:-1]), limit[-1]
    return f"{math.ceil(number * 1024 ** 'KMGT'.index(unit) / 1024)}M"  # "1.5G" -> "1536M"


class GPUSlurmSpawner(GPUSpawnerMixin, SystemAccounts, SlurmSpawner):
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

    def cmd_formatted_for_batch(self):
        """What the batch script runs: the server, or a notebook GPU job's executor."""
        if self.gpu_job_command:
            return " ".join(shlex.quote(arg) for arg in self.gpu_job_command)
        return super().cmd_formatted_for_batch()

    def slurm_job_identity(self) -> tuple[str, str]:
        """This job's name and comment: the hub, user and server (``job/<id>`` for a notebook job), and the
        comment also this start's mark (how the hub recognizes its jobs, :mod:`gpuspawner.reconcile`)."""
        server = Owner.parse(self.gpu_owner).label
        return (f"jupyterhub-{self.gpu_hub_id}-{self.user.name}-{server}".rstrip("-"),
                job_comment(self.gpu_hub_id, self.user.name, server, self.gpu_start_mark))

    def get_req_subvars(self):
        """batchspawner's values, and ``{job_name}``, ``{job_comment}`` (shell-quoted) for a site's templates."""
        return self._with_job_identity(super().get_req_subvars())

    def _with_job_identity(self, subvars: dict) -> dict:
        name, comment = self.slurm_job_identity()
        subvars["job_name"], subvars["job_comment"] = shlex.quote(name), shlex.quote(comment)
        return subvars

    # ------------------------------------------------------------ running Slurm's commands

    def command_subvars(self) -> dict:
        """:meth:`get_req_subvars` for a command run outside a start (a form's, a reconciliation's), without
        fixing ``req_keepvars`` early: batchspawner computes its default once, from the server's environment
        when first used, which before the start lacks the server's URL (the job would not export it)."""
        if self.trait_has_value("req_keepvars"):
            return self.get_req_subvars()
        # batchspawner's get_req_subvars(), with req_keepvars' default computed but not kept
        subvars = {name[4:]: self.trait_defaults(name) if name == "req_keepvars" else getattr(self, name)
                   for name in self.trait_names() if name.startswith("req_")}
        if subvars.get("keepvars_extra"):
            subvars["keepvars"] += "," + subvars["keepvars_extra"]
        return self._with_job_identity(subvars)

    def filled_exec_prefix(self, **subvars: str) -> str:
        """``exec_prefix`` filled in as batchspawner fills it for this user's commands (``subvars`` replace
        some of its values: ``username`` for a command run as another user's account)."""
        return format_template(self.exec_prefix, **{**self.command_subvars(), **subvars})

    def account_of(self, hub_user: str) -> str:
        """The system account hub user ``hub_user``'s jobs run as (batchspawner's ``{username}``)."""
        return account_name(hub_user, self.system_user_prefix) if self.create_system_users else hub_user

    async def slurm(self) -> SlurmReader:
        """The hub's cached reader of sinfo and squeue through ``exec_prefix`` filled in for this user (or
        ``slurm_query_user``); one per filled-in prefix. With ``create_system_users``, the account the
        commands run as is made first."""
        as_user = {"username": self.slurm_query_user} if self.slurm_query_user else {}
        try:
            if not as_user:
                await self.ensure_account()
        except AccountError as e:  # the commands say what is wrong, as unknown readings
            self.log.warning("%s: %s", self._log_name, e)
        try:
            prefix = self.filled_exec_prefix(**as_user)
        except Exception as e:  # e.g. batchspawner's req_homedir of a user this host does not know
            why = f"exec_prefix cannot be filled in for {self.user.name}: {e!r}"
            key, make = ("", why), lambda: SlurmReader(problem=why)
        else:
            key, make = ("prefix", prefix), lambda: SlurmReader(prefix, ttl=self.gpu_inventory_ttl)
        readers = self.hub_state.cache(SlurmCaches).slurm_readers
        if key not in readers:
            readers[key] = make()
        return readers[key]

    @property
    def gres_types(self) -> GresTypes:
        return GresTypes(dict(self.slurm_gres_types))

    def cuda_need(self, choice: Choice) -> CudaNeed | None:
        """The CUDA version ``choice`` needs (``environment_cuda``: its image's entry, else its profile's)."""
        if choice.image and choice.image in self.environment_cuda:
            return CudaNeed(min_cuda(self.environment_cuda[choice.image]), f"Image {choice.image}", "an image")
        if choice.profile.slug in self.environment_cuda:
            return CudaNeed(min_cuda(self.environment_cuda[choice.profile.slug]),
                            f"Profile '{choice.profile.slug}'", "a profile")
        return None

    def partitions(self, choice: Choice | None = None) -> tuple[str, ...]:
        """The partitions a request of ``choice`` goes to (none named: Slurm's default, all nodes counted)."""
        if choice is not None:
            named = dict(choice.profile.slurm).get("partition")
            if named:
                return tuple(named.split(","))
        configured = self._configured.get("req_partition") if hasattr(self, "_configured") else self.req_partition
        return tuple(configured.split(",")) if configured else ()

    def _form_partitions(self) -> tuple[str, ...]:
        named = {part for p in self.profiles for part in self.partitions(Choice(p, 0))}
        return tuple(sorted(named))

    async def offered_models(self) -> set[str]:
        reading = await (await self.slurm()).nodes()
        if reading.unknown is not None:  # Slurm does not answer: accept the models profiles and the map name
            named = {m for p in self.profiles for m in p.gpu_models if m != "any"}
            return named | set(self.slurm_gres_types)
        types = self.gres_types
        return {types.slug(t) for node in reading.value for t in node.gpus}

    async def options_form_context(self) -> dict:
        reading = await (await self.slurm()).nodes()
        availability = [] if reading.unknown else gpu_availability(reading.value, self.gres_types,
                                                                    self._form_partitions())
        unknown = f"Slurm does not answer: {reading.unknown}" if reading.unknown else None
        # a request that does not fit now is submitted and waits in Slurm's queue
        return form_context(self.profiles, InventoryReading(), (), self.user_options or {},
                            availability=availability, unknown=unknown, waits=True)

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

    async def reserve_gpus(self) -> tuple[GPU, ...]:
        """Check the request against Slurm's nodes, count it against the quotas, set ``--gres``.

        Slurm picks the GPUs; a request no node of the partition could ever run,
        or over a hub quota, is refused with HTTP 409 and nothing is submitted.
        """
        choice = self.gpu_choice
        if choice is None:
            await self._apply_gpu_options(self.user_options or {})
            choice = self.gpu_choice
        self._gpu_events = []
        self._announced_job = self._last_words = self._gpu_gres = ""
        self.gpu_allocation = ()
        self.release_gpus()  # a failed earlier start of this server holds nothing
        try:  # once per hub, before its first job: this hub's jobs counted, orphans cancelled
            await self.ensure_reconciled()
        except Exception as e:  # tried again next time; Slurm still enforces its own limits
            self.log.warning("%s: Slurm jobs of this hub not counted yet: %s", self._log_name, e)
        if choice.gpus == 0:
            self.gpu_event("Submitting a CPU-only server (no GPU) to Slurm", 10)
            return ()
        partitions = self.partitions(choice)
        self.gpu_event(f"Checking Slurm for {self.describe_request(choice)}", 10)
        reading = await (await self.slurm()).nodes()
        refusal = None
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
                    self._constrain(cuda_constraint(reading.value, types, gres_type, choice.gpus, partitions,
                                                    need, drivers))
        else:
            gres_type = types.gres_type(choice.models[0]) if choice.models else UNTYPED
            self.gpu_event(f"GPU availability unknown (Slurm does not answer: {reading.unknown}); "
                           "submitting to Slurm, which decides", 20)
        request = GPURequest(owner=self.gpu_owner, count=choice.gpus, models=choice.models)
        try:
            self.claim_cluster_gpus(request, {_ledger_resource(gres_type): choice.gpus}, refusal)
        except PlacementError as e:
            self.gpu_event(f"Refused: {e}", 100)
            raise user_error(409, str(e)) from e
        self._gpu_gres = f"gpu:{gres_type}:{choice.gpus}" if gres_type else f"gpu:{choice.gpus}"
        self.req_gres = join_gres(self._configured["req_gres"], self._gpu_gres)  # the site's other GRES too
        where = f" in partition {','.join(partitions)}" if partitions else ""
        self.gpu_event(f"Asking Slurm for {choice.gpus} x {types.slug(gres_type) if gres_type else 'GPU'} "
                       f"(--gres={self.req_gres}){where}", 30)
        return ()

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

    # ------------------------------------------------------------ the job

    def sbatch_options(self) -> str:
        """What gpu-slurm adds to the site's sbatch command line for this job (shell-quoted): one node, the
        job's name and comment (how the hub knows its jobs), and what this start's choice decided: the GPUs
        (with the site's other GRES), the profile's partition, time, QOS, account, reservation, CPUs, memory
        and node features. sbatch's command line wins over the script's ``#SBATCH`` lines, so these reach
        the job whatever the site's ``batch_script`` says."""
        name, comment = self.slurm_job_identity()
        identity = ["--nodes=1", f"--job-name={name}", f"--comment={comment}"]
        constraint = ""
        if self.req_options != self._configured["req_options"]:
            found = re.search(r"--constraint=(\S+)", self.req_options or "")
            constraint = found.group(1) if found else ""
        options = sbatch_options(identity, {t: getattr(self, t) for t, _ in CHOICE_FLAGS}, self._configured,
                                 self.req_gres if self._gpu_gres else "", constraint)
        return " ".join(shlex.quote(option) for option in options)

    async def _submit_job(self) -> str:
        """batchspawner's submission (``exec_prefix`` + ``batch_submit_cmd``, the ``batch_script`` on its
        stdin, in the server's environment), with :meth:`sbatch_options` at the end of the command line."""
        subvars = self.get_req_subvars()
        cmd = " ".join((format_template(self.exec_prefix, **subvars),
                        format_template(self.batch_submit_cmd, **subvars), self.sbatch_options()))
        subvars["cmd"] = self.cmd_formatted_for_batch()
        subvars.update(self.user_options or {})  # as batchspawner: a site's script may use {image}
        script = await self._get_batch_script(**subvars)
        self.log.info("Spawner submitting command: %s", cmd)
        self.log.debug("Spawner submitting script:\n%s", script)
        out = await self.run_command(cmd, input=script, env=self.get_env())
        try:
            self.job_id = self.parse_job_id(out)
        except Exception:
            self.log.error("Job submission failed. sbatch said: %s", out)
            self.job_id = ""
        return self.job_id

    async def submit_batch_script(self):
        """Submit the job (:meth:`_submit_job`); when sbatch fails, HTTP 409 (Slurm refused the job) or 503
        (sbatch could not reach Slurm) saying what Slurm said.

        Nothing stays held: the failed start releases this server's count of GPUs. With
        ``create_system_users``, the user's account is made first (it submits the job).
        """
        try:
            await self.ensure_account()
        except AccountError as e:
            raise user_error(503, f"This hub cannot start your server: {e}. Ask an admin.") from e
        try:
            job_id = await self._submit_job()
        except RuntimeError as e:  # batchspawner's run_command: sbatch's stderr
            constraint = re.search(r"--constraint=(\S+)", self.req_options or "")
            status, message = submit_refusal(str(e), {
                "partition": self.req_partition, "time": self.req_runtime, "gres": self.req_gres,
                "qos": self.req_qos, "account": self.req_account, "cpus": self.req_nprocs,
                "memory": self.req_memory, "constraint": constraint.group(1) if constraint else "",
            })
            self.log.warning("%s: sbatch failed: %s", self._log_name, str(e).strip())
            self.gpu_event(f"Refused: {message}" if status == 409 else f"Failed: {message}", 100)
            raise user_error(status, message) from e
        if job_id:
            self._submitted_job = job_id
            self.gpu_event(f"Submitted Slurm job {job_id}", 35)
            self.save_state()  # the job id is in the database before the job can start
        return job_id

    async def query_job_status(self):
        """batchspawner's status; while pending, Slurm's reason and the queue in the progress."""
        status = await super().query_job_status()
        if status == JobStatus.PENDING and time.monotonic() - self._words_at >= 1.5:
            self._words_at = time.monotonic()
            await self._say_why_waiting()
        elif status == JobStatus.RUNNING and self._announced_job != self.job_id:
            self._announced_job = self.job_id
            self.gpu_event(f"Slurm started job {self.job_id} on {self.state_gethost()}; "
                           "waiting for the server to answer", 60)
        return status

    async def _say_why_waiting(self) -> None:
        reading = await (await self.slurm()).jobs(max_age=1.0)
        if reading.unknown is not None:
            return
        job = next((j for j in reading.value if j.id == self.job_id), None)
        if job is None or not job.pending:
            return
        words = wait_words(job, reading.value)
        if words != self._last_words:
            self._last_words = words
            self.gpu_event(words, 40)

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

    # ------------------------------------------------------------ the cluster's truth

    reconciles_with_cluster = True
    backend_name = "gpu-slurm"
    workload_word = "Slurm job"

    async def live_workloads(self) -> list[Workload]:
        """This hub's jobs Slurm lists that have not ended and are not ending (``COMPLETING``: its
        epilog runs), found by their comment (``gpu_hub_id``), each holding the GPUs its ``--gres``
        asks for (as cluster tokens, as the hub's claims count them)."""
        reading = await (await self.slurm()).jobs(max_age=0)
        if reading.unknown is not None:
            raise RuntimeError(reading.unknown)
        live = []
        for job in reading.value:
            tag = parse_comment(job.comment)
            if tag is None or tag[0] != self.gpu_hub_id or job.state in ENDED or job.state == "COMPLETING":
                continue
            try:
                owner = str(Owner.from_parts(tag[1], tag[2]))
            except OwnerError as e:  # a comment this hub never writes (another user's sbatch can say anything)
                self.log.warning("Slurm job %s: its comment names no server or job of this hub (%s); not counted",
                                 job.id, e)
                continue
            gpus = parse_gres(job.gpus.replace("gres:", ""))
            holds = cluster_tokens(owner, {_ledger_resource(t): n for t, n in gpus.items()})
            live.append(Workload(job.id, owner, holds, comment_start(job.comment), f"Slurm job {job.id}"))
        return live

    async def recorded_workloads(self) -> dict[str, set[str]] | None:
        """Owner -> Slurm job ids of every server JupyterHub shows running or starting whose state names
        a job (``user/server``), and of every active notebook GPU job (``user/job/<id>``)."""
        if getattr(self, "db", None) is None:
            return None
        from jupyterhub import orm

        from ...jobmodel.store import JobStore

        owners: dict[str, set[str]] = {}
        for row in self.db.query(orm.Spawner).filter(orm.Spawner.server != None).all():  # noqa: E711 (SQL)
            job_id = (row.state or {}).get("job_id")
            if job_id and row.user is not None:
                owners.setdefault(str(Owner.of_server(row.user.name, row.name)), set()).add(str(job_id))
        store = self.hub_state.cache(JobStore, lambda: JobStore(self.db.get_bind()))
        for record in store.list(active_only=True, limit=100_000):
            if record.handle.get("slurm_job"):
                owners.setdefault(str(Owner.of_job(record.user, record.id)), set()).add(str(record.handle["slurm_job"]))
        return owners

    def stops_orphans(self) -> bool:
        return self.slurm_cancel_orphans

    async def end_orphan(self, workload: Workload) -> None:
        """Cancel a job of this hub that no server's state and no active notebook job names, as batchspawner
        cancels its jobs (``exec_prefix`` + ``batch_cancel_cmd``), as the account of the user its comment names."""
        self.log.warning("gpu-slurm: cancelling Slurm job %s of %s: no server or notebook job of this hub's "
                         "database names it (the hub stopped before saving it, or its server was stopped)",
                         workload.id, workload.owner)
        try:
            subvars = {**self.command_subvars(), "username": self.account_of(user_of(workload.owner)),
                       "job_id": workload.id}
            line = prefixed(format_template(self.exec_prefix, **subvars),
                            format_template(self.batch_cancel_cmd, **subvars))
            await run_command_line(line, "batch_cancel_cmd")
        except Exception as e:  # noqa: BLE001 (a filled-in template can fail in many ways; the next pass retries)
            self.log.error("gpu-slurm: could not cancel Slurm job %s: %s", workload.id, e)


__all__ = ["GPUSlurmSpawner", "slurm_memory"]
