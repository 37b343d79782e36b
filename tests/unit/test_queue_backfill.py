"""Backfill in the hub's queue (GPUQueue.room, gpu_queue_backfill): a request behind others waits (off,
the default), starts where it fits (first-fit), or only off the hosts the requests ahead are nearest to
fitting (nearest-host); in the replay as in the hub (the hub's own placing: test_quota_queue.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from traitlets import TraitError

from gpuspawner.backends.policies import GPUPolicyMixin
from gpuspawner.gpu import GPU
from gpuspawner.queue import BACKFILL, GPUQueue
from gpuspawner.replay import Policy, Session, gpus as replay_gpus, replay

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"


def host(name: str, n: int = 4, model: str = A100) -> tuple[GPU, ...]:
    return tuple(GPU(name, i, f"GPU-{name}-{i}", model) for i in range(n))


def test_a_request_behind_a_big_one_starts_where_it_fits_or_only_off_the_host_kept_for_it():
    inventory = host("h1") + host("h2")
    held = {"GPU-h1-0", "GPU-h2-0", "GPU-h2-1", "GPU-h2-2"}  # h1: 3 free, h2: 1 free
    queue = GPUQueue()
    big = queue.join("ada/", "ada", 4, ("a100",))
    small = queue.join("bob/", "bob", 1, ("a100",))
    pair = queue.join("cy/", "cy", 2, ("a100",))
    for backfill in BACKFILL:
        assert queue.room(big, inventory, held, backfill) == inventory  # nothing ahead of it
    # first fit: ada cannot fit yet, so she holds nobody back
    assert queue.room(small, inventory, held, "first-fit") == inventory
    assert queue.room(pair, inventory, held, "first-fit") == inventory
    assert queue.room(pair, inventory, held | {"GPU-h1-1", "GPU-h1-2"}, "first-fit") is None  # 1 free on each
    # nearest-host: h1 is kept for ada's 4; bob may use h2, cy (2) finds no room there
    assert {g.host for g in queue.room(small, inventory, held, "nearest-host")} == {"h2"}
    assert queue.room(pair, inventory, held, "nearest-host") is None
    assert queue.room(small, inventory, held | {"GPU-h1-1", "GPU-h1-2"}, "nearest-host") is None  # a tie: both kept
    assert queue.room(small, inventory, held, "off") is None  # strict order
    with pytest.raises(ValueError, match="backfill must be one of off, first-fit, nearest-host, not 'some'"):
        queue.room(small, inventory, held, "some")


def test_a_blocked_one_gpu_request_is_never_overtaken_by_its_own_kind_but_other_models_start():
    inventory = host("a", 2) + host("t", 2, T4)
    held = {"GPU-a-0", "GPU-a-1"}
    queue = GPUQueue()
    queue.join("ada/", "ada", 1, ("a100",))
    second = queue.join("bob/", "bob", 1, ("a100",))
    anyone = queue.join("cy/", "cy", 1, ())
    for backfill in ("first-fit", "nearest-host"):
        assert queue.room(second, inventory, held, backfill) is None
        assert {g.name for g in queue.room(anyone, inventory, held, backfill)} >= {T4}  # a T4 ada cannot use
    assert queue.room(anyone, inventory, held, "off") is None


def test_the_backfill_setting_is_checked_at_start_naming_it():
    for bad in ("greedy", "First-Fit", ""):
        with pytest.raises(TraitError, match="gpu_queue_backfill must be 'off', 'first-fit' or 'nearest-host', not"):
            GPUPolicyMixin(gpu_queue_backfill=bad)
    assert GPUPolicyMixin().gpu_queue_backfill == "off"
    assert GPUPolicyMixin(gpu_queue_backfill="first-fit").gpu_queue_backfill == "first-fit"


def test_the_replay_backfills_as_the_hub_does():
    # 2 hosts of 4 T4s. a holds 3 on the first, b 2 on the second (best fit), both for 2 hours; c asks
    # for 4 at 60 and waits (the second host, 2 free, is the nearest); d asks for 1 at 120 and starts at
    # once on the first host's free GPU (with backfill off: at c's limit, 1860, a wait of 29 minutes)
    sessions = [Session(0, "a", 0, 3, ("t4",), [("active", 7200)]),
                Session(1, "b", 10, 2, ("t4",), [("active", 7200)]),
                Session(2, "c", 60, 4, ("t4",), [("active", 600)]),
                Session(3, "d", 120, 1, ("t4",), [("active", 600)])]
    policy = Policy("q", queue=True, gpu_culler=None, queue_timeout=1800, retries=0)
    assert policy.backfill == "off"  # as the hub's default
    for backfill in ("first-fit", "nearest-host"):
        r = replay([sessions], replay_gpus("t4=8"), replace(policy, backfill=backfill), hours=1)
        assert (r.served, r.gave_up) == (3, 1)  # a, b and d; c reaches the queue's limit
        assert (r.median_wait_min, r.p95_wait_min) == (0.0, 0.0)
    r = replay([sessions], replay_gpus("t4=8"), replace(policy, backfill="off"), hours=1)
    assert (r.served, r.gave_up, r.p95_wait_min) == (3, 1, 29.0)  # d starts when c leaves, at 1860
