"""A request that could never be placed on this hub: refused at once with placement's own sentence, never
queued, never offered as a job's compute type (gpuspawner.placement.never_fits, hub.jobs.compute_types)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from gpuspawner.availability import model_availability
from gpuspawner.form import form_context
from gpuspawner.gpu import GPU, model_rank
from gpuspawner.hub.jobs import compute_types
from gpuspawner.inventory import InventoryReading
from gpuspawner.placement import GPURequest, PlacementError, never_fits, place
from gpuspawner.profiles import load_profiles

NAMES = ("NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H100 80GB HBM3")


@st.composite
def inventories(draw) -> list[GPU]:
    gpus = []
    for h in range(draw(st.integers(0, 3))):
        for name in draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True)):
            for i in range(draw(st.integers(1, 4))):
                gpus.append(GPU(host=f"node{h}", index=len([g for g in gpus if g.host == f"node{h}"]),
                                uuid=f"GPU-{h}-{name}-{i}", name=name, healthy=draw(st.booleans())))
    return gpus


requests = st.builds(
    lambda count, models: GPURequest(owner="u/", count=count, models=models),
    st.integers(0, 6), st.sampled_from([(), ("a100",), ("t4",), ("h100", "t4"), ("v100",)]),
)


@settings(max_examples=300, deadline=None)
@given(inventories(), requests)
def test_never_fits_exactly_when_no_machine_has_that_many_of_a_model_asked_for(gpus, request):
    refusal = never_fits(gpus, request)
    per_machine = Counter((g.host, g.model) for g in gpus if model_rank(request.models, g.model) is not None)
    most = max(per_machine.values(), default=0)
    assert (refusal is not None) == (request.count > most)
    if refusal is not None:
        assert refusal.code in ("no_gpus", "no_matching_model", "exceeds_host_size")
        with pytest.raises(PlacementError) as placed:  # the same sentence placement gives, whatever is held
            place(gpus, (), request)
        assert str(placed.value) == str(refusal)
    elif all(g.healthy for g in gpus):
        assert len(place(gpus, (), request)) == request.count  # with every GPU free, it fits


def test_the_sentence_says_why_it_never_fits():
    gpus = [GPU("vm", i, f"GPU-{i}", "Tesla T4") for i in range(2)]
    refusal = never_fits(gpus, GPURequest("u/", 4, ("t4",)))
    assert str(refusal) == ("4 x Tesla T4 were requested but no machine here has more than 2 Tesla T4. "
                            "Ask for 2 or fewer.")


def test_an_nvlink_set_no_machine_has_never_fits():
    gpus = [GPU("vm", i, f"GPU-{i}", "Tesla T4", links=((1 - i, "PHB"),)) for i in range(2)]
    refusal = never_fits(gpus, GPURequest("u/", 2, ("t4",), interconnect="nvlink"))
    assert refusal is not None and refusal.code == "no_nvlink_host"


# ------------------------------------------------------------------ job compute types


def test_compute_types_leave_out_counts_no_machine_could_ever_hold():
    gpus = tuple([GPU("a", i, f"GPU-a{i}", "Tesla T4") for i in range(2)]
                 + [GPU("b", i, f"GPU-b{i}", "NVIDIA A100-SXM4-80GB") for i in range(4)])
    profiles = load_profiles([{"slug": "cpu", "display_name": "CPU", "gpu_counts": [0]},
                              {"slug": "gpu", "display_name": "GPU", "gpu_counts": [1, 2, 4], "default": True},
                              {"slug": "q", "display_name": "Queued", "gpu_counts": [4], "queue": True}])
    held = {"GPU-b0"}
    context = form_context(profiles, InventoryReading(gpus=gpus), held)

    async def refuse(choice):
        return never_fits(gpus, GPURequest("u/job/x", choice.gpus, choice.models))

    types = asyncio.run(compute_types(context, refuse))
    labels = [t["label"] for t in types]
    assert labels == ["CPU only", "1 x NVIDIA A100-SXM4-80GB", "1 x Tesla T4", "2 x NVIDIA A100-SXM4-80GB",
                      "2 x Tesla T4", "4 x NVIDIA A100-SXM4-80GB"]  # never 4 x Tesla T4: no machine has 4
    four = types[-1]
    assert four["fits_now"] is False and (four["free"], four["total"]) == (3, 4)
    assert {m.slug: m.most_on_one_host for m in model_availability(gpus, held)} == {"a100-sxm4-80gb": 4, "t4": 2}
