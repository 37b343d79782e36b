"""gpu-kube's bookings pieces (gpuspawner.backends.kube.booked): which pools a request is judged on,
and a choice sent to the models the bookings leave it."""

from __future__ import annotations

from gpuspawner.backends.kube.booked import narrowed, requestable
from gpuspawner.backends.kube.capacity import NodeGPUs, NodePool
from gpuspawner.profiles import Choice, load_profiles

A100, H100, MIG = "a100-sxm4-80gb", "h100-sxm5-80gb", "mig-1g-10gb-a100-sxm4-80gb"


def pool(slug: str, kind: str, resource: str, allocatable: int, used: int) -> NodePool:
    return NodePool(slug, kind, slug.upper(), resource, slug.upper(), allocatable, used)


NODES = (
    NodeGPUs("a", True, None, None, (pool(A100, "gpu", "nvidia.com/gpu", 8, 5),)),
    NodeGPUs("h", True, None, None, (pool(H100, "gpu", "nvidia.com/gpu", 4, 4),)),
    NodeGPUs("m", True, None, None, (pool(MIG, "mig", "nvidia.com/mig-1g.10gb", 7, 1),)),
    NodeGPUs("down", False, None, None, (pool(A100, "gpu", "nvidia.com/gpu", 8, 0),)),
)


def test_a_request_is_judged_on_the_free_gpus_of_the_pools_it_could_use():
    assert requestable(NODES, ("a100",)) == {A100: 3}  # a cordoned node's GPUs are not free
    assert requestable(NODES, ()) == {A100: 3, H100: 0}  # any whole GPU: no MIG slice
    assert requestable(NODES, ("mig",)) == {MIG: 6}


def test_a_choice_of_several_models_is_sent_to_those_the_bookings_leave_it():
    [profile] = load_profiles([{"slug": "gpu", "display_name": "GPU", "gpu_models": ["a100", "h100"],
                                "gpu_counts": [1, 2]}])
    choice = Choice(profile, 2)
    assert narrowed(choice, [H100]).models == (H100,)
    assert narrowed(choice, [A100, H100]).models == (A100, H100)
    assert narrowed(choice, [H100]).gpus == 2 and narrowed(choice, [H100]).profile.slug == "gpu"
