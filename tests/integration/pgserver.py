"""A private PostgreSQL server for tests: its own data folder, loopback port and socket, stopped by pid.

PostgreSQL refuses to run as root, so a root test run hands the data folder to an
unprivileged system user (``postgres``, else ``nobody``) and runs ``initdb`` and
``pg_ctl`` as that user through ``runuser``. The server listens on 127.0.0.1 on a
free port and on a unix socket in its own folder; clients log in over TCP with a
password (scram-sha-256), as a hub's ``db_url`` would.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from hub import free_port, pid_alive

SUPERUSER = "gpuspawner"


def find_bindir() -> Path | None:
    """The newest installed PostgreSQL's binaries (Debian: /usr/lib/postgresql/<version>/bin)."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    found = [d for d in found if (d / "pg_ctl").exists() and (d / "postgres").exists()]
    return max(found, key=lambda d: int(d.parent.name), default=None)


def _run_as() -> str | None:
    """The system user that runs the server when the tests run as root; None: run as ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL")


class PostgresServer:
    """``start()`` initialises and starts the server; ``stop()`` stops it and removes its folder."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = Path(bindir)
        self.version = self.bindir.parent.name
        self.user = _run_as()
        # not under pytest's tmp folder: that is private to root, and the server's user must reach its folder
        self.dir = Path(tempfile.mkdtemp(prefix="gpuspawner-pg-"))
        self.data = self.dir / "data"
        self.socket_dir = self.dir / "socket"
        self.log_path = self.dir / "postgres.log"
        self.port = free_port()
        self.password = secrets.token_hex(16)
        self.pid: int | None = None

    def _cmd(self, *args: str) -> list[str]:
        if self.user is None:
            return list(args)
        return ["runuser", "-u", self.user, "--", *args]

    def _run(self, *args: str, timeout: float = 120) -> None:
        done = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited with {done.returncode}:\n{done.stdout}{done.stderr}\n"
                               f"{self.log()}")

    def start(self) -> None:
        self.socket_dir.mkdir()
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            for path in (self.dir, self.socket_dir, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--pwfile", str(pwfile),
                  "--auth-host=scram-sha-256", "--auth-local=peer", "--encoding=UTF8", "--no-sync")
        pwfile.unlink()
        with open(self.data / "postgresql.conf", "a") as conf:  # later settings win
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.socket_dir}'\n"
                       "fsync = off\n"  # a test database: nothing to keep after a crash
                       "log_line_prefix = '%m [%p] %q%d '\n")  # the database name, for statements()
        self._run(str(self.bindir / "pg_ctl"), "start", "-D", str(self.data), "-l", str(self.log_path),
                  "-w", "-t", "60")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        """``pg_ctl stop -m fast`` (it signals the pid in postmaster.pid); SIGKILL that pid if it lingers."""
        try:
            if self.pid is not None and pid_alive(self.pid):
                try:
                    self._run(str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast",
                              "-w", "-t", "30", timeout=60)
                except (RuntimeError, subprocess.TimeoutExpired):
                    pass
                deadline = time.monotonic() + 10
                while pid_alive(self.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if pid_alive(self.pid):
                    os.kill(self.pid, signal.SIGKILL)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log(self, tail: int | None = 4000) -> str:
        """The server's log (its last ``tail`` characters; None: all of it)."""
        try:
            text = self.log_path.read_text(errors="replace")
            return text if tail is None else text[-tail:]
        except OSError:
            return ""

    def statements(self, database: str) -> list[str]:
        """The statements on ``database`` that the server logged (with ``log_statement`` set for it),
        each whole: a statement's further lines are the log's tab-indented continuation lines."""
        entries: list[str] = []
        for line in self.log(tail=None).splitlines():
            if line.startswith("\t") and entries:
                entries[-1] += "\n" + line[1:]
            else:
                entries.append(line)
        marker = f" {database} LOG:  statement: "
        return [entry.split(marker, 1)[1].strip() for entry in entries if marker in entry]

    # ------------------------------------------------------------ clients

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg2") -> str:
        """An SQLAlchemy URL for ``database`` over TCP on loopback, with the password."""
        return f"{driver}://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres"):
        """A psycopg2 connection (autocommit) to ``database``."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, password=self.password,
                                dbname=database)
        conn.autocommit = True
        return conn

    def create_database(self, name: str) -> str:
        """A new empty database; its SQLAlchemy URL."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)
