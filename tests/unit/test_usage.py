"""Usage accounting without a hub: the migration, the ledger observer, reasons, samples, sums."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session
from sqlalchemy.schema import CreateIndex, CreateTable

from gpuspawner.gpu import GPU
from gpuspawner.hub.usage import BadParameter, parse_time, shares, summarise, to_csv
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest
from gpuspawner.usage import SCHEMA_VERSION, Allocation, SchemaVersion, UsageRecorder, migrate

GPUS = [GPU(uuid=f"GPU-{i}", name="Tesla T4", index=i, host="node1") for i in range(4)]


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def info(uuid: str) -> dict:
    gpu = next(g for g in GPUS if g.uuid == uuid)
    return {"uuid": uuid, "name": gpu.name, "model": gpu.model, "host": gpu.host, "index": gpu.index}


@pytest.fixture
def session(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'hub.sqlite'}")
    with Session(engine) as s:
        yield s


def recorder_on(session, clock):
    ledger = Ledger(clock=clock)
    usage = UsageRecorder(info, clock=clock, groups=lambda s, user: ["team"] if user == "alice" else [])
    ledger.observe(usage.observe)
    usage.attach(session)
    return ledger, usage


def rows(session) -> list[Allocation]:
    session.expire_all()
    return list(session.query(Allocation).order_by(Allocation.id))


def test_migration_is_idempotent_and_versioned(session):
    assert migrate(session.connection()) == 0
    assert migrate(session.connection()) == SCHEMA_VERSION
    session.commit()
    names = set(inspect(session.get_bind()).get_table_names())
    assert {"gpuspawner_allocations", "gpuspawner_schema"} <= names
    assert session.execute(text("select version from gpuspawner_schema where name='usage'")).scalar() == 1


def test_ddl_compiles_for_postgresql():
    dialect = postgresql.dialect()
    ddl = str(CreateTable(Allocation.__table__).compile(dialect=dialect))
    assert "id SERIAL NOT NULL" in ddl and "started FLOAT NOT NULL" in ddl and "owner VARCHAR(255)" in ddl
    assert "PRIMARY KEY (name)" in str(CreateTable(SchemaVersion.__table__).compile(dialect=dialect))
    for index in Allocation.__table__.indexes:
        assert str(CreateIndex(index).compile(dialect=dialect)).startswith("CREATE INDEX ix_gpuspawner_allocations_")


def test_hold_and_release_make_one_row_with_the_reason_told(session):
    clock = Clock()
    ledger, usage = recorder_on(session, clock)
    ledger.reserve(GPUS, GPURequest("alice/", 2))
    clock.now = 1600.0
    assert usage.end_reason("alice/", "culled")
    ledger.release("alice/")
    [row] = rows(session)
    assert (row.owner, row.user, row.kind, row.groups, row.gpu_count, row.model, row.host) == (
        "alice/", "alice", "server", '["team"]', 2, "t4", "node1")
    assert (row.started, row.ended, row.end_reason) == (1000.0, 1600.0, "culled")
    # the next holding of the same owner ends "stopped": the reason was used up
    ledger.reserve(GPUS, GPURequest("alice/", 1))
    ledger.release("alice/")
    assert rows(session)[1].end_reason == "stopped"
    assert not usage.end_reason("alice/", "culled"), "nothing held: nothing to tell"
    with pytest.raises(ValueError, match="end reason must be one of"):
        usage.end_reason("alice/", "bored")


def test_jobs_are_recorded_as_jobs(session):
    ledger, _ = recorder_on(session, Clock())
    ledger.reserve(GPUS, GPURequest("bob/job/42", 1))
    assert rows(session)[0].kind == "job" and rows(session)[0].user == "bob"


def test_samples_count_busy_and_idle_once_and_skip_gaps(session):
    clock = Clock()
    ledger, usage = recorder_on(session, clock)
    ledger.reserve(GPUS, GPURequest("alice/", 2))
    # 1000 baseline; 1010 busy (10 s); 1020 idle (10 s); 1030 unknown; 1040 busy (10 s)
    usage.sample("alice/", [(1000, 50), (1010, 80), (1020, 1), (1030, None), (1040, 90)], threshold=5)
    usage.sample("alice/", [(1030, None), (1040, 90), (1400, 1)], threshold=5)  # overlap; 360 s gap: neither
    usage.sample("alice/", [(1410, 1)], threshold=5)  # idle 10 s
    [row] = rows(session)
    assert (row.busy_seconds, row.idle_seconds, row.last_sample) == (20.0, 20.0, 1410.0)
    assert usage.gpu_seconds == {("alice", "busy"): 40.0, ("alice", "idle"): 40.0}
    assert not usage.sample("nobody/", [(1, 1)], threshold=5)


def test_reconciliation_keeps_adopted_rows_and_ends_the_gone_as_crashed(session, tmp_path):
    clock = Clock()
    ledger, usage = recorder_on(session, clock)
    ledger.reserve(GPUS, GPURequest("alice/", 1))
    ledger.reserve(GPUS, GPURequest("bob/", 1))
    ledger.reserve(GPUS, GPURequest("carol/", 1))
    usage.sample("carol/", [(1000, 1), (1100, 1)], threshold=5)
    held = ledger.allocations()

    # a new hub process on the same database: spawners' saved state adopts alice and bob
    clock.now = 5000.0
    with Session(session.get_bind()) as again:
        ledger2, usage2 = recorder_on(again, clock)
        ledger2.adopt("alice/", held["alice/"])
        ledger2.adopt("bob/", held["bob/"])
        with usage2.reconciling(ledger2.allocations):  # the runtime shows only alice alive
            ledger2.release("alice/")
            ledger2.release("bob/")
            ledger2.adopt("alice/", held["alice/"])
    found = {r.owner: r for r in rows(session)}
    assert len(found) == 3
    assert (found["alice/"].ended, found["alice/"].started) == (None, 1000.0)
    assert (found["bob/"].end_reason, found["bob/"].ended) == ("crashed", 5000.0)
    # carol was never adopted: crashed at its last sample
    assert (found["carol/"].end_reason, found["carol/"].ended) == ("crashed", 1100.0)


def test_period_shares_and_sums_by_hand():
    # 2 GPUs held 0..3600, 1800 s busy and 900 s idle; the period is its second half
    a = Allocation(id=1, owner="a/", user="a", kind="server", groups='["x", "y"]', gpu_count=2, model="t4",
                   host="h", gpus="[]", started=0.0, ended=3600.0, end_reason="stopped",
                   busy_seconds=1800.0, idle_seconds=900.0)
    b = Allocation(id=2, owner="b/", user="b", kind="server", groups="[]", gpu_count=1, model="a100",
                   host="h", gpus="[]", started=3000.0, ended=None, busy_seconds=0.0, idle_seconds=0.0)
    parts = shares([a, b], since=1800.0, until=7200.0, now=4800.0)
    by_user = {r["key"]: r for r in summarise(parts, "user")}
    assert by_user["a"] == {"key": "a", "gpu_hours": 1.0, "busy_gpu_hours": 0.5, "idle_gpu_hours": 0.25,
                            "unsampled_gpu_hours": 0.25, "allocations": 1}
    assert by_user["b"]["gpu_hours"] == 0.5 and by_user["b"]["unsampled_gpu_hours"] == 0.5
    by_group = {r["key"]: r["gpu_hours"] for r in summarise(parts, "group")}
    assert by_group == {"x": 1.0, "y": 1.0, "(no group)": 0.5}
    assert shares([a], since=3600.0, until=7200.0, now=4800.0) == []
    csv_text = to_csv({"by": "model", "rows": summarise(parts, "model")})
    assert csv_text.splitlines()[0] == "key,gpu_hours,busy_gpu_hours,idle_gpu_hours,unsampled_gpu_hours,allocations"


def test_times_parse_or_say_why():
    assert parse_time("2026-11-01", "since") == 1793491200.0
    assert parse_time("2026-11-01T01:00:00+01:00", "since") == 1793491200.0
    assert parse_time("1793491200", "until") == 1793491200.0
    with pytest.raises(BadParameter, match="since='soon' is not a time: use ISO 8601"):
        parse_time("soon", "since")


# ---------------------------------------------------------------- events before the recorder is attached

_OWNERS = ("alice/", "bob/job/0123456789abcdef0123456789abcdef", "carol/gpu")
_REASONS = ("culled", "failed", "completed", "cancelled", "timed_out")


def _replay(steps, attach_at: int | None) -> list[tuple]:
    """Run ``steps`` (owner index, seconds later, reason index or None) on a fresh database, the
    recorder attached before step ``attach_at`` (None: after the last); the rows as tuples."""
    clock = Clock()
    engine = create_engine("sqlite://")
    with Session(engine) as session:
        ledger = Ledger(clock=clock)
        usage = UsageRecorder(info, clock=clock, groups=lambda s, user: [])
        ledger.observe(usage.observe)
        for i, (who, later, reason) in enumerate(steps):
            if i == attach_at:
                usage.attach(session)
            clock.now += later
            owner = _OWNERS[who]
            if owner in ledger.allocations():
                if reason is not None:
                    usage.end_reason(owner, _REASONS[reason])
                ledger.release(owner)
            else:
                ledger.reserve(GPUS, GPURequest(owner, 1))
        clock.now += 1000.0  # the hub is up long after: nothing may take this time as an end
        usage.attach(session)
        return [(r.owner, r.started, r.ended, r.end_reason) for r in rows(session)]


def test_events_before_attach_are_recorded_with_their_own_times_and_reasons():
    step = st.tuples(st.integers(0, len(_OWNERS) - 1), st.floats(0.0, 50.0, allow_nan=False),
                     st.one_of(st.none(), st.integers(0, len(_REASONS) - 1)))

    @settings(max_examples=60, deadline=None)
    @given(steps=st.lists(step, min_size=1, max_size=12), data=st.data())
    def check(steps, data):
        attach_at = data.draw(st.integers(0, len(steps)), label="attach before step")
        assert _replay(steps, attach_at) == _replay(steps, 0)

    check()


def test_a_job_released_before_attach_ends_when_it_was_released(session):
    clock = Clock()
    ledger = Ledger(clock=clock)
    usage = UsageRecorder(info, clock=clock, groups=lambda s, user: [])
    ledger.observe(usage.observe)
    ledger.reserve(GPUS, GPURequest("bob/job/42", 2))
    clock.now = 1002.6
    assert usage.end_reason("bob/job/42", "completed"), "a holding waiting to be written counts"
    ledger.release("bob/job/42")
    clock.now = 1022.7  # the usage page is read, or a server spawns, 20 s later
    usage.attach(session)
    [row] = rows(session)
    assert (row.started, row.ended, row.end_reason, row.gpu_count) == (1000.0, 1002.6, "completed", 2)
    assert not usage.end_reason("nobody/job/1", "failed")


def test_an_outcome_learnt_after_a_restart_replaces_crashed(session):
    clock = Clock()
    ledger, usage = recorder_on(session, clock)
    ledger.reserve(GPUS, GPURequest("bob/job/42", 1))
    clock.now = 5000.0
    with Session(session.get_bind()) as again:  # a new hub process: the job ended while it was down
        ledger2, usage2 = recorder_on(again, clock)
        with usage2.reconciling(ledger2.allocations):
            pass
        assert not usage2.end_reason("bob/job/42", "failed"), "a guess (a server's poll) keeps crashed"
        assert usage2.end_reason("bob/job/42", "completed", replaces_crashed=True)
        assert not usage2.end_reason("bob/job/42", "failed", replaces_crashed=True), "told once"
    [row] = rows(session)
    assert (row.ended, row.end_reason) == (5000.0, "completed")


def test_every_end_reason_has_words_for_the_usage_page():
    from gpuspawner.usage import END_REASON_WORDS, END_REASONS

    assert set(END_REASON_WORDS) == {None, *END_REASONS}
    for words, meaning in END_REASON_WORDS.values():
        assert words and meaning and "_" not in words  # a sentence, never the code
