"""gpu-local's server starts: their device fences, ending what a start left, and rebuilding the
ledger from the live starts after a hub restart (:class:`LocalStarts`, a mixin of both local spawners).

A *start* is one run of a server (or a notebook job): its processes carry its marks
(:mod:`gpuspawner.marks`) and, where the kernel fences starts, live in its cgroup or systemd scope
(:mod:`.fence`, :mod:`.fence_systemd`). The traits it reads (``gpu_isolation``,
``fence_end_timeout``, ``fence_retry_interval``) are defined on the spawner
(:mod:`.spawner`).
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass

from ...owner import Owner, user_of
from ..base import user_error
from .caches import LocalCaches
from .fence import DeviceFence, Isolation, detect
from .fence_starts import StartRecord
from .fence_systemd import ScopeFence, scope_command
from .processes import MarkedStarts, StartFence, describe_processes, end_start, find_servers


def orphan_owner(group) -> str:
    """The ledger owner of an unrecorded start being stopped (:meth:`Owner.leftover`)."""
    return str(Owner.parse(group.owner).leftover(group.spawn[:12]))


class LocalStarts:
    """The starts of a local spawner's servers and jobs: fences, ending, reconciliation."""

    _fence_path: list | None = None  # the cgroups a start's process joins before it runs (cgroup v1)
    _scope_prefix: list[str] | None = None  # systemd-run words before the server's command

    @classmethod
    def gpu_isolation_summary(cls) -> Isolation:
        """How this host isolates local servers' GPUs (shown on the admin overview)."""
        return detect()

    def _mechanism(self) -> str:
        if self.gpu_isolation == "off":
            return "advisory"
        return self._isolation().mechanism

    def _isolation(self) -> Isolation:
        """How this host isolates servers' GPUs, detected once per hub."""
        caches = self.hub_state.cache(LocalCaches)
        if caches.local_isolation is None:
            caches.local_isolation = detect()
        return caches.local_isolation

    def _fences(self) -> StartFence:
        """This hub's starts and their processes: cgroups or scopes where the kernel fences them, else marks."""
        mechanism = self._mechanism()

        def make() -> StartFence:
            kernel = {"cgroup-v1": DeviceFence, "systemd": ScopeFence}.get(mechanism)
            return StartFence(kernel(self.gpu_hub_id) if kernel else None, MarkedStarts(self.gpu_hub_id))

        fences = self.hub_state.cache(LocalCaches).local_fences
        if mechanism not in fences:
            fences[mechanism] = make()
        return fences[mechanism]

    # ------------------------------------------------------------ reconciliation

    async def reconcile_allocations(self) -> None:
        """Make the ledger hold exactly what this hub's live server starts hold.

        A start is live while any process of it is: in its cgroup or scope (the kernel's
        list, which a process that cleared its environment cannot leave), or, unfenced,
        carrying its marks. Its owner and GPUs come from the marks of its processes, else
        from the record saved when its fence was made.
        """
        isolation = self._isolation()
        if self.gpu_isolation == "off":
            self.log.warning("gpu-local: gpu_isolation is 'off': servers get CUDA_VISIBLE_DEVICES only")
        elif isolation.enforced:
            self.log.info("gpu-local: %s", isolation.note)
        else:
            self.log.warning("gpu-local: %s", isolation.note)
        starts = await asyncio.to_thread(live_starts, self._fences(), self.gpu_hub_id)
        state = self.hub_state
        recorded = state.cache(LocalCaches).local_starts
        found_pids = state.cache(LocalCaches).local_pids
        ledger = self.ledger
        before = ledger.allocations()
        # Nothing is placed before this runs (spawns wait for it): what the ledger holds came
        # from saved state; the processes say what is really held.
        for owner in before:
            ledger.release(owner)
        for start in starts:
            if Owner.parse(start.owner).job == start.spawn:  # a notebook job: the job manager watches it
                conflict = ledger.adopt(start.owner, start.uuids)
                self.log.info("gpu-local: job %s of %s runs (pids %s) on GPUs %s", start.spawn,
                              user_of(start.owner), _pids(start.pids), ", ".join(start.uuids) or "none")
            elif recorded.get(start.owner) == start.spawn:
                conflict = ledger.adopt(start.owner, start.uuids)
                if start.leader:
                    found_pids[start.owner] = start.leader
                self.log.info("gpu-local: adopted %s's server (pids %s) on GPUs %s",
                              start.owner, _pids(start.pids), ", ".join(start.uuids) or "none")
            else:
                conflict = ledger.adopt(orphan_owner(start), start.uuids)
                self.log.warning(
                    "gpu-local: stopping pid(s) %s of %s: the hub's database does not record this start "
                    "(the hub stopped while it was starting or stopping it); its GPUs %s stay held until they "
                    "are gone", _pids(start.pids), start.owner, ", ".join(start.uuids) or "none",
                )
                state.cache(LocalCaches).local_orphans.add(asyncio.ensure_future(self._end_orphan(start)))
            if conflict:
                self.log.error("gpu-local: GPUs %s are used by two live servers (%s among them)",
                               ", ".join(conflict), start.owner)
        live = {s.owner for s in starts}
        for owner, uuids in before.items():
            if owner not in live:
                self.log.warning("gpu-local: %s's GPUs %s were freed: no live process holds them",
                                 owner, ", ".join(uuids))
        self.log.info("gpu-local: ledger rebuilt from %d live server start(s)", len(starts))

    async def _end_orphan(self, start: LiveStart) -> None:
        if await self._end_processes(start.spawn, start.owner, holder=orphan_owner(start)):
            self.log.info("gpu-local: stopped the unrecorded start of %s; GPUs %s are free",
                          start.owner, ", ".join(start.uuids) or "none")
            self.gpu_released(self.ledger.release(orphan_owner(start)))

    # ------------------------------------------------------------ ending a start

    async def _end_processes(self, spawn: str, owner: str | None = None, holder: str | None = None) -> bool:
        """End every process of start ``spawn`` still alive (kernels, daemons it left); True once none is.

        Then the start's fence is removed, and the caller gives its GPUs back. Where
        some process is still there after ``fence_end_timeout``, the GPUs that ``holder``
        (default: the start's owner, ``owner`` or this spawner's) holds go out of service
        instead, and the hub retries every ``fence_retry_interval`` seconds.
        """
        if not spawn:
            return True
        fence = self._fences()
        owner = owner or self.gpu_owner
        left = await end_start(fence, spawn, self.fence_end_timeout)
        if not left:
            await asyncio.to_thread(fence.remove, spawn)
            return True
        interval = self.fence_retry_interval

        async def retry() -> str | None:
            still = await end_start(fence, spawn, min(interval, 1.0))
            if still:
                return leftover_reason(owner, await asyncio.to_thread(describe_processes, still), interval)
            await asyncio.to_thread(fence.remove, spawn)
            return None

        reason = leftover_reason(owner, await asyncio.to_thread(describe_processes, left), interval)
        self.hub_state.out_of_service.withhold(owner, spawn, reason, retry, interval, holder=holder)
        if holder is None and owner == self.gpu_owner:
            self.gpu_allocation = ()
        return False

    async def _end_start(self, spawn: str) -> None:
        """End start ``spawn``'s processes, then give its GPUs back (unless they went out of service).

        Once per start: a stop polls, and a poll that finds the server gone ends its start too.
        """
        endings: dict = self.__dict__.setdefault("_gpu_endings", {})
        if spawn not in endings:
            endings.clear()  # only the latest start is ever ended twice

            async def end() -> None:
                if await self._end_processes(spawn):
                    self.release_gpus()

            endings[spawn] = asyncio.ensure_future(end())
        await asyncio.shield(endings[spawn])

    # ------------------------------------------------------------ the device fence

    def _create_fence(self) -> None:
        """The device cgroup (or scope command) of this start, before its process exists.

        503 where isolation is required but impossible.
        """
        self._fence_path = self._scope_prefix = None
        isolation = self._isolation()
        if self.gpu_isolation == "off" or not isolation.enforced:
            if self.gpu_isolation == "required":
                message = f"This hub must enforce GPU isolation but cannot: {isolation.note}. Ask an admin."
                raise user_error(503, message)
            return
        minors = [g.minor_number for g in self.gpu_allocation]
        if None in minors:
            unknown = ", ".join(g.uuid for g in self.gpu_allocation if g.minor_number is None)
            message = f"the device numbers of GPUs {unknown} are unknown (NVML gave no minor number)"
            if self.gpu_isolation == "required":
                raise user_error(503, f"GPU isolation cannot be enforced: {message}. Ask an admin.")
            self.log.warning("%s: not fenced: %s", self._log_name, message)
            return
        record = StartRecord(self.gpu_owner, tuple(g.uuid for g in self.gpu_allocation))
        kernel = self._fences().kernel
        if isolation.mechanism == "systemd":
            user = self._system_user() if self._switches_user else None
            kernel.create(self.gpu_spawn_id, record)
            self._scope_prefix = scope_command(
                self.gpu_hub_id, self.gpu_spawn_id, minors,
                user=user.pw_name if user else None, group=user.pw_gid if user else None,
                program=shutil.which("systemd-run") or "systemd-run",
            )
        else:
            self._fence_path = kernel.create(self.gpu_spawn_id, minors, record)

    # ------------------------------------------------------------ for the job runner

    def job_command_prefix(self, job_id: str) -> list[str]:
        """Make notebook job ``job_id``'s device fence, as a server start's (503 where isolation is
        required but impossible); the words its command begins with (a systemd scope's ``systemd-run``
        words, else none). The job's start id is its job id."""
        self.gpu_spawn_id = job_id
        self._create_fence()
        return list(self._scope_prefix or [])

    def job_pids(self, job_id: str) -> list[int]:
        """The processes of notebook job ``job_id``: its fence's (cgroup or scope), else those with its marks."""
        return self._fences().pids(job_id)

    async def end_job_processes(self, job_id: str) -> bool:
        """End what notebook job ``job_id`` left (kernels, daemons) and remove its fence; True once nothing
        is left. What would not die keeps the job's GPUs out of service (see ``fence_end_timeout``)."""
        return await self._end_processes(job_id)


@dataclass(frozen=True)
class LiveStart:
    """A start of this hub with live processes, as found at hub start."""

    owner: str
    spawn: str
    uuids: tuple[str, ...]
    pids: tuple[int, ...]
    leader: int | None  # the server (or its shell), where it still carries its marks


def live_starts(fence: StartFence, hub_id: str) -> list[LiveStart]:
    """Every start of hub ``hub_id`` with a live process; removes the fences of those without."""
    marked = {g.spawn: g for g in find_servers(hub_id)}
    found = []
    for spawn in sorted(set(fence.starts()) | set(marked)):
        pids = set(fence.pids(spawn))
        group = marked.get(spawn)
        if group is not None:
            pids |= set(group.pids)
        if not pids:
            fence.remove(spawn)  # a start that is over: its cgroup and record go
            continue
        record = fence.record(spawn)
        if group is not None:
            owner, uuids, leader = group.owner, group.uuids, group.leader
        elif record is not None:
            owner, uuids, leader = record.owner, record.uuids, None
        else:  # a cgroup without record or marks (made by an older gpuspawner): end it, holding nothing
            owner, uuids, leader = str(Owner.of_server("unknown")), (), None
        found.append(LiveStart(owner, spawn, uuids, tuple(sorted(pids)), leader))
    return found


def leftover_reason(owner: str, processes: list[str], interval: float) -> str:
    """Why ``owner``'s GPUs are out of service: what of its start would not die."""
    who = Owner.parse(owner)
    user, name, job = who.user, who.server, who.job
    what = f"{user}'s job {job}" if job else (f"{user}'s server '{name}'" if name else f"{user}'s server")
    listed = "; ".join(processes) if processes else "a process that is gone by now"
    return (f"{len(processes) or 1} process(es) of {what} would not die on SIGKILL: {listed}. Its GPUs stay out "
            f"of service until they are gone (the hub tries again every {interval:g} s)")


def _pids(pids) -> str:
    return ", ".join(map(str, pids))
