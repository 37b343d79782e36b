"""``gpu-local``: single-user servers as local processes on exactly their GPUs.

Crash safety: a server's GPUs are saved in the hub's database *before* its
process starts, and written in the process's own environment (see
:mod:`gpuspawner.backends.local.processes`). Before it places anything, a
(re)started hub rebuilds its ledger from the live processes:

- a process whose start the database records (same server, same start id) is
  adopted: its GPUs stay held, and if the old hub died before saving the pid,
  the pid and port come from the process table and the saved state, so
  JupyterHub finds the server where it runs;
- any other live process of this hub (a start the database does not know) is
  stopped, and its GPUs stay held until it is gone; the log says why.

When a server stops, every process of that start still alive (kernels the
server left behind) is ended before its GPUs are given back.

Isolation: where the host allows it (:mod:`gpuspawner.backends.local.fence`), each start runs
in its own device cgroup (cgroup v1) or systemd scope that denies every GPU but
its own, so clearing ``CUDA_VISIBLE_DEVICES`` or opening ``/dev/nvidiaN``
directly gets ``EPERM``; the cgroup or scope goes when the start's last process
is gone, and a restarted hub keeps those of the servers it adopts.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from jupyterhub.utils import random_port
from traitlets import Bool, Float, TraitError, Unicode, validate

from ...accounts import (
    ANYONE,
    AccountError,
    SystemAccounts,
    interpreters,
    package_problem,
    passable_path,
    unreachable,
    user_groups,
)
from ...cpus import cpu_binding, host_cpus
from ...gpu import nvidia_visible_devices
from ...owner import Owner, user_of
from ..base import GPUSpawnerMixin, user_error
from .fence import DeviceFence, Isolation, detect
from .fence_starts import StartRecord
from .fence_systemd import ScopeFence, scope_command
from .processes import (
    HUB_VAR,
    SERVER_VAR,
    SPAWN_VAR,
    MarkedStarts,
    StartFence,
    describe_processes,
    end_start,
    find_servers,
)


def orphan_owner(group) -> str:
    """The ledger owner of an unrecorded start being stopped: ``user/server/stopping-<start id>``."""
    return f"{group.owner}/stopping-{group.spawn[:12]}"


def groups_and_home(username: str):
    """A ``preexec_fn`` for a server that ``systemd-run`` switches to ``username``.

    ``systemd-run --uid`` keeps the caller's supplementary groups (root's): give the
    process the user's own first, and start it in their home as JupyterHub does.
    """
    user = pwd.getpwnam(username)
    gids = os.getgrouplist(username, user.pw_gid)

    def preexec():
        os.setgroups(gids)
        try:
            os.chdir(user.pw_dir)
        except OSError:
            pass

    return preexec


def visible_devices(uuids: tuple[str, ...]) -> dict[str, str]:
    """The environment that confines CUDA (and GPU tools) to the given GPUs.

    CUDA accepts GPU UUIDs in CUDA_VISIBLE_DEVICES; an empty value hides every
    GPU. NVIDIA_VISIBLE_DEVICES carries the same set for tools that read it
    (the container runtime's convention, and gpuspawner's monitor); ``void``
    when there is none.
    """
    return {"CUDA_VISIBLE_DEVICES": ",".join(uuids), "NVIDIA_VISIBLE_DEVICES": nvidia_visible_devices(uuids)}


class _LocalGPUs(GPUSpawnerMixin):
    """What both local spawners add to JupyterHub's local process spawners."""

    gpu_isolation = Unicode(
        "auto",
        help="""
        How a server is kept off other users' GPUs beyond ``CUDA_VISIBLE_DEVICES``:
        ``"auto"`` (default): the kernel refuses every GPU device node but the server's own
        where the hub runs as root and the host offers a device controller: a cgroup per
        server under a writable cgroup v1 ``devices`` controller, else (systemd as PID 1 and
        ``systemd-run`` installed, the usual cgroup v2 host) a transient systemd scope per
        server with ``DevicePolicy=closed`` and ``DeviceAllow=`` for its own ``/dev/nvidiaN``,
        the shared NVIDIA nodes and its MIG capability nodes; otherwise advisory only, with
        a warning in the log and on the admin overview. ``"required"``: refuse to start
        servers when the kernel cannot enforce it; ``"off"``: environment variables only.
        """,
    ).tag(config=True)

    @validate("gpu_isolation")
    def _check_isolation(self, proposal):
        if proposal["value"] not in ("auto", "required", "off"):
            raise TraitError(f"gpu_isolation must be 'auto', 'required' or 'off', not {proposal['value']!r}")
        return proposal["value"]

    fence_end_timeout = Float(
        30.0,
        help="""
        Seconds the hub keeps trying to end a server start's last processes when the server
        stops (or dies, or a notebook job ends): every process of the start, however it left
        its session or cleared its environment, is SIGKILLed at once (cgroup v1: frozen
        first, so that none can fork meanwhile; a systemd scope: ``cgroup.kill``), and again
        every second. Its GPUs are given back only once none is left. JupyterHub shows the
        server as stopping meanwhile. A process still there after this time (stuck in the
        kernel, e.g. inside a GPU driver call: it dies only when it comes back) keeps the
        start's GPUs out of service: held, and shown on the admin overview (``/hub/gpus``,
        ``/hub/api/gpus``) with the processes and why, until the hub finds them gone (see
        ``fence_retry_interval``); until then that server is refused a new start with a
        sentence saying so.
        """,
    ).tag(config=True)

    fence_retry_interval = Float(
        10.0,
        help="""
        Seconds between the hub's attempts to end what a stopped server or job left
        behind while its GPUs are out of service (see ``fence_end_timeout``); the GPUs go
        back to service at the first attempt that finds no process left.
        """,
    ).tag(config=True)

    @validate("fence_end_timeout", "fence_retry_interval")
    def _check_positive(self, proposal):
        if proposal["value"] <= 0:
            raise TraitError(f"{proposal['trait'].name} must be > 0 seconds, not {proposal['value']}")
        return proposal["value"]

    allow_root_servers = Bool(
        False,
        help="""
        Let servers run as root. By default they never do: gpu-local-simple, which runs
        every server as the hub's own user, refuses to start a hub that runs as root
        (a server as root can leave any fence, read the hub's database and open every
        GPU), and gpu-local refuses to start a server whose account is root. Set it only
        for a single-user machine or a throwaway demo; jupyter_server then also needs its
        own ``--allow-root`` in ``c.Spawner.args``.
        """,
    ).tag(config=True)

    gpu_job_runner = "gpuspawner.backends.local.jobs.LocalJobs"
    gpu_spawn_id: str = ""
    _fence_path: list | None = None  # the cgroups a start's process joins before it runs (cgroup v1)
    _scope_prefix: list[str] | None = None  # systemd-run words before the server's command
    _switches_user = True  # servers run as their user (the hub drops privileges for them)

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
        caches = self.hub_state.caches
        if caches.local_isolation is None:
            caches.local_isolation = detect()
        return caches.local_isolation

    def _fences(self) -> StartFence:
        """This hub's starts and their processes: cgroups or scopes where the kernel fences them, else marks."""
        mechanism = self._mechanism()

        def make() -> StartFence:
            kernel = {"cgroup-v1": DeviceFence, "systemd": ScopeFence}.get(mechanism)
            return StartFence(kernel(self.gpu_hub_id) if kernel else None, MarkedStarts(self.gpu_hub_id))

        fences = self.hub_state.caches.local_fences
        if mechanism not in fences:
            fences[mechanism] = make()
        return fences[mechanism]

    def get_env(self):
        env = super().get_env()
        env.update(visible_devices(self.gpu_uuids))
        env.update({HUB_VAR: self.gpu_hub_id, SERVER_VAR: self.gpu_owner, SPAWN_VAR: self.gpu_spawn_id})
        return self.passable_env(env)

    def passable_env(self, env: dict) -> dict:
        """``env`` with a ``PATH`` the server's account may walk (the hub's may name root's own folders)."""
        if self._switches_user and env.get("PATH"):
            uid, gids, _ = self._server_identity()
            env["PATH"] = passable_path(env["PATH"], uid, gids)
        return env

    # ------------------------------------------------------------ state

    def get_state(self) -> dict:
        state = super().get_state()
        if self.gpu_spawn_id:
            state["gpu_spawn"] = self.gpu_spawn_id
            state["port"] = self.port
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        if state.get("gpu_spawn"):
            self.gpu_spawn_id = state["gpu_spawn"]
            self.port = int(state.get("port") or self.port)
            self.hub_state.caches.local_starts[self.gpu_owner] = self.gpu_spawn_id

    gpus_outlive_state = True  # its kernels may outlive the server: GPUs freed once all are gone (poll, stop)

    def clear_state(self) -> None:
        super().clear_state()
        self.gpu_spawn_id = ""

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
        recorded = state.caches.local_starts
        found_pids = state.caches.local_pids
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
                state.caches.local_orphans.add(asyncio.ensure_future(self._end_orphan(start)))
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

    def _system_user(self) -> pwd.struct_passwd:
        """The account this user's servers run as (gpu-local: the system account of the same name)."""
        return pwd.getpwnam(self.user.name)

    def _server_identity(self) -> tuple[int, list[int], str]:
        """Who the server runs as: uid, groups, and a name for sentences."""
        if not self._switches_user:
            return os.geteuid(), os.getgroups(), "the hub's own user"
        entry = self._system_user()
        return entry.pw_uid, user_groups(entry), f"the account {entry.pw_name}"

    def _server_program(self) -> str:
        """The program a server start executes first (the shell of ``shell_cmd``, else ``cmd``'s)."""
        return (list(self.shell_cmd) or list(self.cmd) or ["jupyterhub-singleuser"])[0]

    def program_problem(self, uid: int, gids, who: str) -> str | None:
        """Why ``who`` (``uid`` in ``gids``) cannot execute the server's program and its interpreters."""
        program = self._server_program()
        for path, script in interpreters(program, os.environ.get("PATH")):
            where = unreachable(path, uid, gids, read=script)
            if where:
                via = "" if str(path) == program else f" (it runs {path})"
                return (f"servers run as {who}, which cannot run {program}{via}: {where}. Make the servers' "
                        "Python environment from an interpreter outside such a folder (scripts/setup makes .venv "
                        "from one every user may run), or point c.Spawner.cmd at one")
        return package_problem(uid, gids, who)

    def root_problem(self) -> str | None:
        """Why this server would run as root, or None."""
        if self.allow_root_servers or (self._switches_user is False and os.geteuid() != 0):
            return None
        if not self._switches_user:
            return ("gpu-local-simple runs every server as the hub's own user, which is root here: any user could "
                    "leave the GPU fence, read the hub's database and open every GPU. Use gpu-local (a system "
                    "account per user; with c.GPULocalProcessSpawner.create_system_users = True the hub makes "
                    "them), run the hub as an unprivileged user, or set "
                    "c.GPUSimpleLocalProcessSpawner.allow_root_servers = True to accept root servers")
        return None

    async def server_account_problem(self) -> str | None:
        """Why this server cannot run as whom it would (root, or a program it cannot execute), or None.

        Makes the account first where the hub makes them (gpu-local's ``create_system_users``).
        """
        problem = self.root_problem()
        if problem:
            return problem
        if getattr(self, "create_system_users", False):  # before an account is made for nothing
            problem = await asyncio.to_thread(self.program_problem, *ANYONE, "accounts the hub makes")
            if problem:
                return problem
        try:
            await self.ensure_account()
            uid, gids, who = self._server_identity()
        except (AccountError, KeyError) as e:
            return f"no system account to run {self.user.name}'s server as: {e}"
        if uid == 0 and not self.allow_root_servers:
            return (f"{who} is root, and servers never run as root (c.{type(self).__name__}.allow_root_servers "
                    "allows it)")
        return await asyncio.to_thread(self.program_problem, uid, gids, who)

    async def ensure_account(self) -> None:
        """Make the account this user's servers run as, where the hub makes them (gpu-local)."""

    @classmethod
    def gpu_startup_problems(cls, config) -> list[str]:
        """Why a hub with this spawner and ``config`` could start no server: sentences for the hub's start.

        Called by :func:`gpuspawner.hub.setup.configure` while the hub loads its configuration.
        """
        probe = cls(config=config)  # the settings only: no user
        return [p for p in (probe.root_problem(), *probe.startup_problems()) if p]

    def startup_problems(self) -> list[str]:
        return []

    def make_preexec_fn(self, name):
        if self._switches_user:
            name = self._system_user().pw_name  # the hub user's account (made by the hub, or their own)
        if self._scope_prefix is not None and self._switches_user:
            return groups_and_home(name)  # systemd-run sets the user and group
        inner = super().make_preexec_fn(name)
        path = self._fence_path
        if path is None:
            return inner

        def preexec():
            DeviceFence.join(path)  # still root: join (devices and freezer) before dropping privileges
            if inner is not None:
                inner()

        return preexec

    # ------------------------------------------------------------ lifecycle

    async def start(self):
        await self.ensure_reconciled()
        left = self.hub_state.out_of_service.of(self.gpu_owner)
        if left:
            raise user_error(409, (
                "This server cannot start yet: processes of its last start are still running and would not "
                f"die ({left[0].reason}). It can start again once they are gone; an administrator sees them "
                "on the GPU overview."))
        self.gpu_spawn_id = spawn = uuidlib.uuid4().hex
        if self.port == 0:
            self.port = random_port()  # chosen now, so that the saved state has it
        try:
            return await super().start()
        except BaseException:
            await asyncio.to_thread(self._fences().remove, spawn)  # no process was started in it
            raise

    async def poll(self):
        await self.ensure_reconciled()
        spawn = self.gpu_spawn_id
        if not self.pid and spawn:
            # the old hub died between starting the process and saving its pid
            pid = self.hub_state.caches.local_pids.get(self.gpu_owner)
            if pid:
                self.pid = pid
        status = await super().poll()
        if status is not None and spawn:
            await self._end_start(spawn)  # the server is gone: so must be all it left behind
        return status

    async def get_url(self):
        """Where the server listens: its saved port (the database may not have it after a crash)."""
        url = await super().get_url()
        if self.pid and self.gpu_spawn_id and self.server is not None:
            host = self.ip or "127.0.0.1"
            return f"http://{host}:{self.port}{self.server.base_url}"
        return url

    async def stop(self, now: bool = False):
        spawn = self.gpu_spawn_id
        # LocalProcessSpawner's, named: the mixin's (next in the MRO) would free the GPUs while kernels still run
        await LocalProcessSpawner.stop(self, now=now)
        await self._end_start(spawn)


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


class _InFence:
    """Between the GPU mixin and JupyterHub's spawner: the account and fence of a start, made once
    its GPUs are placed and before JupyterHub builds the command (which a systemd scope's
    ``systemd-run`` words go before, ahead of any ``shell_cmd``)."""

    async def start(self):
        # once its GPUs are placed (a refusal comes first, and makes no account): who it runs as
        problem = await self.server_account_problem()
        if problem:
            self.log.error("%s: %s", self._log_name, problem)
            raise user_error(503, f"This hub cannot start your server: {problem}. Ask an admin.")
        self._create_fence()
        prefix = (self._scope_prefix or []) + self._pin_words()
        if not prefix:
            return await super().start()
        cmd, shell_cmd = self.cmd, self.shell_cmd
        if shell_cmd:
            self.shell_cmd = prefix + list(shell_cmd)
        else:
            self.cmd = prefix + list(cmd)
        try:
            return await super().start()
        finally:
            self.cmd, self.shell_cmd = cmd, shell_cmd


    def _pin_words(self) -> list[str]:
        """``taskset -c CPUS`` for the CPUs next to the GPUs (``pin_cpus``), or nothing; logs why."""
        if not self.pin_cpus or not self.gpu_allocation:
            return []
        binding = cpu_binding(self.gpu_allocation, host_cpus(), (), self.cpu_limit)
        taskset = shutil.which("taskset")
        if binding.cpus and taskset is None:
            self.log.warning("%s: not pinning CPUs: taskset (util-linux) is not installed", self._log_name)
            return []
        self.log.info("%s: %s", self._log_name, binding.reason)
        if not binding.cpus:
            return []
        self.gpu_event(f"CPUs {binding.cpuset_cpus}, next to the GPUs", 45)
        return [taskset, "-c", binding.cpuset_cpus]


class GPULocalProcessSpawner(_LocalGPUs, SystemAccounts, _InFence, LocalProcessSpawner):
    """LocalProcessSpawner whose servers see only the GPUs placed for them, each running as its user's account."""

    def _system_user(self) -> pwd.struct_passwd:
        return pwd.getpwnam(self.account())

    async def ensure_account(self) -> None:
        lock = self.hub_state.caches.local_account_locks.setdefault(self.account(), asyncio.Lock())
        async with lock:  # two servers of one user start at once: one useradd
            await SystemAccounts.ensure_account(self)

    def startup_problems(self) -> list[str]:
        if not self.create_system_users:
            return []  # the accounts are the site's: checked at each start
        if os.geteuid() != 0:
            return ["c.GPULocalProcessSpawner.create_system_users needs a hub that runs as root "
                    "(it makes accounts with useradd and starts servers as them)"]
        uid, gids = ANYONE
        homes = Path(self.system_user_home)
        made = next(p for p in (homes, *homes.parents) if p.exists())  # the rest is made (mode 0755) later
        home = unreachable(made, uid, gids)
        problems = []
        if home:
            problems.append(f"the accounts' homes are made in c.GPULocalProcessSpawner.system_user_home = "
                            f"{self.system_user_home}, which the accounts cannot reach: {home}")
        problems.append(self.program_problem(uid, gids, "accounts the hub makes"))
        return [p for p in problems if p]

    def user_env(self, env):
        entry = self._system_user()
        env["USER"] = entry.pw_name
        if entry.pw_dir:
            env["HOME"] = entry.pw_dir
        if entry.pw_shell:
            env["SHELL"] = entry.pw_shell
        return env


class _VforkSimpleLocalProcessSpawner(SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner that starts servers without a ``preexec_fn`` of its own.

    Its ``preexec_fn`` only makes the user's folder and changes into it, but any
    ``preexec_fn`` makes Popen fork the whole hub on the event loop (24 ms for a
    150 MB process, 20-90 ms each during a storm of spawns on 2 cores); without
    one Python uses vfork (0.1 ms). The folder is made here and given as ``cwd``.
    (Where a cgroup v1 device fence is on, joining its cgroup still needs a ``preexec_fn``.)
    """

    def make_preexec_fn(self, name):
        return None

    async def start(self):
        os.makedirs(self.home_dir, 0o755, exist_ok=True)
        self.popen_kwargs = {**self.popen_kwargs, "cwd": self.home_dir}
        return await super().start()


class GPUSimpleLocalProcessSpawner(_LocalGPUs, _InFence, _VforkSimpleLocalProcessSpawner):
    """The same, running every server as the hub's own user in a per-user folder.

    For demos with made-up user names (``gpu-local-simple``) on a hub that does not run as
    root (it refuses root unless ``allow_root_servers``): users share the hub's account, so
    they can read each other's files and the hub's. Use ``gpu-local`` (with
    ``create_system_users`` where users are not system accounts) to keep them apart.
    """

    _switches_user = False
