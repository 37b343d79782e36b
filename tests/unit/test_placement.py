"""Tests for gpuspawner.placement: which GPUs a request gets and why it may get none."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from gpuspawner.gpu import GPU, display_name
from gpuspawner.placement import GPURequest, PlacementError, place

A100 = "NVIDIA A100-SXM4-80GB"
A100_PCIE = "NVIDIA A100-PCIE-40GB"
T4 = "Tesla T4"
H100 = "NVIDIA H100 80GB HBM3"


def host(name: str, model: str, n: int, *, first: int = 0) -> list[GPU]:
    """``n`` healthy GPUs of one model on one host, indexes from ``first``."""
    return [GPU(name, i, f"{name}-{i}", model) for i in range(first, first + n)]


def broken(gpu: GPU, reason: str = "GPU is lost") -> GPU:
    """The same GPU, marked unhealthy."""
    return GPU(gpu.host, gpu.index, gpu.uuid, gpu.name, healthy=False, reason=reason)


def uuids(gpus: tuple[GPU, ...]) -> list[str]:
    return [gpu.uuid for gpu in gpus]


def refusal(inventory: list[GPU], held: set[str], request: GPURequest) -> PlacementError:
    with pytest.raises(PlacementError) as info:
        place(inventory, held, request)
    return info.value


# --------------------------------------------------------------------------
# GPURequest
# --------------------------------------------------------------------------


def test_request_normalises_model_patterns():
    assert GPURequest("alice", 1, (" A100 ", "", "T4")).models == ("a100", "t4")


def test_request_accepts_single_model_string():
    assert GPURequest("alice", 1, "a100").models == ("a100",)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [-1, 1.5, True])
def test_request_rejects_bad_count(count):
    with pytest.raises(ValueError):
        GPURequest("alice", count)


def test_request_rejects_empty_owner():
    with pytest.raises(ValueError):
        GPURequest("", 1)


def test_request_any_model():
    assert GPURequest("a", 1).any_model
    assert GPURequest("a", 1, ("t4", "any")).any_model
    assert not GPURequest("a", 1, ("t4",)).any_model


# --------------------------------------------------------------------------
# Choosing GPUs
# --------------------------------------------------------------------------


def test_count_zero_returns_nothing_even_on_empty_inventory():
    assert place([], set(), GPURequest("alice", 0)) == ()
    assert place(host("h1", A100, 2), set(), GPURequest("alice", 0, ("h100",))) == ()


def test_takes_lowest_free_indexes_on_host():
    inventory = host("h1", A100, 4)
    chosen = place(inventory, {"h1-0"}, GPURequest("alice", 2))
    assert uuids(chosen) == ["h1-1", "h1-2"]


def test_result_is_ordered_by_index():
    inventory = list(reversed(host("h1", A100, 4)))
    assert [g.index for g in place(inventory, set(), GPURequest("a", 3))] == [0, 1, 2]


def test_packs_onto_fullest_host_that_fits():
    inventory = host("empty", A100, 8) + host("busy", A100, 8)
    held = {f"busy-{i}" for i in range(5)}  # busy has 3 free, empty has 8
    chosen = place(inventory, held, GPURequest("alice", 2))
    assert uuids(chosen) == ["busy-5", "busy-6"]


def test_big_request_still_fits_on_empty_host_after_packing():
    inventory = host("empty", A100, 8) + host("busy", A100, 8)
    held = {f"busy-{i}" for i in range(5)}
    held |= set(uuids(place(inventory, held, GPURequest("alice", 2))))
    chosen = place(inventory, held, GPURequest("bob", 8))
    assert uuids(chosen) == [f"empty-{i}" for i in range(8)]


def test_skips_groups_too_small_for_request():
    inventory = host("small", A100, 2) + host("big", A100, 4)
    assert {g.host for g in place(inventory, set(), GPURequest("a", 3))} == {"big"}


def test_all_gpus_on_one_host_even_when_spread_would_suffice():
    inventory = host("h1", A100, 2) + host("h2", A100, 2)
    with pytest.raises(PlacementError):
        place(inventory, set(), GPURequest("alice", 3))


def test_all_gpus_of_one_model_on_mixed_host():
    inventory = host("h1", A100, 2) + host("h1", T4, 2, first=2)
    chosen = place(inventory, set(), GPURequest("alice", 2))
    assert len({g.name for g in chosen}) == 1
    with pytest.raises(PlacementError):
        place(inventory, set(), GPURequest("alice", 3))


def test_only_requested_model_is_used():
    inventory = host("t", T4, 1) + host("a", A100, 4)
    chosen = place(inventory, set(), GPURequest("alice", 1, ("a100",)))
    assert uuids(chosen) == ["a-0"]


def test_model_pattern_prefix_matches_variants():
    inventory = host("p", A100_PCIE, 1) + host("s", A100, 1) + host("t", T4, 1)
    chosen = place(inventory, set(), GPURequest("alice", 1, ("a100",)))
    assert chosen[0].name in {A100, A100_PCIE}


def test_tie_broken_by_model_preference_order():
    inventory = host("h1", A100, 2) + host("h2", T4, 2)
    assert place(inventory, set(), GPURequest("a", 1, ("t4", "a100")))[0].name == T4
    assert place(inventory, set(), GPURequest("a", 1, ("a100", "t4")))[0].name == A100


def test_best_fit_beats_model_preference():
    inventory = host("h1", A100, 8) + host("h2", T4, 1)
    assert place(inventory, set(), GPURequest("a", 1, ("a100", "t4")))[0].name == T4


def test_any_after_preferred_model_prefers_it_on_ties():
    inventory = host("h1", A100, 2) + host("h2", T4, 2)
    assert place(inventory, set(), GPURequest("a", 1, ("t4", "any")))[0].name == T4


def test_tie_broken_by_host_name_then_model():
    inventory = host("b", A100, 2) + host("a", A100, 2)
    assert place(inventory, set(), GPURequest("x", 1))[0].host == "a"
    mixed = host("h", T4, 2) + host("h", A100, 2, first=2)
    assert place(mixed, set(), GPURequest("x", 1))[0].name == A100  # 'a100-...' < 't4'


def test_unhealthy_gpus_are_never_placed():
    inventory = [broken(g) if g.index < 3 else g for g in host("h1", A100, 4)]
    assert uuids(place(inventory, set(), GPURequest("a", 1))) == ["h1-3"]
    with pytest.raises(PlacementError):
        place(inventory, set(), GPURequest("a", 2))


def test_held_gpus_are_never_placed():
    inventory = host("h1", A100, 3)
    assert uuids(place(inventory, ["h1-0", "h1-2"], GPURequest("a", 1))) == ["h1-1"]


def test_accepts_generators_and_lists_for_inputs():
    inventory = host("h1", A100, 3)
    chosen = place(iter(inventory), ["h1-0"], GPURequest("a", 1))
    assert uuids(chosen) == ["h1-1"]


def test_deterministic_under_shuffled_inventory():
    inventory = (
        host("n1", A100, 8) + host("n2", A100, 8) + host("n3", T4, 4) + host("n4", H100, 8)
    )
    held = {"n1-0", "n1-3", "n2-1", "n4-7", "n3-2"}
    request = GPURequest("a", 2, ("h100", "a100"))
    expected = place(inventory, held, request)
    rng = random.Random(7)
    for _ in range(20):
        shuffled = inventory[:]
        rng.shuffle(shuffled)
        assert place(shuffled, held, request) == expected


gpu_lists = st.lists(
    st.builds(
        lambda h, i, m, ok: GPU(f"h{h}", i, f"h{h}-{i}", m, healthy=ok, reason=None if ok else "x"),
        st.integers(0, 3),
        st.integers(0, 7),
        st.sampled_from([A100, T4, H100]),
        st.booleans(),
    ),
    max_size=40,
    unique_by=lambda g: g.uuid,
)


@settings(max_examples=200, deadline=None)
@given(
    gpus=gpu_lists,
    held_mask=st.lists(st.booleans(), max_size=40),
    count=st.integers(0, 9),
    models=st.lists(st.sampled_from(["a100", "t4", "h100", "any"]), max_size=2),
    seed=st.integers(0, 1000),
)
def test_placement_invariants(gpus, held_mask, count, models, seed):
    held = {g.uuid for g, h in zip(gpus, held_mask, strict=False) if h}  # the mask may be shorter or longer
    request = GPURequest("alice", count, tuple(models))
    shuffled = gpus[:]
    random.Random(seed).shuffle(shuffled)
    try:
        chosen = place(gpus, held, request)
    except PlacementError as error:
        assert str(error)
        with pytest.raises(PlacementError) as again:
            place(shuffled, held, request)
        assert str(again.value) == str(error)
        return
    assert place(shuffled, held, request) == chosen
    assert len(chosen) == count
    assert len({g.uuid for g in chosen}) == count
    assert all(g.healthy and g.uuid not in held for g in chosen)
    assert len({(g.host, g.model) for g in chosen}) <= 1


# --------------------------------------------------------------------------
# Refusal sentences
# --------------------------------------------------------------------------


def test_refusal_none_free_names_model_counts_and_alternative():
    inventory = host("a", A100, 2) + host("t", T4, 2)
    error = refusal(inventory, {"a-0", "a-1"}, GPURequest("alice", 1, ("a100",)))
    message = str(error)
    assert message.startswith(f"No {A100} is free right now: 0 of 2 free.")
    assert f"{T4} has 2 free." in message
    assert "Pick another model or try again later." in message
    assert error.code == "none_free"
    assert (error.requested, error.free, error.total) == (1, 0, 2)
    assert error.free_by_model == {"a100-sxm4-80gb": (0, 2), "t4": (2, 2)}


def test_refusal_none_free_without_alternative_only_says_wait():
    error = refusal(host("a", A100, 2), {"a-0", "a-1"}, GPURequest("alice", 1))
    assert str(error) == "No GPU is free right now: 0 of 2 free. Try again later."


def test_refusal_not_enough_on_one_machine():
    inventory = host("a1", A100, 2) + host("a2", A100, 2) + host("t", T4, 1)
    error = refusal(inventory, {"a1-0", "a2-0"}, GPURequest("alice", 2, ("a100",)))
    message = str(error)
    assert message.startswith(
        f"2 x {A100} were requested but at most 1 is free on one machine (2 of 4 free in all)."
    )
    assert message.endswith("Ask for at most 1 or try again later.")
    assert T4 not in message  # one T4 cannot take two GPUs
    assert error.code == "not_enough_on_one_host"
    assert error.max_free_on_one_host == 1


def test_refusal_not_enough_mentions_unhealthy_gpus_and_reason():
    gpus = host("a", A100, 2)
    inventory = [gpus[0], broken(gpus[1], "GPU is lost")]
    error = refusal(inventory, set(), GPURequest("alice", 2, ("a100",)))
    message = str(error)
    assert "at most 1 is free on one machine (1 of 1 free in all)" in message
    assert "1 more is unavailable: GPU is lost." in message
    assert error.unavailable == 1


def test_refusal_lists_several_unhealthy_reasons_with_counts():
    gpus = host("a", A100, 4)
    inventory = [broken(gpus[0], "XID 79"), broken(gpus[1]), broken(gpus[2]), gpus[3]]
    message = str(refusal(inventory, {"a-3"}, GPURequest("alice", 1)))
    assert "0 of 1 free. 3 more are unavailable: GPU is lost (2), XID 79 (1)." in message


def test_refusal_when_every_matching_gpu_is_unhealthy():
    inventory = [broken(g, "GPU is lost.") for g in host("a", A100, 2)] + host("t", T4, 1)
    error = refusal(inventory, set(), GPURequest("alice", 1, ("a100",)))
    assert str(error) == (
        f"No {A100} is usable right now: 2 of 2 are unavailable (GPU is lost). "
        f"{T4} has 1 free. Pick another model or try again later."
    )
    assert error.code == "none_usable"


def test_refusal_unknown_model_lists_models_here():
    inventory = host("a", A100, 2) + host("t", T4, 2)
    error = refusal(inventory, set(), GPURequest("alice", 1, ("h100",)))
    assert str(error) == (
        f"This hub has no GPU matching 'h100'. Models here: {A100}, {T4}."
    )
    assert error.code == "no_matching_model"


def test_refusal_larger_than_any_machine():
    inventory = host("a1", A100, 4) + host("a2", A100, 4)
    error = refusal(inventory, set(), GPURequest("alice", 6, ("a100",)))
    assert str(error) == (
        f"6 x {A100} were requested but no machine here has more than 4 {A100}. "
        "Ask for 4 or fewer."
    )
    assert error.code == "exceeds_host_size"
    assert error.max_on_one_host == 4


def test_refusal_larger_than_any_machine_for_any_model_says_one_model():
    inventory = host("h", A100, 2) + host("h", T4, 2, first=2)
    message = str(refusal(inventory, set(), GPURequest("alice", 3)))
    assert message == (
        "3 GPUs were requested but no machine here has more than 2 GPUs of one model. "
        "Ask for 2 or fewer."
    )


def test_refusal_counts_unhealthy_gpus_towards_machine_size():
    gpus = host("a", A100, 4)
    inventory = gpus[:2] + [broken(g) for g in gpus[2:]]
    error = refusal(inventory, set(), GPURequest("alice", 3))
    assert error.code == "not_enough_on_one_host"
    assert "2 more are unavailable: GPU is lost." in str(error)


def test_refusal_empty_inventory():
    error = refusal([], set(), GPURequest("alice", 1))
    assert "no GPUs" in str(error)
    assert error.code == "no_gpus"


def test_refusal_suggests_several_alternatives():
    inventory = host("a", A100, 1) + host("t", T4, 3) + host("h", H100, 2)
    message = str(refusal(inventory, {"a-0"}, GPURequest("alice", 1, ("a100",))))
    assert f"Other models with room: {H100} (2 free), {T4} (3 free)." in message


# --------------------------------------------------------------------------
# Model names
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shown"),
    [(A100, "A100-SXM4-80GB"), (T4, "Tesla T4"), (H100, "H100 80GB HBM3"), ("NVIDIA", "NVIDIA")],
)
def test_display_name(name, shown):
    assert display_name(name) == shown


def test_one_reading_is_indexed_once_whatever_is_held(monkeypatch):
    """An inventory reading keeps one GPUs tuple: placing from it (a spawn, the never-fits check of every
    queued request) indexes it once (10,000 GPUs: 20 ms a time), and each placement still sees what is held."""
    from gpuspawner.inventory import InventoryReading
    from gpuspawner.placement import PlacementIndex, never_fits

    built = []
    index = PlacementIndex.__init__
    monkeypatch.setattr(PlacementIndex, "__init__", lambda self, gpus: built.append(1) or index(self, gpus))
    reading = InventoryReading(tuple(host("h1", A100, 2) + host("h2", T4, 1))).gpus
    assert uuids(place(reading, set(), GPURequest("ann", 1, ("a100",)))) == ["h1-0"]
    assert uuids(place(reading, {"h1-0"}, GPURequest("bob", 1, ("a100",)))) == ["h1-1"]
    assert "0 of 2 free" in str(refusal(reading, {"h1-0", "h1-1"}, GPURequest("cy", 1, ("a100",))))
    assert never_fits(reading, GPURequest("dan", 3, ("a100",))) is not None
    assert never_fits(reading, GPURequest("eve", 2, ("a100",))) is None
    assert len(built) == 1
    place(list(reading), set(), GPURequest("fay", 1, ()))  # a list may change: indexed each time
    assert len(built) == 2
    place(tuple(reading), set(), GPURequest("fay", 1, ()))  # nor is a plain tuple anyone's reading
    assert len(built) == 3
