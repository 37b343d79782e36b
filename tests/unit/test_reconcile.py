"""The ledger agrees with the cluster: the pure plan of one reconciliation pass, the record of
owners in flight, and the hub state's timer that runs passes again."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings, strategies as st
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.ledger import cluster_tokens
from gpuspawner.reconcile import Flights, Workload, plan
from gpuspawner.state import GPUHubSettings, HubState


def tokens(owner: str, n: int) -> tuple[str, ...]:
    return cluster_tokens(owner, {"slurm-gpu.a100": n})


def job(owner: str, job_id: str, n: int = 1, start: str = "") -> Workload:
    return Workload(job_id, owner, tokens(owner, n), start, f"Slurm job {job_id}")


def apply(held: dict[str, tuple[str, ...]], result) -> dict[str, tuple[str, ...]]:
    """The ledger after the plan (as the mixin applies it when nothing changed meanwhile)."""
    after = {owner: keys for owner, keys in held.items() if owner not in result.release}
    after.update(result.hold)
    return after


# ------------------------------------------------------------ examples


def test_a_charge_whose_job_is_gone_is_released_and_a_recorded_live_job_is_counted():
    held = {"ada/": tokens("ada/", 1), "bob/": tokens("bob/", 2)}
    recorded = {"ada/": {"11"}, "bob/": {"12"}, "cy/": {"13"}}
    result = plan(held, [job("ada/", "11"), job("cy/", "13", 2)], recorded, {}, adopt_orphans=False)
    assert result.release == ("bob/",)
    assert dict(result.hold) == {"cy/": tokens("cy/", 2)}
    assert [w.id for w in result.adopted] == ["13"]
    assert result.orphans == ()


def test_a_job_no_record_names_is_an_orphan_cancelled_or_adopted():
    live = [job("ghost/", "20", 1), job("ada/", "21")]
    cancelled = plan({}, live, {"ada/": {"99"}}, {}, adopt_orphans=False)
    assert [w.id for w in cancelled.orphans] == ["21", "20"]
    assert dict(cancelled.hold) == {}
    adopted = plan({}, live, {"ada/": {"99"}}, {}, adopt_orphans=True)
    assert [w.id for w in adopted.orphans] == ["21", "20"]
    assert dict(adopted.hold) == {"ada/": tokens("ada/", 1), "ghost/": tokens("ghost/", 1)}


def test_a_start_in_flight_keeps_its_charge_and_its_job_not_yet_saved():
    # sbatch answered, the id is not in the database yet: the job is the start's, not an orphan
    held = {"ada/": tokens("ada/", 1)}
    result = plan(held, [job("ada/", "30", start="m1")], {}, {"ada/": {"m1"}}, adopt_orphans=False)
    assert result.orphans == () and result.release == () and dict(result.hold) == {}
    # submitted, not yet listed by squeue: the charge stays
    assert plan(held, [], {}, {"ada/": {"m1"}}, adopt_orphans=False).release == ()
    # a job of an earlier start of the same server (another mark) is an orphan even then
    result = plan(held, [job("ada/", "29", start="m0"), job("ada/", "30", start="m1")], {}, {"ada/": {"m1"}},
                  adopt_orphans=False)
    assert [w.id for w in result.orphans] == ["29"]


def test_a_workload_that_holds_nothing_yet_leaves_the_charge_as_it_is():
    # a Swarm task not placed yet: the hub's own pick stays counted
    held = {"ada/": ("GPU-1",)}
    result = plan(held, [Workload("svc", "ada/", ())], None, {}, adopt_orphans=True)
    assert result.release == () and dict(result.hold) == {}


def test_without_records_every_live_workload_is_its_owners():
    held = {"ada/": ("GPU-1",), "bob/": ("GPU-2",)}
    live = [Workload("c1", "ada/", ("GPU-1",)), Workload("c3", "cy/", ("GPU-3",)), Workload("c4", "bob/", ("GPU-4",))]
    result = plan(held, live, None, {}, adopt_orphans=False)
    assert result.orphans == () and result.release == ()
    assert dict(result.hold) == {"cy/": ("GPU-3",), "bob/": ("GPU-4",)}
    assert [w.id for w in result.adopted] == ["c3"]


# ------------------------------------------------------------ properties

OWNERS = ["ada/", "bob/", "cy/", "ada/big", "ada/job/7f"]
owner = st.sampled_from(OWNERS)
marks = st.sampled_from(["", "m1", "m2"])
workloads = st.lists(st.builds(
    lambda o, i, n, m: Workload(str(i), o, tokens(o, n), m), owner, st.integers(0, 6), st.integers(0, 2), marks),
    max_size=8, unique_by=lambda w: w.id)
helds = st.dictionaries(owner, st.integers(1, 3).map(lambda n: n), max_size=5)


@settings(max_examples=300, deadline=None)
@given(helds, workloads, st.one_of(st.none(), st.dictionaries(owner, st.sets(st.integers(0, 6).map(str)))),
       st.dictionaries(owner, st.sets(marks)), st.booleans())
def test_after_a_pass_every_charge_has_a_live_workload_and_every_live_workload_an_owner(
        counts, live, recorded, busy, adopt):
    held = {o: tokens(o, n) for o, n in counts.items()}
    result = plan(held, live, recorded, busy, adopt_orphans=adopt)
    after = apply(held, result)
    cancelled = set() if adopt else {w.id for w in result.orphans}
    for o, keys in after.items():
        if o in busy:
            assert keys == held[o]  # in flight: left alone
            continue
        theirs = [w for w in live if w.owner == o and w.id not in cancelled]
        assert theirs, f"{o} is charged {keys} without a live workload"
        holding = {k for w in theirs for k in w.holds}
        assert not holding or set(keys) == holding  # what its workloads hold (unless they hold nothing yet)
    for w in live:
        if w.owner in busy:
            continue
        named = recorded is None or w.id in recorded.get(w.owner, set())
        assert named or w in result.orphans
        if w.holds and (named or adopt):
            assert set(w.holds) <= set(after.get(w.owner, ())), (w, after)
    assert all(w.owner not in busy or (w.start and busy[w.owner] and w.start not in busy[w.owner])
               for w in result.orphans)
    assert recorded is not None or result.orphans == ()


# ------------------------------------------------------------ owners in flight


def test_flights_name_owners_in_flight_since_a_mark():
    now = [0.0]
    flights = Flights(clock=lambda: now[0])
    early = flights.begin("ada/", "m0")
    now[0] = 1.0
    flights.end(early)  # landed before the pass began: forgotten by it
    now[0] = 2.0
    mark = flights.mark()
    with flights.flying("bob/", "m1"):
        now[0] = 3.0
    late = flights.begin("cy/")
    assert flights.since(mark) == {"bob/": frozenset({"m1"}), "cy/": frozenset()}
    flights.end(late)
    flights.end(late)  # twice: nothing more
    flights.forget(mark)
    assert flights.since(0.0) == {"bob/": frozenset({"m1"}), "cy/": frozenset()}


# ------------------------------------------------------------ the hub state's timer


async def test_the_timer_runs_rounds_one_after_another_newest_callable_failures_logged(fresh_metrics):
    state = HubState(GPUHubSettings(config=Config({"GPUHubSettings": {"gpu_inventory": "static"}})))
    rounds: list[str] = []
    running, most = [0], [0]

    async def first() -> None:
        running[0] += 1
        most[0] = max(most[0], running[0])
        rounds.append("first")
        await asyncio.sleep(0.02)
        running[0] -= 1
        if len(rounds) == 2:
            raise RuntimeError("a failed round")

    async def second() -> None:
        rounds.append("second")

    state.every("r", 0.01, first)
    while len(rounds) < 3:
        await asyncio.sleep(0.01)
    state.every("r", 0.01, second)  # replaces the callable, not the timer
    while "second" not in rounds:
        await asyncio.sleep(0.01)
    assert most == [1]  # never two rounds at once; the failed second round did not stop the timer
    state.close()
    count = len(rounds)
    await asyncio.sleep(0.05)
    assert len(rounds) <= count + 1  # (a round already under way may finish)
    state.every("off", 0, second)  # 0: no timer
    assert "off" not in state._timers


@pytest.mark.parametrize("value", [0.5, -1.0, float("nan")])
def test_reconcile_interval_below_one_second_is_refused_naming_the_setting(value):
    with pytest.raises(TraitError, match="gpu_reconcile_interval must be 0 .only at start. or at least 1 second"):
        GPUHubSettings(config=Config({"GPUHubSettings": {"gpu_reconcile_interval": value}}))
    assert GPUHubSettings(config=Config({"GPUHubSettings": {"gpu_reconcile_interval": 0}})).gpu_reconcile_interval == 0


# ------------------------------------------------------------ the mixin's pass


class ClusterDouble:
    """What a backend whose cluster holds the truth lists: its live workloads, changed by the test."""

    def __init__(self) -> None:
        self.live: list[Workload] = []
        self.reading = asyncio.Event()  # set: the next listing answers at once
        self.reading.set()
        self.listed = asyncio.Event()


def cluster_spawner(double: ClusterDouble, config: Config):
    from jupyterhub.spawner import Spawner

    from gpuspawner.backends.base import GPUSpawnerMixin

    class Spawner_(GPUSpawnerMixin, Spawner):
        reconciles_with_cluster = True
        backend_name = "gpu-test"
        workload_word = "job"

        async def live_workloads(self):
            live = list(double.live)
            double.listed.set()
            await double.reading.wait()
            return live

    return Spawner_(config=config)


@pytest.fixture
def usage_db(tmp_path):
    from jupyterhub import orm
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(f"sqlite:///{tmp_path / 'hub.sqlite'}")
    orm.Base.metadata.create_all(engine)
    with Session(engine) as session:
        yield session


def static_hub() -> Config:
    return Config({"GPUHubSettings": {"gpu_inventory": "static"}})


async def test_a_pass_frees_a_gone_charge_counts_a_live_one_and_the_usage_row_ends_failed(
        usage_db, caplog, fresh_metrics):
    from gpuspawner.usage import Allocation

    double = ClusterDouble()
    spawner = cluster_spawner(double, static_hub())
    state = spawner.hub_state
    state.usage.attach(usage_db)
    state.ledger.claim("ada/", {"slurm-gpu.a100": 1})
    double.live = [job("ada/", "1")]
    await spawner.ensure_reconciled()  # the pass at start: ada's job is live
    assert state.ledger.allocations() == {"ada/": tokens("ada/", 1)}
    double.live = [job("bob/", "2", 2)]  # ada's job ended, bob's appeared behind the hub's back
    await spawner.reconcile_with_cluster(first=False)
    assert state.ledger.allocations() == {"bob/": tokens("bob/", 2)}
    assert "gpu-test: ada/'s GPU charge (1) freed: no live job of it" in caplog.text
    assert "gpu-test: Slurm job 2 of bob/ counted: it holds 2 GPU(s) the hub did not count" in caplog.text
    usage_db.expire_all()
    ended = {row.owner: row.end_reason for row in usage_db.query(Allocation)}
    assert ended == {"ada/": "failed", "bob/": None}


async def test_charges_that_change_while_a_pass_reads_are_left_as_they_are(fresh_metrics):
    double = ClusterDouble()
    spawner = cluster_spawner(double, static_hub())
    ledger = spawner.hub_state.ledger
    await spawner.ensure_reconciled()
    ledger.claim("ada/", {"slurm-gpu.a100": 1})
    double.live = [job("ada/", "1")]
    double.reading.clear()
    double.listed.clear()
    reading = asyncio.ensure_future(spawner.reconcile_with_cluster(first=False))
    await double.listed.wait()  # the cluster was listed: ada's job is in the listing
    ledger.release("ada/")  # ... and then it was stopped (its charge given back outside any flight)
    ledger.claim("cy/", {"slurm-gpu.a100": 1})  # and cy's charge came, its job not made yet
    double.reading.set()
    await reading
    assert ledger.allocations() == {"cy/": tokens("cy/", 1)}  # neither undone by the stale listing
    await spawner.reconcile_with_cluster(first=False)  # the next pass, on what the cluster says now
    assert ledger.allocations() == {"ada/": tokens("ada/", 1)}
