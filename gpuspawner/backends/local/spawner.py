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
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from jupyterhub.utils import random_port
from traitlets import Bool, Float, TraitError, Unicode, validate

from ...accounts import ANYONE, SystemAccounts, unreachable
from ...cpus import cpu_binding, host_cpus
from ...gpu import nvidia_visible_devices
from ...marks import marks
from ..base import GPUSpawnerMixin, user_error
from .accounts import LocalAccounts
from .caches import LocalCaches
from .starts import LocalStarts


def visible_devices(uuids: tuple[str, ...]) -> dict[str, str]:
    """The environment that confines CUDA (and GPU tools) to the given GPUs.

    CUDA accepts GPU UUIDs in CUDA_VISIBLE_DEVICES; an empty value hides every
    GPU. NVIDIA_VISIBLE_DEVICES carries the same set for tools that read it
    (the container runtime's convention, and gpuspawner's monitor); ``void``
    when there is none.
    """
    return {"CUDA_VISIBLE_DEVICES": ",".join(uuids), "NVIDIA_VISIBLE_DEVICES": nvidia_visible_devices(uuids)}


class _LocalGPUs(LocalStarts, LocalAccounts, GPUSpawnerMixin):
    """What both local spawners add to JupyterHub's local process spawners: the traits, the
    environment, the saved state and the lifecycle here; a start's fence, ending and the
    reconciliation in :class:`~.starts.LocalStarts`; whom it runs as in :class:`~.accounts.LocalAccounts`."""

    honours_images = False  # servers run on this host, from no image: a profile's ``images`` is refused

    gpu_isolation = Unicode(
        "auto",
        help="""
        How a server (and a notebook GPU job) is kept off other users' GPUs beyond
        ``CUDA_VISIBLE_DEVICES``. ``"auto"`` (default): the kernel refuses every GPU device
        node but the start's own, where the host lets the hub do it: a device cgroup per
        start where a cgroup v1 ``devices`` controller is mounted and the hub may write to
        it, else, where systemd is PID 1, the hub runs as root and ``systemd-run`` is
        installed (the usual cgroup v2 host), a transient systemd scope per start with
        ``DevicePolicy=closed`` and ``DeviceAllow=`` for its own ``/dev/nvidiaN``, the shared
        NVIDIA nodes and its MIG capability nodes; otherwise advisory only, with a warning
        in the log and on the admin overview. A GPU whose device number is not known (NVML
        gave none; ``minor_number`` missing in ``static_gpus``) is not fenced either (logged).
        ``"required"``: such a start is refused with HTTP 503 saying why (the hub itself
        starts). ``"off"``: environment variables only (logged at hub start). Any other
        value is refused at hub start.
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
        sentence saying so. A finite number above 0.
        """,
    ).tag(config=True)

    fence_retry_interval = Float(
        10.0,
        help="""
        Seconds between the hub's attempts to end what a stopped server or job left
        behind while its GPUs are out of service (see ``fence_end_timeout``); the GPUs go
        back to service at the first attempt that finds no process left. A finite number
        above 0.
        """,
    ).tag(config=True)

    @validate("fence_end_timeout", "fence_retry_interval")
    def _check_fence_seconds(self, proposal):  # not _check_positive: that name would hide the queue's validator
        if not 0 < proposal["value"] < float("inf"):
            raise TraitError(f"{proposal['trait'].name} must be a finite number of seconds > 0, "
                             f"not {proposal['value']}")
        return proposal["value"]

    allow_root_servers = Bool(
        False,
        help="""
        Let servers run as root. By default they never do: gpu-local-simple, which runs
        every server as the hub's own user, refuses every start on a hub that runs as root
        (a server as root can leave any fence, read the hub's database and open every
        GPU), and with ``gpuspawner.hub.setup.configure(c)`` such a hub stops at start
        saying so; gpu-local refuses to start a server whose account is root. Set it only
        for a single-user machine or a throwaway demo; jupyter_server then also needs its
        own ``--allow-root`` in ``c.Spawner.args``.
        """,
    ).tag(config=True)

    gpu_job_runner = "gpuspawner.backends.local.jobs.LocalJobs"
    gpu_spawn_id: str = ""

    def get_env(self):
        env = super().get_env()
        env.update(visible_devices(self.gpu_uuids))
        env.update(marks(self.gpu_hub_id, self.gpu_owner, self.gpu_spawn_id))
        return self.passable_env(env)

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
            self.hub_state.cache(LocalCaches).local_starts[self.gpu_owner] = self.gpu_spawn_id

    gpus_outlive_state = True  # its kernels may outlive the server: GPUs freed once all are gone (poll, stop)

    def clear_state(self) -> None:
        super().clear_state()
        self.gpu_spawn_id = ""

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
            pid = self.hub_state.cache(LocalCaches).local_pids.get(self.gpu_owner)
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
        lock = self.hub_state.cache(LocalCaches).local_account_locks.setdefault(self.account(), asyncio.Lock())
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
