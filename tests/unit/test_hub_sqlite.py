"""The hub's SQLite settings, through JupyterHub's own session factory."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from jupyterhub import orm

from gpuspawner.hub.sqlite import sqlite_db_kwargs


@pytest.mark.parametrize(("synchronous", "level"), [("NORMAL", 1), ("full", 2)])
def test_hub_database_opens_in_wal_mode_and_keeps_jupyterhubs_settings(tmp_path, synchronous, level):
    path = tmp_path / "jupyterhub.sqlite"
    db = orm.new_session_factory(f"sqlite:///{path}", **sqlite_db_kwargs(synchronous))()
    conn = db.connection().connection.dbapi_connection
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("PRAGMA synchronous").fetchone() == (level,)
    assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)  # JupyterHub's own connect hook still runs

    db.add(orm.User(name="ada"))
    db.commit()
    # the hub touches its session from worker threads too (check_same_thread=False is kept)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(db.query(orm.User).filter_by(name="ada").count()))
    worker.start()
    worker.join()
    assert seen == [1]
    db.close()
    db.get_bind().dispose()

    # committed rows are in the file for the next hub process, and the file stays in WAL mode
    with sqlite3.connect(path) as again:
        assert again.execute("SELECT name FROM users").fetchall() == [("ada",)]
        assert again.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_unknown_synchronous_level_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="NORMAL, FULL"):
        sqlite_db_kwargs("OFF")
