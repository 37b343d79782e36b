"""The overview's GPU entries kept from one read to the next (gpuspawner.hub.overview.GPUEntries): every read
answers what building the whole overview anew answers, whatever changed in between."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings, strategies as st

from gpuspawner.gpu import GPU
from gpuspawner.hub.live import GPUNumbers
from gpuspawner.hub.overview import GPUEntries, Holder, build, to_json
from gpuspawner.inputs import dumps
from gpuspawner.inventory import InventoryReading

T4, A100 = "Tesla T4", "NVIDIA A100-SXM4-80GB"
GPUS = tuple(GPU(f"h{n % 3}", n // 3, f"GPU-{n}", T4 if n % 2 else A100) for n in range(9))
SICK = tuple(GPU(g.host, g.index, g.uuid, g.name, healthy=False, reason="GPU is lost") if g.uuid == "GPU-4" else g
             for g in GPUS)
OWNERS = ("ann/", "bob/", "bob/big", "zoe/job/7")
STATES = ("running", "starting", "stopping", "not running", "out of service")

# one read: the inventory, who holds which GPUs (and in what state), live numbers (one not finite), problems
_READ = st.fixed_dictionaries({
    "sick": st.booleans(),
    "held": st.dictionaries(st.sampled_from([g.uuid for g in GPUS]), st.sampled_from(OWNERS), max_size=6),
    "states": st.dictionaries(st.sampled_from(OWNERS), st.sampled_from(STATES)),
    "live": st.dictionaries(st.sampled_from(["GPU-0", "GPU-1", "GPU-4", "GPU-gone"]),
                            st.sampled_from([10.0, 55.5, math.nan]), max_size=3),
    "problem": st.sampled_from([None, *OWNERS]),
    "later": st.floats(0, 30),
})


def _facts(read: dict) -> tuple:
    allocations: dict[str, tuple[str, ...]] = {}
    for uuid, owner in sorted(read["held"].items()):
        allocations[owner] = (*allocations.get(owner, ()), uuid)
    holders = {owner: Holder(owner, owner.split("/")[0], owner.split("/", 1)[1], 1_700_000_000.0, state,
                             f"/user/{owner}" if state == "running" else None)
               for owner, state in read["states"].items() if owner in allocations}
    now = 1_700_000_100.0 + read["later"]
    live = {uuid: GPUNumbers(value, 2**30, 2**34, now - 12 + read["later"] / 2, "monitor")
            for uuid, value in read["live"].items()}
    problems = {read["problem"]: "its monitor did not answer"} if read["problem"] else {}
    return InventoryReading(SICK if read["sick"] else GPUS), allocations, holders, live, problems, [], now


@settings(max_examples=40, deadline=None)
@given(st.lists(_READ, min_size=1, max_size=6))
def test_each_read_answers_what_a_new_build_answers(reads):
    kept = GPUEntries()
    for read in reads:
        facts = _facts(read)
        answer, anew = build(*facts, kept=kept), build(*facts)
        assert json.loads(to_json(answer)) == json.loads(dumps(anew))
        assert answer == anew  # and the page renders the same


def test_an_unchanged_read_reuses_every_entry_and_a_change_writes_only_its_gpus():
    kept = GPUEntries()
    reading = InventoryReading(GPUS)
    first = build(reading, {"ann/": ("GPU-1",)}, {}, {}, {}, [], 1.0, kept)
    again = build(reading, {"ann/": ("GPU-1",)}, {}, {}, {}, [], 2.0, kept)
    assert again["gpus"] is first["gpus"]
    moved = build(reading, {"ann/": ("GPU-2",)}, {}, {}, {}, [], 3.0, kept)
    changed = [n for n, (old, new) in enumerate(zip(first["gpus"], moved["gpus"], strict=True)) if old is not new]
    assert [moved["gpus"][n]["uuid"] for n in changed] == ["GPU-1", "GPU-2"]
    assert [g["uuid"] for g in moved["gpus"] if g["holder"]] == ["GPU-2"]
    for now in (4.0, 5.0):  # live numbers: their age changes with every read
        sampled = build(reading, {"ann/": ("GPU-2",)}, {}, {"GPU-2": GPUNumbers(50.0, 1, 2, 3.5, "monitor")}, {}, [],
                        now, kept)
        assert [(g["uuid"], g["age"]) for g in sampled["gpus"] if g["age"] is not None] == [("GPU-2", now - 3.5)]


async def test_a_new_readings_entries_are_written_in_a_worker_thread(monkeypatch):
    """10,000 GPUs' entries take 0.1 to 0.2 s to write: not on the event loop, which every request waits for."""
    import threading

    import gpuspawner.hub.overview as overview

    threads, unheld = [], overview._unheld
    monkeypatch.setattr(overview, "_unheld", lambda reading: threads.append(threading.get_ident()) or unheld(reading))
    kept, reading = GPUEntries(), InventoryReading(GPUS)
    await kept.prepare(reading)
    await kept.prepare(reading)  # the same reading: nothing to write
    facts = (reading, {"ann/": ("GPU-3",)}, {}, {}, {}, [], 5.0)
    assert build(*facts, kept=kept) == build(*facts)
    assert len(threads) == 2 and threads[0] != threading.get_ident()  # (the second: the new build's own)
