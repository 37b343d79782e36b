"""The wait estimator under the queue's backfill rules (gpuspawner/estimate_backfill.py): on fixed draws
its start is the one a direct run of the queue itself gives (GPUQueue.room, the ledger's placement)."""

from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import given, settings, strategies as st

from gpuspawner.estimate import Ask, History, Holder, Holding, estimate, for_gpus
from gpuspawner.gpu import GPU
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest, PlacementError
from gpuspawner.queue import GPUQueue
from gpuspawner.waits import WaitHistory, queue_estimate

A100, T4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"
HOUR = 3600.0
NOW = 10 * HOUR
HOSTS = (("a1", A100), ("a2", A100), ("b1", T4))  # host names sort as the placement breaks ties
INVENTORY = tuple(GPU(uuid=f"GPU-{host}-{i}", name=name, index=i, host=host) for host, name in HOSTS for i in range(4))
MODELS = (("a100",), ("t4",), ("any",))


def hold(k: int) -> float:
    """Request ``k``'s fixed length: longer than any holder's remaining time, none alike."""
    return 2 * HOUR + 1013.37 * (k + 1) + 0.0171 * k * k


def direct(held, ahead, ask, backfill: str) -> float:
    """When ``ask`` starts in the queue itself: every waiter, in queue order, places on the GPUs
    ``GPUQueue.room`` lets it use each time GPUs come back or a waiter leaves."""
    clock = [NOW]
    ledger, queue = Ledger(clock=lambda: clock[0]), GPUQueue(clock=lambda: clock[0])
    events: list[tuple[float, int, str]] = []
    for i, (host, count, end) in enumerate(held):
        ledger.reserve([g for g in INVENTORY if g.host == HOSTS[host][0]], GPURequest(owner=f"h{i}/", count=count))
        heapq.heappush(events, (NOW + end, 0, f"h{i}/"))
    waiters = {}
    for k, (count, models, gives_up) in enumerate(ahead):
        waiters[f"w{k}/"] = (queue.join(f"w{k}/", f"w{k}", count, models), hold(k))
        if gives_up is not None:
            heapq.heappush(events, (NOW + gives_up, 1, f"w{k}/"))
    mine = queue.join("me/", "me", ask[0], ask[1])
    while True:
        for w in queue.waiters():
            first = not queue.ahead(w.models, INVENTORY, before=w)
            room = INVENTORY if first else queue.room(w, INVENTORY, ledger.held(), backfill)
            if room is None:
                continue
            try:
                ledger.reserve(room, GPURequest(owner=w.owner, count=w.count, models=w.models))
            except PlacementError:
                continue
            if w is mine:
                return clock[0]
            queue.leave(w)
            heapq.heappush(events, (clock[0] + waiters[w.owner][1], 0, w.owner))
        if not events:
            return math.inf
        clock[0], kind, owner = heapq.heappop(events)
        if kind == 0:
            ledger.release(owner)
        elif waiters[owner][0] in queue.waiters():
            queue.leave(waiters[owner][0])


def estimated(held, ahead, ask, backfill: str) -> float | None:
    """The estimator's likely start for the same state, its draws fixed: each request ahead holds for
    its own recorded length, each holder ends at its latest end."""
    history = History([(f"p{k}", f"w{k}", hold(k)) for k in range(len(ahead))], min_samples=1)
    holders = {}
    used = {host: 0 for host, _ in HOSTS}
    for i, (host, count, _end) in enumerate(held):
        name = HOSTS[host][0]
        for g in [g for g in INVENTORY if g.host == name][used[name]:used[name] + count]:
            holders[g.uuid] = f"h{i}/"
        used[name] += count
    holdings = {f"h{i}/": Holding(NOW, f"h{i}", "held", NOW + end, "job") for i, (_h, _c, end) in enumerate(held)}
    asks = [Ask(f"w{k}/", count, f"w{k}", f"p{k}", None if up is None else NOW + up, models=models)
            for k, (count, models, up) in enumerate(ahead)]
    est = for_gpus(Ask("me/", ask[0], "me", "mine", models=ask[1]), NOW, INVENTORY, holders, holdings, asks,
                   history, samples=5, backfill=backfill)
    assert est.low == est.likely == est.high  # fixed draws: every scenario alike
    return est.likely


held_gpus = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 2), st.integers(0, 5400).map(float)), max_size=5,
                     unique_by=lambda h: h[2])
requests = st.lists(st.tuples(st.sampled_from((1, 1, 2, 4)), st.sampled_from(MODELS),
                              st.none() | st.floats(0, 3 * HOUR)), max_size=5)


def fits(held) -> bool:
    per = {}
    for host, count, _end in held:
        per[host] = per.get(host, 0) + count
    return all(n <= 4 for n in per.values())


@pytest.mark.parametrize("backfill", ["first-fit", "nearest-host"])
@settings(max_examples=120, deadline=None)
@given(held=held_gpus, ahead=requests, count=st.sampled_from((1, 2, 4)), models=st.sampled_from(MODELS))
def test_with_backfill_the_estimate_is_the_start_the_queue_itself_gives(backfill, held, ahead, count, models):
    held = [h for h in held if fits([*held[:held.index(h)], h])]
    want = direct(held, ahead, (count, models), backfill)
    got = estimated(held, ahead, (count, models), backfill)
    assert (math.inf if got is None else got) == pytest.approx(want)


def test_first_fit_lets_a_small_request_start_before_a_large_one_strict_order_keeps_it_behind():
    held = [(0, 2, HOUR), (1, 3, 2 * HOUR), (2, 4, 3 * HOUR)]  # A100s free: 2 on a1, 1 on a2
    ahead = [(4, ("a100",), None)]  # a whole A100 host: not before the first holder ends
    assert estimated(held, ahead, (1, ("a100",)), "first-fit") == NOW
    assert estimated(held, ahead, (1, ("a100",)), "nearest-host") == NOW  # a2's: a1, nearest to 4 free, is kept
    assert estimated(held, ahead, (2, ("a100",)), "nearest-host") == NOW + 2 * HOUR  # a1 kept, then taken
    assert estimated(held, ahead, (1, ("a100",)), "off") == NOW + HOUR  # behind the 4-GPU request


def test_an_unknown_backfill_rule_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="off, first-fit, nearest-host"):
        estimate(Ask("me/", 1), NOW, {"g": 1}, [Holder("x/", 1, NOW, "g")], [], History(()), backfill="fifo")


def test_the_hubs_queue_estimate_follows_the_hubs_backfill_setting():
    queue = GPUQueue(clock=lambda: NOW)
    queue.join("w0/", "w0", 4, ("a100",))  # a whole A100 host, while each has 2 held
    me = queue.join("me/", "me", 1, ("a100",))
    allocations = {"h0/": tuple(f"GPU-a1-{i}" for i in range(2)),
                   "h1/": tuple(f"GPU-a2-{i}" for i in range(2))}
    history = WaitHistory(lambda: [("server/a100-sxm4-80gb", "h", HOUR)] * 20, lambda uuid: "a100-sxm4-80gb")

    def when(backfill: str) -> float | None:
        return queue_estimate(me, INVENTORY, queue, allocations, lambda owner: NOW - 60, history,
                              job_time_limit=None, queue_timeout=1800, now=NOW, backfill=backfill).likely

    assert when("first-fit") == NOW  # two A100s are free on each host: it starts now
    assert when("off") > NOW  # behind the 4-GPU request
