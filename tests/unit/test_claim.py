"""The one reservation path (``GPUSpawnerMixin.reserve_gpus``) and its one hook, ``claim(choice)``.

A backend says only what it takes for a choice; the shared steps (progress, the release of a
failed earlier start's hold, the CPU-only shortcut, a refusal as HTTP 409 with its sentence)
are the mixin's. Where the runtime picks other GPUs than the hub's claim named (gpu-swarm),
``correct_claim`` is the second step; the real swarm shows it in
tests/docker/test_swarm_spawner.py, the case of two starts in flight is here.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tornado import web
from traitlets.config import Config

from gpuspawner.backends.claim import Claim
from gpuspawner.profiles import Choice, load_profiles
from gpuspawner.refusals import PlacementError

A100 = "NVIDIA A100-SXM4-80GB"
STATIC = [{"uuid": f"GPU-{host}-{i}", "name": A100, "host": host, "index": i} for host in ("h1", "h2") for i in (0, 1)]
PROFILE = load_profiles([{"display_name": "GPU", "gpu_models": ["a100"], "gpu_counts": [0, 1, 2]}])[0]


def spawner(user: str, cls=None, state=None):
    from jupyterhub.spawner import Spawner

    from gpuspawner.backends.base import GPUSpawnerMixin

    class HubPlaces(GPUSpawnerMixin, Spawner):
        pass

    made = (cls or HubPlaces)(config=Config({"GPUHubSettings": {"gpu_inventory": "static", "static_gpus": STATIC}}),
                              user=SimpleNamespace(name=user, groups=[], url="/", id=1))
    if state is not None:
        made.hub_state = state
    return made


def choose(s, gpus: int):
    s.gpu_choice = Choice(PROFILE, gpus, "a100")
    return s


def progress(s) -> list[str]:
    return [e["message"] for e in s._gpu_events]


async def test_the_hub_places_exact_gpus_and_a_later_start_first_gives_back_a_failed_ones_hold(fresh_metrics):
    ada = choose(spawner("ada"), 2)
    first = await ada.reserve_gpus()
    assert [g.uuid for g in first] == ["GPU-h1-0", "GPU-h1-1"]
    assert ada.ledger.allocations() == {"ada/": ("GPU-h1-0", "GPU-h1-1")}
    assert progress(ada) == ["Placing 2 GPU(s), a100",
                             f"Reserved 2 GPU(s) on h1: {A100} #0 (GPU-h1-0), {A100} #1 (GPU-h1-1)"]
    choose(ada, 0)  # the same server again (its first start failed), now CPU-only: it holds nothing
    assert await ada.reserve_gpus() == () and ada.ledger.allocations() == {}
    assert progress(ada) == ["Placing a CPU-only server (no GPU)"]


async def test_a_backends_claim_is_all_it_writes_the_refusal_and_its_words_are_the_mixins(fresh_metrics):
    from jupyterhub.spawner import Spawner

    from gpuspawner.backends.base import GPUSpawnerMixin

    class ClusterPlaces(GPUSpawnerMixin, Spawner):
        """A backend whose cluster places: it counts a resource, within the quotas."""

        room = 1
        opening_words = ("Asking the cluster for {}", "Starting {}")

        async def claim(self, choice):
            refusal = None if choice.gpus <= self.room else PlacementError("No room for that now.", code="none_free")
            self.claim_cluster_gpus(self.gpu_request(choice), {"example.com/gpu": choice.gpus}, refusal)
            return Claim(count=choice.gpus, resource="example.com/gpu", progress=f"Counted {choice.gpus}")

        def apply_claim(self, claim):
            self.applied = claim

    bob = choose(spawner("bob", ClusterPlaces), 1)
    assert await bob.reserve_gpus() == ()
    assert bob.applied.count == 1 and list(bob.ledger.allocations()) == ["bob/"]
    assert progress(bob) == ["Asking the cluster for 1 GPU(s), a100", "Counted 1"]

    choose(bob, 2)
    with pytest.raises(web.HTTPError) as refused:
        await bob.reserve_gpus()
    assert refused.value.status_code == 409
    assert progress(bob)[-1] == f"Refused: {refused.value.jupyterhub_message}"
    assert bob.ledger.allocations() == {}  # the earlier hold given back, nothing new held

    choose(bob, 0)
    assert await bob.reserve_gpus() == () and bob.applied == Claim()
    assert progress(bob) == ["Starting a CPU-only server (no GPU)"]


async def test_a_correction_to_a_gpu_another_start_holds_swaps_it_for_one_the_runtime_left_free(fresh_metrics):
    cy = choose(spawner("cy"), 1)
    dee = choose(spawner("dee", state=cy.hub_state), 1)
    await cy.reserve_gpus()
    await dee.reserve_gpus()
    assert cy.gpu_uuids == ("GPU-h1-0",) and dee.gpu_uuids == ("GPU-h1-1",)
    cy.correct_claim(("GPU-h1-1",))  # the runtime gave cy the GPU the hub had picked for dee, while dee starts
    assert cy.gpu_uuids == ("GPU-h1-1",)
    assert cy.ledger.allocations() == {"cy/": ("GPU-h1-1",), "dee/": ("GPU-h1-0",)}
    assert progress(cy)[-1] == "The cluster assigned GPU(s) GPU-h1-1"
    dee.correct_claim(("GPU-h2-0",))  # and dee got one on the other node: cy's old pick is free again
    assert cy.ledger.allocations() == {"cy/": ("GPU-h1-1",), "dee/": ("GPU-h2-0",)}
    events = len(progress(dee))
    dee.correct_claim(("GPU-h2-0",))  # the runtime says it again: nothing changes
    assert len(progress(dee)) == events and dee.gpu_uuids == ("GPU-h2-0",)
