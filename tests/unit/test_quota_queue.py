"""Quotas, the fair GPU queue and group-only/queued profile keys."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from gpuspawner.backends.policies import GPUPolicyMixin
from gpuspawner.gpu import GPU
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest, PlacementError
from gpuspawner.profiles import Choice, OptionsError, load_profiles, profile_from_config
from gpuspawner.queue import GPUQueue, QueueTimeout
from gpuspawner.quota import Quota, QuotaError, check
from gpuspawner.state import GPUHubSettings, HubState

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"


def gpus(n: int, name: str = A100, host: str = "h") -> tuple[GPU, ...]:
    return tuple(GPU(host, i, f"GPU-{name[-2:]}-{i}", name) for i in range(n))


# ---------------------------------------------------------------- quotas


def test_user_quota_counts_all_servers_and_names_the_quota():
    held = {"alice/": ("a", "b"), "alice/big": ("c", "d"), "bob/": ("e",)}
    quota = Quota("alice", per_user=4)
    with pytest.raises(QuotaError) as e:
        check(quota, 1, held)
    assert e.value.code == "quota_user"
    assert str(e.value).startswith("Your quota is 4 GPUs and your servers hold 4")
    assert "big" in str(e.value) and "default" in str(e.value)
    check(quota, 2, held, owner="alice/big")  # the server asking releases its own GPUs first
    check(Quota("bob", per_user=4), 3, held)
    with pytest.raises(QuotaError):
        check(Quota("bob", per_user=4), 4, held)


def test_group_quota_counts_every_member():
    held = {"ann/": ("a", "b", "c"), "ben/x": ("d",), "zed/": ("e", "f")}
    quota = Quota("ann", groups={"students": 5}, members={"students": frozenset({"ann", "ben"})})
    check(quota, 1, held)
    with pytest.raises(QuotaError) as e:
        check(quota, 2, held)
    assert e.value.code == "quota_group"
    assert "group 'students' is 5 GPUs and its members' servers hold 4" in str(e.value)


def test_queued_requests_count_against_the_quota():
    with pytest.raises(QuotaError) as e:
        check(Quota("alice", per_user=2), 1, {"alice/": ("a",)}, waiting={"alice": 1})
    assert "your queued spawns wait for 1" in str(e.value)
    with pytest.raises(QuotaError):
        check(Quota("ann", groups={"g": 2}, members={"g": frozenset({"ann", "ben"})}), 1, {}, waiting={"ben": 2})


def test_zero_gpu_requests_pass_any_quota():
    check(Quota("alice", per_user=0, groups={"g": 0}), 0, {"alice/": ("a",)})


def test_quota_under_the_ledger_lock_is_never_exceeded_by_concurrent_threads():
    ledger = Ledger()
    inventory = gpus(64)
    quota = Quota("alice", per_user=5)
    results = []

    def ask(n: int) -> None:
        request = GPURequest(f"alice/s{n}", 1)
        try:
            ledger.reserve(inventory, request, admit=lambda held: check(quota, 1, held, request.owner))
            results.append("ok")
        except QuotaError:
            results.append("quota")

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("ok") == 5 and results.count("quota") == 35
    assert sum(len(u) for u in ledger.allocations().values()) == 5


# ---------------------------------------------------------------- the queue


def test_a_users_second_request_does_not_jump_ahead_of_others_first():
    queue = GPUQueue()
    a1 = queue.join("alice/1", "alice", 1)
    a2 = queue.join("alice/2", "alice", 1)
    b1 = queue.join("bob/", "bob", 1)
    c1 = queue.join("carol/", "carol", 1)
    assert queue.waiters() == [a1, b1, c1, a2]
    queue.leave(a1)
    assert queue.waiters() == [b1, c1, a2]  # alice's second stays behind the others' first
    inventory = gpus(2)
    assert [queue.position(w, inventory) for w in queue.waiters()] == [1, 2, 3]


def test_requests_for_other_models_do_not_wait_behind_each_other():
    queue = GPUQueue()
    inventory = gpus(1, A100) + gpus(1, T4)
    a = queue.join("a/", "a", 1, ("a100",))
    t = queue.join("t/", "t", 1, ("t4",))
    anyone = queue.join("x/", "x", 1, ())
    assert queue.position(a, inventory) == 1 and queue.position(t, inventory) == 1
    assert queue.position(anyone, inventory) == 3


async def test_release_serves_the_queue_in_order_and_cancel_frees_the_place():
    ledger = Ledger()
    inventory = gpus(1)
    queue = GPUQueue()
    ledger.reserve(inventory, GPURequest("holder/", 1))
    served: list[str] = []
    reports: dict[str, list[str]] = {}

    async def read():
        return inventory

    def waiter_for(owner: str, user: str):
        waiter = queue.join(owner, user, 1)

        def place(current):
            return ledger.reserve(current, GPURequest(owner, 1))

        async def run():
            await queue.serve(waiter, read, place, timeout=60,
                              report=lambda p, text: reports.setdefault(owner, []).append(text), recheck=0.05)
            served.append(owner)
        return asyncio.ensure_future(run())

    first = waiter_for("bob/", "bob")
    cancelled = waiter_for("carol/", "carol")
    third = waiter_for("dan/", "dan")
    await asyncio.sleep(0.2)
    assert served == [] and len(queue) == 3
    assert reports["carol/"][0].startswith("Waiting for a free GPU: number 2 in the queue")
    cancelled.cancel()  # the user stops the pending spawn
    await asyncio.sleep(0.1)
    assert len(queue) == 2
    ledger.release("holder/")
    queue.wake()
    await asyncio.wait_for(first, 5)
    assert served == ["bob/"]
    ledger.release("bob/")
    queue.wake()
    await asyncio.wait_for(third, 5)
    assert served == ["bob/", "dan/"] and len(queue) == 0
    assert any("number 2" in r for r in reports["dan/"]) and any("number 1" in r for r in reports["dan/"])


async def test_queue_timeout_says_so_and_leaves_the_queue():
    queue = GPUQueue()
    waiter = queue.join("bob/", "bob", 1)

    async def read():
        return gpus(1)

    def place(current):
        raise PlacementError("No GPU is free right now", code="none_free", requested=1)

    with pytest.raises(QueueTimeout) as e:
        await queue.serve(waiter, read, place, timeout=0.2, recheck=0.05)
    assert e.value.code == "queue_timeout"
    assert str(e.value).startswith("No GPU became free within 1 seconds, the queue's limit (you were number 1")
    assert len(queue) == 0


async def test_a_refusal_a_wait_cannot_cure_ends_the_wait_at_once():
    queue = GPUQueue()
    waiter = queue.join("bob/", "bob", 1)

    async def read():
        return gpus(1)

    def place(current):
        raise QuotaError("Your quota is 1 GPU", code="quota_user", requested=1)

    with pytest.raises(QuotaError):
        await asyncio.wait_for(queue.serve(waiter, read, place, timeout=60), 5)
    assert len(queue) == 0


class _Spawns(GPUPolicyMixin):
    """The policies of one user's spawns on a hub state of static GPUs (no JupyterHub around)."""

    def __init__(self, state: HubState, user: str, **config) -> None:
        super().__init__(**config)
        self.hub_state = state
        self.user = SimpleNamespace(name=user, groups=[])
        self.events: list[str] = []
        self.gpu_job_time_limit = 3600.0

    @property
    def ledger(self) -> Ledger:
        return self.hub_state.ledger

    def gpu_event(self, message: str, progress: int) -> None:
        self.events.append(message)


async def test_a_user_waiting_in_the_queue_cannot_also_hold_past_the_quota():
    static = [{"uuid": "GPU-a", "name": A100}, {"uuid": "GPU-t", "name": T4}]
    state = HubState(GPUHubSettings(gpu_inventory="static", static_gpus=static))
    reading = await state.inventory.read()
    queued = profile_from_config({"display_name": "A100, queued", "gpu_models": ["a100"], "gpu_counts": [1],
                                  "queue": True})
    plain = profile_from_config({"display_name": "T4", "gpu_models": ["t4"], "gpu_counts": [1]})
    state.ledger.reserve(reading.gpus, GPURequest("bob/", 1, ("a100",)))
    alice = _Spawns(state, "alice", gpu_quota_per_user=1, gpu_queue_recheck=0.05)
    waiting = asyncio.ensure_future(alice.place_request(
        reading, GPURequest("alice/a", 1, ("a100",)), Choice(queued, 1, "a100")))
    while not state.queue.waiters():
        await asyncio.sleep(0.01)
    # a T4 is free, but alice already waits for her one GPU: the second server is refused
    with pytest.raises(QuotaError) as refused:
        await alice.place_request(reading, GPURequest("alice/t", 1, ("t4",)), Choice(plain, 1, "t4"))
    assert "your queued spawns wait for 1" in str(refused.value)
    assert state.ledger.holder("GPU-t") is None
    state.ledger.release("bob/")
    state.queue.wake()
    assert [g.uuid for g in await asyncio.wait_for(waiting, 5)] == ["GPU-a"]  # served: its own wait not counted
    assert state.ledger.allocations() == {"alice/a": ("GPU-a",)}


@pytest.mark.parametrize("backfill", ["first-fit", "nearest-host"])
async def test_the_hubs_queue_starts_small_spawns_beside_a_big_one_that_waits(backfill):
    # gpu_queue_backfill (rules: tests/unit/test_queue_backfill.py)
    static = [{"uuid": f"GPU-{h}{i}", "name": A100, "host": h, "index": i} for h in ("x", "y") for i in range(4)]
    state = HubState(GPUHubSettings(gpu_inventory="static", static_gpus=static))
    reading = await state.inventory.read()
    queued = profile_from_config({"display_name": "A100, queued", "gpu_models": ["a100"], "gpu_counts": [1, 4],
                                  "queue": True})
    on = {h: tuple(g for g in reading.gpus if g.host == h) for h in ("x", "y")}
    state.ledger.reserve(on["x"], GPURequest("old/x", 1))  # x: 3 free
    state.ledger.reserve(on["y"], GPURequest("old/y", 3))  # y: 1 free

    def spawn(user: str, count: int):
        spawner = _Spawns(state, user, gpu_queue_recheck=0.05, gpu_queue_backfill=backfill)
        return asyncio.ensure_future(spawner.place_request(
            reading, GPURequest(f"{user}/", count, ("a100",)), Choice(queued, count, "a100")))

    big = spawn("ada", 4)
    while not state.queue.waiters():
        await asyncio.sleep(0.01)
    small = await asyncio.wait_for(spawn("bob", 1), 5)  # behind ada, started on y's free GPU (best fit)
    assert [g.host for g in small] == ["y"] and not big.done()
    third = spawn("cy", 1)  # y is full now
    if backfill == "first-fit":  # cy fits on x: she starts, ada still waits
        assert [g.host for g in await asyncio.wait_for(third, 5)] == ["x"] and not big.done()
        return
    await asyncio.sleep(0.3)  # nearest-host: x stays ada's, cy waits behind her
    assert not third.done() and [w.owner for w in state.queue.waiters()] == ["ada/", "cy/"]
    state.ledger.release("old/x")
    state.queue.wake()
    assert {g.host for g in await asyncio.wait_for(big, 5)} == {"x"}
    state.ledger.release("old/y")
    state.queue.wake()
    assert [g.host for g in await asyncio.wait_for(third, 5)] == ["y"]


# ---------------------------------------------------------------- profile keys


def test_profile_groups_and_queue_keys():
    p = profile_from_config({"display_name": "Big", "gpu_counts": [4], "groups": ["staff"], "queue": True})
    assert p.groups == ("staff",) and p.queue
    assert p.visible_to({"staff", "x"}) and not p.visible_to({"students"})
    assert load_profiles([{"display_name": "Open"}])[0].visible_to(set())
    for bad in ({"groups": [1]}, {"groups": {"a": 1}}, {"groups": [""]}, {"queue": "yes"}, {"queue": 1}):
        with pytest.raises(OptionsError):
            profile_from_config({"display_name": "X", **bad})
