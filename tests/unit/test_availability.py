"""Free/total per GPU model (gpuspawner.availability): one meaning on the form, in refusals and on Kubernetes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from gpuspawner.availability import (
    ModelAvailability,
    Tally,
    by_model,
    model_availability,
)
from gpuspawner.gpu import GPU, model_slug
from gpuspawner.placement import GPURequest, PlacementError, place

A100_NAME = "NVIDIA A100-SXM4-80GB"
T4_NAME = "Tesla T4"
A100 = model_slug(A100_NAME)
T4 = model_slug(T4_NAME)


def gpu(host: str, index: int, name: str = A100_NAME, healthy: bool = True) -> GPU:
    return GPU(host, index, f"{host}-{index}", name, healthy=healthy, reason=None if healthy else "GPU is lost")


# h1: A100 x2 (h1-0 held), T4 x1; h2: A100 x4 (h2-0 held, h2-1 unhealthy), T4 x1 (unhealthy)
INVENTORY = (
    gpu("h1", 0), gpu("h1", 1), gpu("h1", 2, T4_NAME),
    gpu("h2", 0), gpu("h2", 1, healthy=False), gpu("h2", 2), gpu("h2", 3), gpu("h2", 4, T4_NAME, healthy=False),
)
HELD = frozenset({"h1-0", "h2-0"})


def test_one_held_of_two():
    (a,) = model_availability([gpu("h1", 0), gpu("h1", 1)], {"h1-0"})
    assert a == ModelAvailability(A100, A100_NAME, free=1, total=2, largest=1, most_on_one_host=2)
    assert a.label == "NVIDIA A100-SXM4-80GB - 1 of 2 free"


def test_unhealthy_gpus_are_unavailable_not_part_of_the_total():
    a100, t4 = model_availability(INVENTORY, HELD)
    assert a100 == ModelAvailability(A100, A100_NAME, free=3, total=5, largest=2, unavailable=1, most_on_one_host=4)
    assert t4 == ModelAvailability(T4, T4_NAME, free=1, total=1, largest=1, unavailable=1, most_on_one_host=1)
    assert a100.label == "NVIDIA A100-SXM4-80GB - 3 of 5 free, 1 more unavailable"
    assert t4.label == "Tesla T4 - 1 of 1 free, 1 more unavailable"


def test_largest_is_per_host_not_total():
    # 2 free A100s, but one on each host: a 2-GPU request does not fit anywhere.
    gpus = [gpu("h1", 0), gpu("h1", 1), gpu("h2", 0), gpu("h2", 1)]
    (a,) = model_availability(gpus, {"h1-0", "h2-0"})
    assert (a.free, a.total, a.largest, a.most_on_one_host) == (2, 4, 1, 2)


def test_held_and_unhealthy_is_counted_once():
    (a,) = model_availability([gpu("h1", 0), gpu("h1", 1, healthy=False)], {"h1-0", "h1-1"})
    assert (a.free, a.total, a.unavailable, a.largest) == (0, 1, 1, 0)
    assert a.label.endswith("0 of 1 free, 1 more unavailable")


def test_model_with_every_gpu_out_of_service_is_still_listed():
    (a,) = model_availability([gpu("h1", 0, healthy=False), gpu("h1", 1, healthy=False)], set())
    assert (a.free, a.total, a.unavailable) == (0, 0, 2)
    assert a.label == "NVIDIA A100-SXM4-80GB - none usable: 2 of 2 unavailable"


def test_held_uuids_not_in_inventory_are_ignored():
    (a,) = model_availability([gpu("h1", 0)], ["elsewhere-0", "h9-1"])
    assert (a.free, a.total, a.largest) == (1, 1, 1)


def test_empty_inventory():
    assert model_availability([], set()) == []
    assert by_model([], {"h1-0"}) == {}


def test_order_is_stable_by_name_and_names_do_not_depend_on_order():
    shuffled = list(INVENTORY)
    random.Random(7).shuffle(shuffled)
    assert model_availability(shuffled, HELD) == model_availability(INVENTORY, HELD)
    names = [a.name for a in model_availability(INVENTORY + (gpu("h3", 0, "NVIDIA H100 80GB HBM3"),), HELD)]
    assert names == sorted(names) == [A100_NAME, "NVIDIA H100 80GB HBM3", T4_NAME]
    spellings = [gpu("h1", 0, "NVIDIA Tesla T4"), gpu("h1", 1, T4_NAME)]
    assert {a.name for a in model_availability(spellings, set())} == {"NVIDIA Tesla T4"}
    assert {a.name for a in model_availability(spellings[::-1], set())} == {"NVIDIA Tesla T4"}


def test_labels_for_unknown_and_noted_models():
    shared = ModelAvailability("shared-t4", "Tesla-T4", free=3, total=4, note="shared, no memory isolation")
    assert shared.label == "Tesla-T4 (shared, no memory isolation) - 3 of 4 free"
    assert ModelAvailability("t4", "Tesla-T4", 0, 0, known=False).label == "Tesla-T4 - availability unknown"


def test_tally_counts_groups_of_gpus_and_places_out_of_service():
    tally = Tally()
    tally.add("t4", "Tesla-T4", "node-a", count=8, free=3)
    tally.add("t4", "Tesla-T4", "node-b", count=8, free=5)
    tally.add("t4", "Tesla-T4", "node-c", count=16, free=16, in_service=False)  # cordoned
    (t4,) = tally.models().values()
    assert (t4.free, t4.total, t4.unavailable, t4.largest, t4.most_on_one_host) == (8, 16, 16, 5, 16)


@pytest.mark.parametrize("held", [{"a-0"}, {"a-0", "a-1"}])
def test_form_and_refusal_say_the_same_numbers(held):
    """The form's "0 of 1 free, 1 more unavailable" is the refusal's "0 of 1 free. 1 more is unavailable"."""
    inventory = [gpu("a", 0), gpu("a", 1, healthy=False)]
    (a,) = model_availability(inventory, held)
    with pytest.raises(PlacementError) as refused:
        place(inventory, held, GPURequest("alice", 1, ("a100",)))
    assert a.label == f"{A100_NAME} - 0 of 1 free, 1 more unavailable"
    assert f"0 of {a.total} free. {a.unavailable} more is unavailable: GPU is lost." in str(refused.value)
    assert (refused.value.free, refused.value.total, refused.value.unavailable) == (a.free, a.total, a.unavailable)


_GPUS = st.lists(st.tuples(st.sampled_from(["h1", "h2", "h3"]), st.sampled_from([A100_NAME, T4_NAME, "Tesla-T4"]),
                           st.booleans(), st.booleans()), max_size=24)


@settings(max_examples=60, deadline=None)
@given(_GPUS)
def test_counting_per_host_group_gives_what_counting_each_gpu_gives(entries):
    """by_model adds GPUs up per (model, host, health) group (10,000 GPUs: one add per group, not per GPU);
    the figures are those of adding each GPU on its own."""
    gpus = [GPU(host, n, f"g{n}", name, healthy=healthy) for n, (host, name, healthy, _) in enumerate(entries)]
    held = {f"g{n}" for n, (*_, is_held) in enumerate(entries) if is_held}
    one_by_one = Tally()
    for g in gpus:
        one_by_one.add(g.model, g.name, g.host, free=int(g.healthy and g.uuid not in held), in_service=g.healthy)
    assert by_model(gpus, held) == one_by_one.models()


def _one_by_one(gpus: list[GPU], held: set[str]) -> dict[str, ModelAvailability]:
    tally = Tally()
    for g in gpus:
        tally.add(g.model, g.name, g.host, free=int(g.healthy and g.uuid not in held), in_service=g.healthy)
    return tally.models()


@settings(max_examples=40, deadline=None)
@given(_GPUS, st.lists(st.sets(st.integers(0, 30), max_size=8), min_size=1, max_size=3))
def test_counts_of_one_reading_follow_what_is_held(entries, helds):
    """An inventory reading's GPUs (one tuple) are grouped once and counted for whatever is held at each
    count: the figures are those of counting every GPU again, UUIDs held by two records included."""
    gpus = [GPU(host, n, f"g{n % 9}", name, healthy=healthy) for n, (host, name, healthy, _) in enumerate(entries)]
    reading = tuple(gpus)
    for numbers in [*helds, helds[0]]:
        held = {f"g{n}" for n in numbers}
        assert by_model(reading, held) == _one_by_one(gpus, held)
        assert by_model(reading, sorted(held)) == _one_by_one(gpus, held)  # any collection of UUIDs
