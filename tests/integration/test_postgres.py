"""Usage accounting and notebook GPU jobs on a real PostgreSQL 15: the hub's ``db_url`` is PostgreSQL.

One private PostgreSQL server per test session (tests/integration/pgserver.py), one
fresh database per test. A real JupyterHub with gpu-local-simple on the stand-in NVML
keeps JupyterHub's tables and gpuspawner's (``gpuspawner_allocations``,
``gpuspawner_schema``, ``gpuspawner_jobs``) there. The test drives the hub through its
REST API, then reads PostgreSQL directly with psycopg2 to see the rows where they
should be, and restarts the hub to see them survive and the migration run again
without changing anything. The server logs every statement of the test's database
(``log_statement = all``), so the test sees the migration's queries and DDL as
PostgreSQL received them.
"""

from __future__ import annotations

import re
import secrets

import pytest

import fakenvml
from gpuspawner.simulation import simulated_config
from gpuspawner.usage import SCHEMA_VERSION
from hub import Hub
from jobnotebooks import GPU_REPORT, JOBS_CONFIG, PROFILES, holders, submit, wait_state, write
from needs import missing, module
from pgserver import PostgresServer, find_bindir

pytestmark = pytest.mark.integration

T4 = {"profile": "gpu", "gpus": 1, "gpu_model": "t4"}
A100 = {"profile": "gpu", "gpus": 1, "gpu_model": "a100-sxm4-80gb"}
OURS = ("gpuspawner_allocations", "gpuspawner_jobs", "gpuspawner_schema")
# gpuspawner.usage.migrate's query of the tables' version, as SQLAlchemy sends it to PostgreSQL
MIGRATION_READ = (r"^SELECT gpuspawner_schema\.version\s+FROM gpuspawner_schema\s+"
                  r"WHERE gpuspawner_schema\.name = 'usage'")


@pytest.fixture(scope="session")
def postgres():
    """The session's PostgreSQL server; skipped (failed in CI) without its binaries or psycopg2."""
    module("psycopg2", "needs psycopg2 (pip install -e .[test])")
    bindir = find_bindir()
    if bindir is None:
        missing("needs PostgreSQL's server binaries in /usr/lib/postgresql/<version>/bin (scripts/setup installs "
                "postgresql)")
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def database(postgres):
    """A fresh database of its own, every statement on it logged by the server."""
    name = "hub_" + secrets.token_hex(4)
    postgres.create_database(name)
    conn = postgres.connect()
    with conn.cursor() as cur:
        cur.execute(f'ALTER DATABASE "{name}" SET log_statement = \'all\'')
    conn.close()
    return name


@pytest.fixture
def pg_hub(tmp_path, fakenvml_libdir, postgres, database):
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, simulated_config(a100=2, t4=2))
    # the test configuration's SQLite db_url, replaced by the PostgreSQL database
    extra = JOBS_CONFIG + f"c.JupyterHub.db_url = {postgres.url(database)!r}\n"
    hub = Hub(tmp_path / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES, extra_config=extra)
    hub.start()
    try:
        yield hub
    finally:
        hub.close()


def query(postgres, database: str, sql: str, *args) -> list[tuple]:
    conn = postgres.connect(database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()
    finally:
        conn.close()


def allocations(hub: Hub) -> list[dict]:
    r = hub.api("GET", "/gpus/usage", params={"by": "allocation"})
    assert r.status_code == 200, r.text
    return r.json()["rows"]


def statements(postgres, database: str, pattern: str) -> list[str]:
    """The statements on ``database`` the server logged so far that match ``pattern``."""
    return [s for s in postgres.statements(database) if re.search(pattern, s)]


def test_usage_and_jobs_live_in_postgresql_and_survive_a_restart(pg_hub, postgres, database):
    hub = pg_hub
    hub.add_users("alice", "bob")

    # a server started and stopped: one allocation, ended "stopped"
    r = hub.spawn("alice", T4)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice")
    uuid = hub.server_env("alice")["CUDA_VISIBLE_DEVICES"]
    [held] = allocations(hub)
    assert (held["owner"], held["kind"], held["uuids"], held["ended"], held["end_reason"]) == (
        "alice/", "server", [uuid], None, None)
    hub.stop_server("alice")
    [alice] = allocations(hub)
    assert alice["id"] == held["id"] and alice["end_reason"] == "stopped" and alice["ended"]
    assert alice["model"] == "t4" and alice["gpu_count"] == 1 and alice["gpu_hours"] > 0
    by_user = hub.api("GET", "/gpus/usage").json()
    assert [(row["key"], row["allocations"]) for row in by_user["rows"]] == [("alice", 1)]

    # a notebook GPU job runs to completion; its record and its allocation are in PostgreSQL too
    write(hub.home("alice") / "report.ipynb", GPU_REPORT, parameters="seconds = 0")
    r = submit(hub, "alice", {**T4, "notebook": "report.ipynb", "parameters": {"seconds": 1}})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    done = wait_state(hub, "alice", job_id, ("completed", "failed", "cancelled", "timed_out"))
    assert done["state"] == "completed" and done["exit_code"] == 0, done
    job_gpu = done["gpus"][0]["uuid"]
    assert job_gpu not in holders(hub)
    job_alloc = next(a for a in allocations(hub) if a["owner"] == f"alice/job/{job_id}")
    assert job_alloc["kind"] == "job" and job_alloc["uuids"] == [job_gpu] and job_alloc["end_reason"] == "completed"

    # bob's server stays up across the hub's restart
    assert hub.spawn("bob", A100).status_code in (201, 202)
    hub.wait_ready("bob")
    bob_open = next(a for a in allocations(hub) if a["owner"] == "bob/")
    assert bob_open["ended"] is None

    # PostgreSQL itself holds the rows (and JupyterHub's own tables); no SQLite file was made
    tables = {t for (t,) in query(postgres, database, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert set(OURS) | {"users", "spawners"} <= tables
    assert not list(hub.dir.glob("*.sqlite")), list(hub.dir.iterdir())
    rows = query(postgres, database, 'SELECT id, owner, "user", kind, end_reason, gpus FROM gpuspawner_allocations '
                 "ORDER BY id")
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        (alice["id"], "alice/", "alice", "server", "stopped"),
        (job_alloc["id"], f"alice/job/{job_id}", "alice", "job", "completed"),
        (bob_open["id"], "bob/", "bob", "server", None)]
    assert uuid in rows[0][5] and job_gpu in rows[1][5]
    assert query(postgres, database, 'SELECT "user", state, exit_code FROM gpuspawner_jobs WHERE id = %s',
                 job_id) == [("alice", "completed", 0)]
    assert query(postgres, database, "SELECT name, version FROM gpuspawner_schema") == [("usage", SCHEMA_VERSION)]
    # the migration's read of the version: once, at this hub process's first use of the usage tables
    assert len(statements(postgres, database, MIGRATION_READ)) == 1

    hub.restart()

    # the records survive, bob's allocation is adopted (same row), and the jobs list still has the job
    after = {a["id"]: a for a in allocations(hub)}
    assert after[alice["id"]]["end_reason"] == "stopped" and after[alice["id"]]["ended"] == alice["ended"]
    assert after[job_alloc["id"]]["owner"] == f"alice/job/{job_id}"
    assert after[bob_open["id"]]["ended"] is None and after[bob_open["id"]]["started"] == bob_open["started"]
    jobs = hub.api("GET", "/users/alice/gpu-jobs").json()["jobs"]
    assert [(j["id"], j["state"]) for j in jobs] == [(job_id, "completed")]
    hub.stop_server("bob")
    bob = next(a for a in allocations(hub) if a["owner"] == "bob/")
    assert bob["id"] == bob_open["id"] and bob["end_reason"] == "stopped"

    # the migration ran again at the restart (it read the schema version once more) and changed nothing:
    # each of gpuspawner's tables was created once, ever, and the version row is the same one
    assert len(statements(postgres, database, MIGRATION_READ)) == 2
    for table in OURS:
        assert len(statements(postgres, database, rf"^CREATE TABLE {table}\b")) == 1, table
    assert len(statements(postgres, database, r"^INSERT INTO gpuspawner_schema\b")) == 1
    assert not statements(postgres, database, r"^(UPDATE|DELETE FROM) gpuspawner_schema\b|^(DROP|ALTER) TABLE")
    assert query(postgres, database, "SELECT name, version FROM gpuspawner_schema") == [("usage", SCHEMA_VERSION)]
    assert query(postgres, database, "SELECT count(*), count(ended) FROM gpuspawner_allocations") == [(3, 3)]
