"""Who a gpu-local server (or notebook job) runs as: its account, what that account may run, and
how the process becomes it (:class:`LocalAccounts`, a mixin of both local spawners).

gpu-local runs each user's servers as a system account (the site's, or one the hub makes:
:class:`gpuspawner.accounts.SystemAccounts`); gpu-local-simple runs them all as the hub's own
user. Neither ever runs one as root unless ``allow_root_servers`` (defined on the spawner) says so.
"""

from __future__ import annotations

import asyncio
import os
import pwd

from ...accounts import ANYONE, AccountError, interpreters, package_problem, passable_path, unreachable, user_groups
from .fence import DeviceFence


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


class LocalAccounts:
    """The account side of a local spawner."""

    _switches_user = True  # servers run as their user (the hub drops privileges for them)

    def passable_env(self, env: dict) -> dict:
        """``env`` with a ``PATH`` the server's account may walk (the hub's may name root's own folders)."""
        if self._switches_user and env.get("PATH"):
            uid, gids, _ = self._server_identity()
            env["PATH"] = passable_path(env["PATH"], uid, gids)
        return env

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
    # ------------------------------------------------------------ for the job runner

    def job_account(self) -> tuple[str, str]:
        """(account name, home folder) that this user's notebook jobs run as: whom their servers run as."""
        if self._switches_user:
            entry = self._system_user()
            return entry.pw_name, entry.pw_dir
        return self.user.name, self.home_dir

    def job_files_root(self, make: bool = False) -> str:
        """The user's files, where a job's notebook path starts: the folder their server starts in
        (``notebook_dir`` under the account's home, else the home); with ``make``, made where servers
        run as the hub (gpu-local-simple makes a user's folder at their first start)."""
        _name, home = self.job_account()
        root = home
        if self.notebook_dir:
            root = os.path.join(home, self.format_string(self.notebook_dir).replace("~", home, 1))
        if make and not self._switches_user:
            os.makedirs(root, 0o755, exist_ok=True)
        return root

    def job_preexec_fn(self):
        """What a job's process runs before its command, as a server's does (become the account, join the
        device cgroup), once :meth:`~.starts.LocalStarts.job_command_prefix` made its fence; None: nothing."""
        if self._switches_user or self._fence_path:
            return self.make_preexec_fn(self.user.name)
        return None
