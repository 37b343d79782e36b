"""Tests for gpuspawner.ledger: reservations never overlap and never leak."""

from __future__ import annotations

import threading

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpuspawner.gpu import GPU
from gpuspawner.ledger import Ledger, cluster_holdings, cluster_resource, cluster_tokens
from gpuspawner.placement import GPURequest, PlacementError

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"


def host(name: str, model: str, n: int) -> list[GPU]:
    """``n`` healthy GPUs of one model on one host."""
    return [GPU(name, i, f"{name}-{i}", model) for i in range(n)]


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


# --------------------------------------------------------------------------
# Basic behaviour
# --------------------------------------------------------------------------


def test_reserve_records_chosen_gpus(ledger):
    chosen = ledger.reserve(host("h1", A100, 4), GPURequest("alice", 2))
    assert [g.uuid for g in chosen] == ["h1-0", "h1-1"]
    assert ledger.allocations() == {"alice": ("h1-0", "h1-1")}
    assert ledger.held() == frozenset({"h1-0", "h1-1"})
    assert ledger.holder("h1-1") == "alice"
    assert ledger.holder("h1-2") is None


def test_second_reserve_gets_other_gpus(ledger):
    inventory = host("h1", A100, 4)
    ledger.reserve(inventory, GPURequest("alice", 2))
    chosen = ledger.reserve(inventory, GPURequest("bob", 2))
    assert [g.uuid for g in chosen] == ["h1-2", "h1-3"]


def test_reserve_accepts_a_generator(ledger):
    chosen = ledger.reserve(iter(host("h1", A100, 2)), GPURequest("alice", 1))
    assert [g.uuid for g in chosen] == ["h1-0"]


def test_reserve_zero_records_nothing(ledger):
    assert ledger.reserve(host("h1", A100, 1), GPURequest("alice", 0)) == ()
    assert ledger.allocations() == {}


def test_reserve_twice_for_same_owner_is_value_error(ledger):
    inventory = host("h1", A100, 4)
    ledger.reserve(inventory, GPURequest("alice", 1))
    with pytest.raises(ValueError, match="release them first"):
        ledger.reserve(inventory, GPURequest("alice", 1))
    assert ledger.allocations() == {"alice": ("h1-0",)}


def test_refused_reserve_changes_nothing(ledger):
    inventory = host("h1", A100, 2)
    ledger.reserve(inventory, GPURequest("alice", 1))
    with pytest.raises(PlacementError, match="at most 1 is free"):
        ledger.reserve(inventory, GPURequest("bob", 2))
    assert ledger.allocations() == {"alice": ("h1-0",)}
    assert ledger.holder("h1-1") is None


def test_release_returns_uuids_and_frees_them(ledger):
    inventory = host("h1", A100, 2)
    ledger.reserve(inventory, GPURequest("alice", 2))
    assert ledger.release("alice") == ("h1-0", "h1-1")
    assert ledger.held() == frozenset()
    assert ledger.allocations() == {}
    assert len(ledger.reserve(inventory, GPURequest("bob", 2))) == 2


def test_release_unknown_owner_returns_empty(ledger):
    assert ledger.release("nobody") == ()


def test_allocations_is_a_copy(ledger):
    ledger.adopt("alice", ["u1"])
    snapshot = ledger.allocations()
    snapshot["mallory"] = ("u2",)
    assert ledger.allocations() == {"alice": ("u1",)}


def test_adopt_restores_allocation_and_blocks_reuse(ledger):
    inventory = host("h1", A100, 3)
    assert ledger.adopt("alice", ["h1-0", "h1-1"]) == ()
    chosen = ledger.reserve(inventory, GPURequest("bob", 1))
    assert [g.uuid for g in chosen] == ["h1-2"]


def test_adopt_refuses_gpus_held_by_another_owner(ledger):
    ledger.adopt("alice", ["u1"])
    assert ledger.adopt("bob", ["u1", "u2"]) == ("u1",)
    assert ledger.allocations() == {"alice": ("u1",), "bob": ("u2",)}


def test_adopt_is_idempotent_for_same_owner(ledger):
    assert ledger.adopt("alice", ["u1", "u2", "u1"]) == ()
    assert ledger.adopt("alice", ["u2", "u1"]) == ()
    assert ledger.allocations() == {"alice": ("u1", "u2")}


def test_adopt_adds_to_existing_allocation(ledger):
    ledger.adopt("alice", ["u1"])
    ledger.adopt("alice", ["u2"])
    assert ledger.allocations() == {"alice": ("u1", "u2")}
    assert ledger.release("alice") == ("u1", "u2")


def test_adopt_nothing_records_no_owner(ledger):
    assert ledger.adopt("alice", []) == ()
    assert ledger.allocations() == {}


# --------------------------------------------------------------------------
# Counts of GPUs the cluster places (gpu-kube)
# --------------------------------------------------------------------------


def test_claim_records_one_token_per_gpu_and_never_an_inventory_gpu(ledger):
    inventory = host("h1", A100, 2)
    tokens = ledger.claim("alice/", {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1})
    assert tokens == cluster_tokens("alice/", {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1})
    assert len(tokens) == 3
    assert cluster_holdings(ledger.allocations()["alice/"]) == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 1}
    assert [cluster_resource(t) for t in tokens] == ["nvidia.com/gpu", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]
    assert cluster_resource("GPU-5d1f") is None
    # the hub's own GPUs stay free
    assert [g.uuid for g in ledger.reserve(inventory, GPURequest("bob/", 2))] == ["h1-0", "h1-1"]
    assert cluster_holdings(ledger.allocations()["bob/"]) == {}


def test_two_owners_claiming_the_same_resource_hold_distinct_tokens(ledger):
    a = ledger.claim("alice/", {"nvidia.com/gpu": 1})
    b = ledger.claim("alice/big", {"nvidia.com/gpu": 1})
    assert not set(a) & set(b)
    assert ledger.holder(a[0]) == "alice/" and ledger.holder(b[0]) == "alice/big"


def test_claim_admit_sees_holdings_under_the_lock_and_its_refusal_records_nothing(ledger):
    ledger.claim("alice/", {"nvidia.com/gpu": 1})
    seen = []

    def refuse(held):
        seen.append(dict(held))
        raise PlacementError("over quota", code="quota_user", requested=1)

    with pytest.raises(PlacementError, match="over quota"):
        ledger.claim("alice/big", {"nvidia.com/gpu": 1}, admit=refuse)
    assert seen == [{"alice/": cluster_tokens("alice/", {"nvidia.com/gpu": 1})}]
    assert list(ledger.allocations()) == ["alice/"]


def test_claim_of_nothing_records_nothing_and_skips_admit(ledger):
    def refuse(held):
        raise AssertionError("admit called for no GPU")

    assert ledger.claim("alice/", {}, admit=refuse) == ()
    assert ledger.claim("alice/", {"nvidia.com/gpu": 0}, admit=refuse) == ()
    assert ledger.allocations() == {}


def test_claim_twice_is_value_error_and_release_frees_the_tokens(ledger):
    tokens = ledger.claim("alice/", {"nvidia.com/gpu": 2})
    with pytest.raises(ValueError, match="release them first"):
        ledger.claim("alice/", {"nvidia.com/gpu": 1})
    assert ledger.release("alice/") == tokens
    assert ledger.held() == frozenset()


def test_adopting_tokens_rebuilds_a_claim(ledger):
    tokens = cluster_tokens("carol/mig", {"nvidia.com/mig-1g.10gb": 2})
    assert ledger.adopt("carol/mig", tokens) == ()
    assert cluster_holdings(ledger.allocations()["carol/mig"]) == {"nvidia.com/mig-1g.10gb": 2}


def test_concurrent_claims_never_exceed_a_limit_checked_in_admit(ledger):
    start = threading.Barrier(20)
    admitted: list[str] = []
    guard = threading.Lock()

    def at_most_three(held):
        if sum(len(v) for v in held.values()) + 1 > 3:
            raise PlacementError("full", code="quota_group", requested=1)

    def spawn(owner: str) -> None:
        start.wait()
        try:
            ledger.claim(owner, {"nvidia.com/gpu": 1}, admit=at_most_three)
        except PlacementError:
            return
        with guard:
            admitted.append(owner)

    threads = [threading.Thread(target=spawn, args=(f"user{i}/",)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admitted) == 3
    assert sorted(ledger.allocations()) == sorted(admitted)


# --------------------------------------------------------------------------
# Concurrency
# --------------------------------------------------------------------------


def test_concurrent_reserves_never_share_a_gpu(ledger):
    inventory = host("h1", A100, 8) + host("h2", A100, 8)
    start = threading.Barrier(50)
    results: dict[str, tuple[str, ...]] = {}
    refusals: list[str] = []
    guard = threading.Lock()

    def spawn(owner: str) -> None:
        start.wait()
        try:
            chosen = ledger.reserve(inventory, GPURequest(owner, 2))
        except PlacementError:
            with guard:
                refusals.append(owner)
            return
        with guard:
            results[owner] = tuple(g.uuid for g in chosen)

    threads = [threading.Thread(target=spawn, args=(f"user{i}",)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(results) == 8
    assert len(refusals) == 42
    taken = [uuid for uuids in results.values() for uuid in uuids]
    assert len(taken) == len(set(taken)) == 16
    assert all(len({u.split("-")[0] for u in uuids}) == 1 for uuids in results.values())
    assert ledger.allocations() == results


# --------------------------------------------------------------------------
# Properties over random histories
# --------------------------------------------------------------------------

MODELS = [A100, T4, "NVIDIA H100 80GB HBM3"]
OWNERS = [f"user{i}" for i in range(6)]
RESOURCES = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"]


@st.composite
def inventories(draw) -> list[GPU]:
    """Several hosts, each with one or two models, a few unhealthy GPUs."""
    gpus: list[GPU] = []
    for h in range(draw(st.integers(1, 4))):
        models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True))
        index = 0
        for model in models:
            for _ in range(draw(st.integers(1, 8))):
                healthy = draw(st.integers(0, 9)) > 0
                reason = None if healthy else "GPU is lost"
                gpus.append(GPU(f"h{h}", index, f"h{h}-{index}", model, healthy=healthy, reason=reason))
                index += 1
    return gpus


class LedgerMachine(RuleBasedStateMachine):
    """Random reserve / adopt / release / health changes against a simple model."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.inventory: list[GPU] = []
        self.model: dict[str, set[str]] = {}

    @rule(gpus=inventories())
    def set_inventory(self, gpus):
        if not self.inventory:
            self.inventory = gpus

    @precondition(lambda self: self.inventory)
    @rule(data=st.data())
    def toggle_health(self, data):
        i = data.draw(st.integers(0, len(self.inventory) - 1))
        g = self.inventory[i]
        self.inventory[i] = GPU(g.host, g.index, g.uuid, g.name, healthy=not g.healthy)

    @precondition(lambda self: self.inventory)
    @rule(
        owner=st.sampled_from(OWNERS),
        count=st.integers(0, 9),
        models=st.lists(st.sampled_from(["a100", "t4", "h100", "any", "b200"]), max_size=2),
    )
    def reserve(self, owner, count, models):
        before = self.ledger.allocations()
        held_before = self.ledger.held()
        request = GPURequest(owner, count, tuple(models))
        try:
            chosen = self.ledger.reserve(self.inventory, request)
        except (PlacementError, ValueError) as error:
            assert isinstance(error, ValueError) == (owner in before)
            assert self.ledger.allocations() == before
            return
        current = {g.uuid: g for g in self.inventory}
        for gpu in chosen:
            assert current[gpu.uuid] == gpu and gpu.healthy
            assert gpu.uuid not in held_before
        assert len({(g.host, g.model) for g in chosen}) <= 1
        assert len(chosen) == count
        if chosen:
            self.model[owner] = {g.uuid for g in chosen}

    @precondition(lambda self: self.inventory)
    @rule(owner=st.sampled_from(OWNERS), data=st.data())
    def adopt(self, owner, data):
        all_uuids = sorted(g.uuid for g in self.inventory)
        wanted = data.draw(st.lists(st.sampled_from(all_uuids), max_size=4))
        refused = self.ledger.adopt(owner, wanted)
        others = {u for o, us in self.model.items() if o != owner for u in us}
        assert set(refused) == set(wanted) & others
        accepted = set(wanted) - others
        if accepted or owner in self.model:
            self.model[owner] = self.model.get(owner, set()) | accepted

    @rule(
        owner=st.sampled_from(OWNERS),
        holdings=st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 3), max_size=2),
    )
    def claim(self, owner, holdings):
        before = self.ledger.allocations()
        try:
            tokens = self.ledger.claim(owner, holdings)
        except ValueError:
            assert owner in before
            assert self.ledger.allocations() == before
            return
        assert owner not in before
        assert cluster_holdings(tokens) == {r: n for r, n in holdings.items() if n}
        if tokens:
            self.model[owner] = set(tokens)

    @rule(owner=st.sampled_from(OWNERS), to=st.sampled_from(OWNERS))
    def transfer(self, owner, to):
        """Out of service (gpu-local): what ``owner`` held moves to ``to`` in one step, nothing freed between."""
        before = self.ledger.allocations()
        if any(cluster_resource(k) is not None for k in before.get(owner, ())):
            return  # cluster tokens name their owner: never moved
        try:
            moved = self.ledger.transfer(owner, to)
        except ValueError:
            assert to in before
            assert self.ledger.allocations() == before
            return
        assert set(moved) == self.model.get(owner, set())
        if owner != to and moved:
            self.model[to] = self.model.pop(owner)
        assert self.ledger.held() == frozenset(u for us in before.values() for u in us)

    @rule(owner=st.sampled_from(OWNERS))
    def release(self, owner):
        freed = self.ledger.release(owner)
        assert set(freed) == self.model.pop(owner, set())
        assert not (set(freed) & self.ledger.held())

    @rule()
    def release_everyone(self):
        for owner in list(self.ledger.allocations()):
            self.ledger.release(owner)
        self.model.clear()
        assert self.ledger.held() == frozenset()
        assert self.ledger.allocations() == {}

    @invariant()
    def matches_model_and_maps_agree(self):
        allocations = self.ledger.allocations()
        assert {o: set(us) for o, us in allocations.items()} == self.model
        flat = [u for us in allocations.values() for u in us]
        assert len(flat) == len(set(flat)), "a GPU is held twice"
        assert self.ledger.held() == frozenset(flat)
        assert all(us for us in allocations.values()), "owner recorded with no GPUs"
        for owner, us in allocations.items():
            assert all(self.ledger.holder(u) == owner for u in us)

    @invariant()
    def held_gpus_are_in_inventory_or_cluster_tokens(self):
        known = {g.uuid for g in self.inventory}
        for owner, keys in self.ledger.allocations().items():
            tokens = {k for k in keys if cluster_resource(k) is not None}
            assert set(keys) - tokens <= known
            assert all(k.endswith(":" + owner) for k in tokens), "a token of another owner"

    def teardown(self) -> None:
        for owner in list(self.ledger.allocations()):
            self.ledger.release(owner)
        assert self.ledger.held() == frozenset()
        assert self.ledger.allocations() == {}


LedgerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLedgerHistories = LedgerMachine.TestCase
