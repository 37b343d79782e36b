"""Pure GPU placement: which free GPUs a request gets, or why it gets none.

Nothing here does I/O or keeps state. :func:`place` looks at an inventory of
:class:`~gpuspawner.gpu.GPU` records and the set of UUIDs already given out,
and either returns the GPUs for one request or raises
:class:`~gpuspawner.refusals.PlacementError`, whose message (worded in
:mod:`gpuspawner.refusals`) is a sentence a data scientist can act on.

Rules, in short:

* only healthy GPUs that are not held are candidates;
* all GPUs of one request live on one host and are of one model;
* among the (host, model) groups that can satisfy a request, the group with
  the fewest free GPUs wins (best fit), so large requests keep finding room
  on emptier hosts; ties go to the model listed first in the request, then
  the host name, then the model slug;
* inside the chosen group the lowest indexes are taken;
* the answer depends only on the inputs' content, never on their order.

The decision is linear in the inventory size plus a sort of the chosen group.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence, Set as AbstractSet
from dataclasses import dataclass

from gpuspawner.gpu import GPU, model_rank
from gpuspawner.refusals import PlacementError, explain_refusal

__all__ = [
    "GPURequest",
    "PlacementError",  # what place() raises; defined in gpuspawner.refusals
    "place",
]

ANY_MODEL = "any"

@dataclass(frozen=True)
class GPURequest:
    """What one user server asks for.

    ``models`` holds patterns for :func:`~gpuspawner.gpu.slug_matches`, in
    order of preference; ``()`` or a tuple containing ``"any"`` accepts any
    model. Patterns are normalised to stripped lower case, and a single string
    is accepted as a one-element tuple.
    """

    owner: str
    count: int
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.owner, str) or not self.owner:
            raise ValueError("GPURequest.owner must be a non-empty string")
        if isinstance(self.count, bool) or not isinstance(self.count, int):
            raise ValueError(f"GPURequest.count must be an int, got {self.count!r}")
        if self.count < 0:
            raise ValueError(f"GPURequest.count must be >= 0, got {self.count}")
        models = (self.models,) if isinstance(self.models, str) else tuple(self.models)
        cleaned = tuple(p.strip().lower() for p in models if p and p.strip())
        object.__setattr__(self, "models", cleaned)

    @property
    def any_model(self) -> bool:
        """Whether every model is acceptable."""
        return not self.models or ANY_MODEL in self.models


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


def _as_set(held: Collection[str]) -> AbstractSet[str]:
    """``held`` with O(1) membership tests."""
    return held if isinstance(held, AbstractSet) else frozenset(held)


def _as_sequence(inventory: Iterable[GPU]) -> Sequence[GPU]:
    """``inventory`` in a form that can be walked more than once."""
    return inventory if isinstance(inventory, (tuple, list)) else tuple(inventory)


# --------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------


def _free_groups(
    inventory: Iterable[GPU], held: AbstractSet[str], models: tuple[str, ...]
) -> tuple[dict[tuple[str, str], list[GPU]], dict[str, int]]:
    """Free, healthy, acceptable GPUs grouped by (host, slug), plus slug ranks."""
    groups: dict[tuple[str, str], list[GPU]] = {}
    ranks: dict[str, int | None] = {}
    for gpu in inventory:
        if not gpu.healthy or gpu.uuid in held:
            continue
        slug = gpu.model
        if slug not in ranks:
            ranks[slug] = model_rank(models, slug)
        if ranks[slug] is None:
            continue
        key = (gpu.host, slug)
        group = groups.get(key)
        if group is None:
            groups[key] = [gpu]
        else:
            group.append(gpu)
    return groups, {slug: rank for slug, rank in ranks.items() if rank is not None}


def _best_group(
    groups: dict[tuple[str, str], list[GPU]], ranks: dict[str, int], count: int
) -> list[GPU] | None:
    """The smallest group holding at least ``count`` GPUs, ties per the module rules."""
    best_key: tuple[int, int, str, str] | None = None
    best: list[GPU] | None = None
    for (host, slug), group in groups.items():
        if len(group) < count:
            continue
        key = (len(group), ranks[slug], host, slug)
        if best_key is None or key < best_key:
            best_key, best = key, group
    return best


def place(inventory: Iterable[GPU], held: Collection[str], request: GPURequest) -> tuple[GPU, ...]:
    """Choose ``request.count`` GPUs for ``request``, or raise :class:`PlacementError`.

    ``held`` holds the UUIDs already allocated. The result is ordered by
    index. Inventory UUIDs are assumed unique. See the module docstring for
    the rules.
    """
    if request.count == 0:
        return ()
    gpus = _as_sequence(inventory)
    held_set = _as_set(held)
    groups, ranks = _free_groups(gpus, held_set, request.models)
    group = _best_group(groups, ranks, request.count)
    if group is None:
        raise explain_refusal(gpus, held_set, request)
    chosen = sorted(group, key=lambda gpu: (gpu.index, gpu.uuid))[: request.count]
    return tuple(chosen)
