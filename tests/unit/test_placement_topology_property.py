"""Property tests of topology-aware placement (hypothesis).

On random hosts (random link words between their GPUs, one or two models,
random GPUs already held):

* placement never returns a set of a worse connectivity class while a set of
  the same size and a better class is free on some acceptable (host, model);
* it refuses only when no (host, model) has that many free;
* it never returns a held GPU nor one GPU twice;
* the ledger's kept free state decides exactly as a decision from scratch,
  through any sequence of reserves and releases, and never holds a GPU twice.
"""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings, strategies as st

from gpuspawner.gpu import GPU, model_rank
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest, PlacementError, place, set_class_of
from gpuspawner.topology import CLASS_NAMES

WORDS = ("NV1", "NV2", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS")
MODELS = ("NVIDIA A100-SXM4-80GB", "Tesla T4")


@st.composite
def hosts(draw) -> list[GPU]:
    gpus: list[GPU] = []
    for h in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 6))
        name = draw(st.sampled_from(MODELS))
        words = {(i, j): draw(st.sampled_from(WORDS)) for i in range(n) for j in range(i + 1, n)}
        for i in range(n):
            links = tuple((j, words[min(i, j), max(i, j)]) for j in range(n) if j != i)
            healthy = draw(st.booleans()) or draw(st.booleans()) or draw(st.booleans())  # mostly healthy
            gpus.append(GPU(f"host{h}", i, f"GPU-{h}-{i}", name, links=links, healthy=healthy, reason=None))
    return gpus


def class_rank(gpus) -> int:
    return CLASS_NAMES.index(set_class_of(gpus))


def free_sets(gpus: list[GPU], held: set[str], count: int, models: tuple[str, ...]):
    """Every set of ``count`` free GPUs of one acceptable (host, model): the brute force."""
    groups: dict[tuple[str, str], list[GPU]] = {}
    for g in gpus:
        if g.healthy and g.uuid not in held and model_rank(models, g.model) is not None:
            groups.setdefault((g.host, g.model), []).append(g)
    for group in groups.values():
        yield from combinations(group, count)


@settings(max_examples=150, deadline=None)
@given(hosts(), st.data())
def test_never_a_worse_connected_set_and_never_a_gpu_twice(gpus, data):
    held = set(data.draw(st.sets(st.sampled_from([g.uuid for g in gpus])))) if gpus else set()
    count = data.draw(st.integers(1, 6))
    models = data.draw(st.sampled_from([(), ("a100",), ("t4", "a100")]))
    candidates = list(free_sets(gpus, held, count, models))
    try:
        got = place(gpus, held, GPURequest("u", count, models))
    except PlacementError:
        assert candidates == []
        return
    assert len(got) == count and len({g.uuid for g in got}) == count
    assert not {g.uuid for g in got} & held and all(g.healthy for g in got)
    assert len({(g.host, g.model) for g in got}) == 1
    assert class_rank(got) == min(class_rank(c) for c in candidates)


@settings(max_examples=80, deadline=None)
@given(hosts(), st.lists(st.tuples(st.booleans(), st.integers(1, 4), st.integers(0, 5)), max_size=25))
def test_ledger_state_decides_as_from_scratch(gpus, steps):
    ledger = Ledger()
    inventory = tuple(gpus)
    for n, (reserve, count, who) in enumerate(steps):
        owner = f"user{who}"
        if not reserve or owner in ledger.allocations():
            ledger.release(owner)
            continue
        held = set(ledger.held())
        try:
            expected = place(list(inventory), held, GPURequest(owner, count))
        except PlacementError as e:
            expected = str(e)
        try:
            got = ledger.reserve(inventory, GPURequest(owner, count))
        except PlacementError as e:
            got = str(e)
        assert got == expected, f"step {n}"
        holdings = [u for uuids in ledger.allocations().values() for u in uuids]
        assert len(holdings) == len(set(holdings))


@settings(max_examples=100, deadline=None)
@given(hosts(), st.data())
def test_nvlink_requirement_gives_only_linked_sets(gpus, data):
    held = set(data.draw(st.sets(st.sampled_from([g.uuid for g in gpus])))) if gpus else set()
    count = data.draw(st.integers(2, 5))
    linked = [c for c in free_sets(gpus, held, count, ()) if class_rank(c) <= 1]
    try:
        got = place(gpus, held, GPURequest("u", count, interconnect="nvlink"))
    except PlacementError as e:
        assert linked == []
        assert e.code in ("no_nvlink_set", "no_nvlink_host") or not list(free_sets(gpus, held, count, ()))
        return
    assert class_rank(got) <= 1 and not {g.uuid for g in got} & held
