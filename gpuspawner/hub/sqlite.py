"""SQLite settings for a hub that must answer while many spawns commit.

JupyterHub commits its database on the event loop, about ten times per spawn
(server row, API token, OAuth client, start time, state, ...). SQLite's default
rollback journal makes every commit write and fsync a journal, write and fsync
the database and delete the journal: under a storm of 40 spawn requests on a
2-core machine those commits took 10 to 40 ms each, about 6 s of a 9 s storm,
during which the hub answered nothing (benchmarks/storm.py).

In write-ahead-log mode a commit appends to one file. With ``synchronous =
NORMAL`` it does not wait for the disk (the log is synced only at checkpoints,
about every 1,000 pages written): the database stays consistent after any crash, and a hub process
that crashes or is killed loses nothing it committed; only an operating-system
crash or power loss may undo the last commits before a checkpoint (the
servers of such a hub are gone then too). ``synchronous = FULL`` syncs the log at
every commit: nothing committed is ever lost, at one sync per commit instead of
several.

    c.JupyterHub.db_kwargs = sqlite_db_kwargs()   # in jupyterhub_config.py, for a sqlite:/// db_url

The database holds every user's tokens. Where servers run on the hub's host as
other accounts (gpu-local), it must be the hub's alone: :func:`private_database`
makes it (and SQLite's files beside it, which SQLite creates with the database's
mode) readable and writable by the hub's user only.

    private_database(state / "jupyterhub.sqlite")  # before the hub opens it
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

SYNCHRONOUS = ("NORMAL", "FULL")


def sqlite_db_kwargs(synchronous: str = "NORMAL") -> dict[str, Any]:
    """``JupyterHub.db_kwargs`` that open the hub's SQLite database in WAL mode.

    ``synchronous`` is ``"NORMAL"`` (commits never wait for the disk) or
    ``"FULL"`` (each commit waits for one sync of the log); see the module's text.
    """
    mode = synchronous.upper()
    if mode not in SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}, not {synchronous!r}")

    class WALConnection(sqlite3.Connection):
        """A connection that switches its database to WAL and sets ``synchronous`` when opened."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.execute("PRAGMA journal_mode=WAL")
            self.execute(f"PRAGMA synchronous={mode}")

    # JupyterHub's own default for SQLite is check_same_thread=False; db_kwargs replaces connect_args.
    return {"connect_args": {"check_same_thread": False, "factory": WALConnection}}


def private_database(path: str | os.PathLike) -> Path:
    """Make the SQLite database at ``path`` (and its journal, WAL and shared-memory files) mode 0600.

    Creates it empty where it does not exist yet (SQLite takes an empty file for a new database).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for file in (path, *(path.with_name(path.name + end) for end in ("-journal", "-wal", "-shm"))):
        if file.exists():
            file.chmod(0o600)
    return path
