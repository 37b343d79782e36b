"""How gpu-slurm reads Slurm: its commands, filled in as batchspawner fills its own: :class:`SlurmReadingMixin`.

A parent of :class:`~gpuspawner.backends.slurm.spawner.GPUSlurmSpawner`. Every Slurm command the hub
runs (``sinfo``, ``squeue``, cancellations) goes through ``exec_prefix`` filled in for the user the hub
acts for (or ``slurm_query_user``), through the hub's cached readers
(:mod:`gpuspawner.backends.slurm.commands`); what they say becomes the models offered, the form's
availability, and the partitions and CUDA version a choice needs.
"""

from __future__ import annotations

from batchspawner import format_template
from traitlets.config import Configurable

from ...accounts import AccountError, account_name
from ...compat import min_cuda
from ...form import form_context
from ...inventory import InventoryReading
from ...profiles import Choice
from .caches import SlurmCaches
from .capacity import GresTypes, gpu_availability
from .commands import SlurmReader
from .cuda import CudaNeed


class SlurmReadingMixin(Configurable):
    """Slurm's commands and what they say about nodes and choices (see the module's words)."""

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
                            availability=availability, unknown=unknown, waits=True, host="node")

