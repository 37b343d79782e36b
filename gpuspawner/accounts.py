"""Who a local server runs as: one system account per hub user, and whether it can run the server at all.

A server that runs as the hub's own user (root, in the runnable default) can
leave any fence, read the hub's database and open every GPU. gpu-local runs each
user's servers as that user's system account; with ``create_system_users`` the
hub makes the account on the user's first start, so a hub whose users are not
system accounts (dummy logins, OAuth) still never runs a server as root:

- the account is ``<prefix><hub name>``, e.g. ``jupyter-ada`` (:func:`account_name`:
  a name that is not a plain system name is escaped and given a hash, so two hub
  users never share an account and none is ever an existing system account such as
  ``root``);
- ``useradd`` makes it with a group of its own, no password (nobody logs in as it),
  a home of its own (mode 0700) and a comment that marks it as the hub's;
  an existing account without that mark is never used.

An account only runs a server whose program it may execute: a virtualenv made
from an interpreter under ``/root`` (pyenv's, say) fails with EACCES for every
other user. :func:`unreachable` says where such a path stops, checked with the
permission bits as the kernel would for that user.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pwd
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

from traitlets import Bool, TraitError, Unicode, validate
from traitlets.config import Configurable

#: The start of the comment (GECOS) of every account the hub makes.
MARK = "gpuspawner account of hub user"
PLAIN = re.compile(r"[a-z][a-z0-9_]*")
PREFIX = re.compile(r"[a-z_][a-z0-9_-]*")
NAME_MAX = 32  # useradd's longest user name
HASH = 8
#: A uid and groups that own no file: as an account the hub has not made yet (only "other" bits apply).
ANYONE: tuple[int, tuple[int, ...]] = (-1, ())

__all__ = [
    "ANYONE", "MARK", "AccountError", "SystemAccounts", "account_name", "check_prefix", "ensure_account",
    "interpreters", "package_problem", "passable_path", "unreachable", "user_groups",
]


class AccountError(Exception):
    """An account cannot be used or made; the message says why and what to do."""


def check_prefix(prefix: str) -> str | None:
    """Why ``prefix`` cannot start account names, or None when it can."""
    if not prefix:
        return "it is empty: every account name must start with a prefix of its own (e.g. 'jupyter-')"
    if not PREFIX.fullmatch(prefix):
        return f"{prefix!r} must be lowercase letters, digits, '_' or '-', starting with a letter or '_'"
    if len(prefix) > NAME_MAX - HASH - 2:
        return f"{prefix!r} is longer than {NAME_MAX - HASH - 2} characters"
    return None


def account_name(hub_name: str, prefix: str) -> str:
    """The system account of hub user ``hub_name``: ``<prefix><hub_name>`` where that is a plain name.

    Otherwise (characters a system name may not hold, or too long): ``<prefix><what is
    left, with '_' for the rest>-<8 hex digits of its SHA-256>``. A plain name never holds
    a ``-`` after the prefix and an escaped one always does, so no two hub users get one account.
    """
    if PLAIN.fullmatch(hub_name) and len(prefix) + len(hub_name) <= NAME_MAX:
        return prefix + hub_name
    digest = hashlib.sha256(hub_name.encode()).hexdigest()[:HASH]
    readable = re.sub(r"[^a-z0-9_]", "_", hub_name.lower())[: NAME_MAX - len(prefix) - HASH - 1]
    return f"{prefix}{readable}-{digest}"


def _ours(entry: pwd.struct_passwd, hub_name: str) -> bool:
    return entry.pw_gecos == f"{MARK} {hub_name}"


def ensure_account(hub_name: str, prefix: str, homes: Path, useradd: str = "useradd") -> pwd.struct_passwd:
    """The account of hub user ``hub_name``, made now if it does not exist (blocking: call it in a thread).

    :class:`AccountError` where an account of that name exists but is not the hub's
    (never run a server as someone else), or ``useradd`` refuses.
    """
    name = account_name(hub_name, prefix)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = None
    if entry is None:
        home = Path(homes) / name
        Path(homes).mkdir(mode=0o755, parents=True, exist_ok=True)
        cmd = [shutil.which(useradd) or useradd, "--create-home", "--home-dir", str(home), "--shell", "/bin/bash",
               "--user-group", "--comment", f"{MARK} {hub_name}", name]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise AccountError(f"could not make the system account {name} for {hub_name}: "
                               f"{done.stderr.strip() or f'useradd exited with {done.returncode}'}") from None
        if _ours(entry, hub_name) and done.returncode == 0:
            # useradd follows login.defs' UMASK (often 022), and leaves a folder that was there already
            # as it was: the home is the account's, and its alone
            os.chown(home, entry.pw_uid, entry.pw_gid)
            os.chmod(home, 0o700)
    if not _ours(entry, hub_name):
        raise AccountError(f"the system account {name} exists but this hub did not make it (its comment is not "
                           f"'{MARK} {hub_name}'); rename or remove it, or set another account prefix")
    if entry.pw_uid == 0:
        raise AccountError(f"the system account {name} has uid 0 (root); servers never run as root")
    return entry


def _can(mode: int, owner: int, group: int, uid: int, gids: frozenset[int], bit: int) -> bool:
    """Whether ``uid`` (in ``gids``) has permission ``bit`` (4 read, 1 execute) on a file of ``mode``."""
    if uid == 0:
        return bit != 1 or stat.S_ISDIR(mode) or bool(mode & 0o111)
    if uid == owner:
        return bool(mode & (bit << 6))
    if group in gids:
        return bool(mode & (bit << 3))
    return bool(mode & bit)


def unreachable(path: str | Path, uid: int, gids: Iterable[int], read: bool = False) -> str | None:
    """Where ``uid`` (in groups ``gids``) is stopped executing ``path``; None when it may.

    Walks the path as the kernel resolves it, symbolic links included: every folder on
    the way must let the user through (x), and the file itself be executable (and, with
    ``read``, readable: a script is read by its interpreter). The answer is a phrase
    such as ``"/root (mode 0700, owner root) may not be entered"``.
    """
    groups = frozenset(gids)
    pending = list(Path(os.path.abspath(path)).parts[1:])
    current = Path("/")
    seen = 0
    while pending:
        part = pending.pop(0)
        info = current.stat()
        if not _can(info.st_mode, info.st_uid, info.st_gid, uid, groups, 1):
            return f"{current} (mode {stat.S_IMODE(info.st_mode):04o}, owner {_owner(info.st_uid)}) may not be entered"
        step = current / part
        try:
            here = step.lstat()
        except FileNotFoundError:
            return f"{step} does not exist"
        if stat.S_ISLNK(here.st_mode):
            seen += 1
            if seen > 40:
                return f"{step}: too many symbolic links"
            target = os.readlink(step)
            pending = list(Path(target).parts[1:] if os.path.isabs(target) else Path(target).parts) + pending
            if os.path.isabs(target):
                current = Path("/")
            continue
        current = Path(os.path.normpath(step))
    info = current.stat()
    if not _can(info.st_mode, info.st_uid, info.st_gid, uid, groups, 1):
        return f"{current} (mode {stat.S_IMODE(info.st_mode):04o}) is not executable for it"
    if read and not _can(info.st_mode, info.st_uid, info.st_gid, uid, groups, 4):
        return f"{current} (mode {stat.S_IMODE(info.st_mode):04o}) is not readable for it"
    return None


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def interpreters(program: str | Path, search_path: str | None = None) -> list[tuple[Path, bool]]:
    """The files running ``program`` executes: itself, then the interpreters of its ``#!`` lines
    (and a virtualenv's base interpreter folder); each with whether it is read as a script."""
    found = shutil.which(str(program), path=search_path) if os.sep not in str(program) else str(program)
    if found is None:
        return [(Path(program), False)]
    chain: list[tuple[Path, bool]] = []
    current = Path(found)
    for _ in range(4):
        try:
            with open(current, "rb") as f:
                head = f.readline(256)
        except OSError:
            head = b""
        script = head.startswith(b"#!")
        chain.append((current, script))
        if not script:
            break
        words = head[2:].decode(errors="replace").split()
        if not words:
            break
        interpreter = words[0]
        if Path(interpreter).name == "env" and len(words) > 1:  # "#!/usr/bin/env python3"
            interpreter = shutil.which(words[1], path=search_path) or words[1]
        current = Path(interpreter)
    last = chain[-1][0]
    config = Path(os.path.abspath(last)).parent.parent / "pyvenv.cfg"  # a virtualenv's python: its base
    try:
        home = next((line.split("=", 1)[1].strip() for line in config.read_text().splitlines()
                     if line.split("=", 1)[0].strip() == "home"), None)
    except OSError:
        home = None
    if home:
        chain.append((Path(home), False))
    return chain


def package_problem(uid: int, gids: Iterable[int], who: str, package: str | Path | None = None) -> str | None:
    """Why ``who`` cannot import gpuspawner from where this hub has it (its servers load their GPU monitor
    from it): the folder Python finds the package in must be listed (r) and entered (x) by ``uid``."""
    package = Path(package or Path(__file__).parent)
    for folder, read in ((package.parent, True), (package, True)):
        where = unreachable(folder, uid, gids, read=read)
        if where:
            return (f"servers run as {who}, which cannot import gpuspawner from {package.parent}: {where}. "
                    "Let every user read and enter that folder (chmod o+rx; scripts/setup does it for a "
                    "checkout), or install gpuspawner where every user may read it")
    return None


def passable_path(value: str, uid: int, gids: Iterable[int]) -> str:
    """``value`` (a ``PATH``) without the folders ``uid`` may not enter (root's ``~/.pyenv/shims``, say):
    a program looked up there fails with EACCES instead of "not found", and tools that look for an
    optional program (``conda``) do not expect that."""
    gids = list(gids)
    kept = [folder for folder in value.split(os.pathsep) if folder and unreachable(folder, uid, gids) is None]
    return os.pathsep.join(kept)


def user_groups(entry: pwd.struct_passwd) -> list[int]:
    """The groups a process of account ``entry`` has."""
    return os.getgrouplist(entry.pw_name, entry.pw_gid)


class SystemAccounts(Configurable):
    """The settings of a spawner whose servers may run as system accounts the hub makes (gpu-local, gpu-slurm)."""

    create_system_users = Bool(
        False,
        help="""
        Make a system account for each hub user on their first start (``useradd``; the hub
        must run as root), named ``<system_user_prefix><hub user name>`` (a name that is not
        a plain system user name is escaped and given a hash), with a group of its own, no
        password, and a home of its own (mode 0700) under ``system_user_home``. Servers and
        notebook jobs run as that account. An existing account of that name that the hub
        did not make (its comment is not "gpuspawner account of hub user NAME") is never
        used: the start is refused with a sentence. Without this setting, a hub user's
        servers run as the system account of the same name, which must exist. gpu-local with
        ``gpuspawner.hub.setup.configure(c)`` stops at hub start when the hub is not root or
        the accounts could not reach ``system_user_home`` or run the servers' Python.
        On gpu-slurm the account is batchspawner's ``{username}`` (``exec_prefix`` submits as
        it), made on the hub host, and must exist on the cluster's nodes too.
        """,
    ).tag(config=True)

    system_user_prefix = Unicode(
        "jupyter-",
        help="""With ``create_system_users``: how every account the hub makes begins, so that none is
        ever an existing system account: lowercase letters, digits, '_' and '-', starting with a
        letter or '_', at most 22 characters (a refusal at hub start says which rule it breaks).""",
    ).tag(config=True)

    system_user_home = Unicode(
        "/home",
        help="""With ``create_system_users``: the folder the accounts' homes are made in
        (``<folder>/<account>``, mode 0700; the folder itself is made, mode 0755, where it is
        missing); every account must be able to enter it.""",
    ).tag(config=True)

    @validate("system_user_prefix")
    def _check_prefix(self, proposal):
        problem = check_prefix(proposal["value"])
        if problem:
            raise TraitError(f"system_user_prefix: {problem}")
        return proposal["value"]

    def account(self) -> str:
        """The name of the system account this user's servers run as."""
        if self.create_system_users:
            return account_name(self.user.name, self.system_user_prefix)
        return self.user.name

    def account_home(self) -> str:
        """Where that account's home is (or will be, once the hub made the account)."""
        if self.create_system_users:
            return str(Path(self.system_user_home) / self.account())
        return pwd.getpwnam(self.account()).pw_dir

    async def ensure_account(self) -> None:
        """Make this user's account now, where the hub makes them and it does not exist yet."""
        if not self.create_system_users:
            return
        await asyncio.to_thread(ensure_account, self.user.name, self.system_user_prefix, Path(self.system_user_home))
