"""GPUs out of service: held apart from their last holder until the hub's retry finds them free."""

from __future__ import annotations

import asyncio

import pytest

from gpuspawner.gpu import GPU
from gpuspawner.ledger import Ledger
from gpuspawner.outofservice import OutOfService, withheld_owner
from gpuspawner.placement import GPURequest, PlacementError

GPUS = [GPU("h", 0, "GPU-0", "Tesla T4")]


async def test_withheld_gpus_are_placed_for_nobody_until_the_retry_frees_them():
    ledger = Ledger()
    woken = []
    service = OutOfService(ledger, lambda: woken.append(True))
    ledger.reserve(GPUS, GPURequest("ada/", 1))
    answers = ["pid 7 (python3, in uninterruptible sleep, inside the kernel) would not die", None]
    asked = asyncio.Event()

    async def retry():
        asked.set()
        return answers.pop(0)

    entry = service.withhold("ada/", "start1234567890", "pid 7 would not die", retry, interval=0.01)
    owner = withheld_owner("ada/", "start1234567890")
    assert (entry.owner, entry.was, entry.uuids) == (owner, "ada/", ("GPU-0",))
    assert ledger.allocations() == {owner: ("GPU-0",)}  # moved, never free in between
    assert service.of("ada/") == [entry] and service.get(owner) == entry
    with pytest.raises(PlacementError):  # nobody gets it meanwhile, ada's next server included
        ledger.reserve(GPUS, GPURequest("ada/", 1))
    assert await service.given_back(owner, timeout=5)
    assert ledger.allocations() == {} and woken == [True]
    assert service.entries() == [] and service.of("ada/") == []
    assert answers == []  # asked twice: still there (reason updated), then gone


async def test_a_holder_of_no_gpu_is_retried_too_and_close_stops_retrying():
    ledger = Ledger()
    service = OutOfService(ledger)
    calls = []

    async def retry():
        calls.append(1)
        return "still there"

    entry = service.withhold("bob/cpu", "s2", "pid 9 would not die", retry, interval=0.01)
    assert entry.uuids == () and service.of("bob/cpu") == [entry]
    await asyncio.sleep(0.1)
    assert calls and service.get(entry.owner).reason == "still there"
    service.close()
    count = len(calls)
    await asyncio.sleep(0.05)
    assert len(calls) == count and not await service.given_back(entry.owner, timeout=0.01)
