"""Pure GPU placement: which free GPUs a request gets, or why it gets none.

:func:`place` looks at an inventory of :class:`~gpuspawner.gpu.GPU` records
and the set of UUIDs already given out, and either returns the GPUs for one
request or raises :class:`~gpuspawner.refusals.PlacementError`, whose message
(worded in :mod:`gpuspawner.refusals`) is a sentence a data scientist can act
on. The answer depends only on the inputs' content, never on their order.

Rules:

* only healthy GPUs that are not held are candidates;
* all GPUs of one request live on one host and are of one model (a *group*:
  the free GPUs of one (host, model));
* **connectivity first**: of all the sets of ``count`` free GPUs in all
  groups, the best-connected class wins (:mod:`gpuspawner.topology`:
  NVLink all-to-all > NVLink through a neighbour > one PCIe switch > several
  switches > one host bridge > one NUMA node > across sockets > unknown). A
  request is never given a worse-connected set while a better one of its size
  is free;
* **then packing**: among the groups that offer that class, the group with
  the fewest free GPUs wins (best fit), so large requests keep finding empty
  hosts; ties go to the model listed first in the request, then the host
  name, then the model slug;
* inside the group, among the sets of the best class: the most NVLink links
  and closest pairs (lowest sum of pair levels), then the set that leaves the
  fewest closely linked (NVLink or PIX) free GPUs orphaned beside it, then
  the lowest indexes.

Why connectivity before packing: on hosts whose GPUs are all alike connected
(an NVSwitch box, a box of unknown topology) every set of a host is of one
class and the rule is plain best fit, as before. Only where a host mixes
NVLink and PCIe does a request open an emptier host rather than take badly
connected GPUs; ``benchmarks/placement.py`` measures what that costs large
requests (the refusals under a replayed arrival stream) against what it
gives (the share of multi-GPU requests on NVLink).

``GPURequest.interconnect = "nvlink"`` (the profile key ``"interconnect"``)
accepts only NVLink-connected sets; without one free the request is refused
with the sentence of :func:`~gpuspawner.refusals.explain_interconnect`.

Speed: :class:`PlacementIndex` groups an inventory once (hosts of the same
layout share one table of best sets per free-GPU mask, memoised), and a
:class:`FreeState` keeps the groups bucketed by their free mask, updated as
GPUs are taken and given back (the ledger keeps one). A decision then visits
the masks of each (model, layout), not the GPUs. Groups of more than
:data:`MAX_SCORED` GPUs are placed on their lowest free indexes, scored but
not searched.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Iterator, Sequence, Set as AbstractSet
from dataclasses import replace
from itertools import combinations
from typing import NamedTuple

from gpuspawner.availability import ModelAvailability, by_model
from gpuspawner.gpu import GPU, model_rank, per_gpus
from gpuspawner.refusals import WAITABLE, PlacementError, explain_interconnect, explain_refusal
from gpuspawner.request import GPURequest
from gpuspawner.topology import CLASS_NAMES, INTERCONNECTS, NVLINK_CLASSES, level_rank, nvlink_count, set_class

__all__ = [
    "GPURequest",  # what place() is asked; defined in gpuspawner.request
    "PlacementError",  # what place() raises; defined in gpuspawner.refusals
    "PlacementIndex",
    "FreeState",
    "INTERCONNECTS",
    "never_fits",
    "place",
    "place_in",
    "set_class_of",
]

#: Groups up to this many GPUs are searched for their best set.
MAX_SCORED = 12


# --------------------------------------------------------------------------
# Layouts: the best set of k GPUs for each free mask, shared by alike hosts
# --------------------------------------------------------------------------


class _Layout(NamedTuple):
    """The links among a group's GPUs (positions 0..n-1 in index order): hashable, shared."""

    n: int
    rank: tuple[tuple[int, ...], ...]  # level_rank per pair
    nvlinks: tuple[tuple[int, ...], ...]  # NVLink link count per pair


def _layout(gpus: Sequence[GPU]) -> _Layout:
    n = len(gpus)
    position = {gpu.index: i for i, gpu in enumerate(gpus)}
    rank = [[0] * n for _ in range(n)]
    nv = [[0] * n for _ in range(n)]
    known = [[False] * n for _ in range(n)]
    for i, gpu in enumerate(gpus):
        for peer, level in gpu.links:
            j = position.get(peer)
            if j is None or j == i:
                continue
            # both ends should agree; where they do not, the worse word counts
            r = level_rank(level)
            if not known[i][j] or r > rank[i][j]:
                rank[i][j] = rank[j][i] = r
                nv[i][j] = nv[j][i] = nvlink_count(level)
                known[i][j] = known[j][i] = True
    for i in range(n):
        for j in range(n):
            if i != j and not known[i][j]:
                rank[i][j] = level_rank(None)
    return _Layout(n, tuple(map(tuple, rank)), tuple(map(tuple, nv)))


def _members(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


@functools.lru_cache(maxsize=1 << 16)
def _best(layout: _Layout, mask: int, k: int) -> tuple[int, int]:
    """(class, chosen mask) of the best set of ``k`` positions in ``mask`` (the module's rules)."""
    free = _members(mask)
    if layout.n > MAX_SCORED:
        chosen = free[:k]
        return set_class(layout.n, layout.rank, chosen), sum(1 << i for i in chosen)
    rank, nv = layout.rank, layout.nvlinks
    best_key: tuple | None = None
    best_set: tuple[int, ...] = ()
    for chosen in combinations(free, k):
        cls = set_class(layout.n, rank, chosen)
        pairs = sum(rank[i][j] for a, i in enumerate(chosen) for j in chosen[a + 1:])
        links = sum(nv[i][j] for a, i in enumerate(chosen) for j in chosen[a + 1:])
        rest = [j for j in free if j not in chosen]
        orphaned = sum(1 for i in chosen for j in rest if rank[i][j] <= 1)
        key = (cls, pairs, -links, orphaned)
        if best_key is None or key < best_key:  # combinations() come in index order: ties keep the lowest
            best_key, best_set = key, chosen
    return best_key[0] if best_key else 0, sum(1 << i for i in best_set)


@functools.lru_cache(maxsize=4096)
def _order(layout: _Layout, k: int) -> tuple[tuple[int, int, int], ...]:
    """Every free mask holding ``k`` or more GPUs as (class, free count, mask), best first."""
    if layout.n > MAX_SCORED:
        return ()  # large groups: see FreeState._large
    masks = [m for m in range(1, 1 << layout.n) if m.bit_count() >= k]
    return tuple(sorted((_best(layout, m, k)[0], m.bit_count(), m) for m in masks))


def set_class_of(gpus: Sequence[GPU]) -> str:
    """The connectivity class name (:data:`~gpuspawner.topology.CLASS_NAMES`) of GPUs of one host."""
    ordered = sorted(gpus, key=lambda g: (g.index, g.uuid))
    layout = _layout(ordered)
    return CLASS_NAMES[set_class(layout.n, layout.rank, range(layout.n))]


# --------------------------------------------------------------------------
# Index and free state
# --------------------------------------------------------------------------


class _Group(NamedTuple):
    host: str
    slug: str
    gpus: tuple[GPU, ...]  # healthy, by (index, uuid): bit i is gpus[i]
    kind: int  # index into PlacementIndex.kinds: (slug, layout)


def _index_order(gpu: GPU) -> tuple[int, str]:
    return gpu.index, gpu.uuid


class PlacementIndex(Sequence[GPU]):
    """An inventory grouped for placement; a sequence of the GPUs it was built from.

    Build it once per inventory reading (the ledger does) and pass it to
    :func:`place` as the inventory.
    """

    def __init__(self, inventory: Iterable[GPU]) -> None:
        self.gpus: tuple[GPU, ...] = tuple(inventory)
        by_key: dict[tuple[str, str], list[GPU]] = {}
        unhealthy: list[GPU] = []
        self.names: dict[str, str] = {}  # slug -> its alphabetically first name, as availability names it
        names = self.names
        for gpu in self.gpus:
            slug = gpu.model
            if slug not in names or gpu.name < names[slug]:
                names[slug] = gpu.name
            if gpu.healthy:
                key = (gpu.host, slug)
                group = by_key.get(key)
                if group is None:
                    by_key[key] = [gpu]
                else:
                    group.append(gpu)
            else:
                unhealthy.append(gpu)
        self.unhealthy: tuple[GPU, ...] = tuple(unhealthy)
        kinds: dict[tuple[str, int], int] = {}  # (slug, layout number) -> kind
        layouts: dict[tuple, int] = {}  # links signature -> layout number
        layout_list: list[_Layout] = []
        self.groups: list[_Group] = []
        self.position: dict[str, tuple[int, int]] = {}  # uuid -> (group, bit)
        self.kinds: list[tuple[str, _Layout]] = []
        self.kinds_of: dict[str, list[int]] = {}
        for gid, key in enumerate(sorted(by_key)):  # group order = host order per slug
            members = by_key[key]
            members.sort(key=_index_order)
            signature = tuple([(g.index, g.links) for g in members])
            number = layouts.get(signature)
            if number is None:
                number = layouts[signature] = len(layout_list)
                layout_list.append(_layout(members))
            kind = kinds.get((key[1], number))
            if kind is None:
                kind = kinds[(key[1], number)] = len(self.kinds)
                self.kinds.append((key[1], layout_list[number]))
                self.kinds_of.setdefault(key[1], []).append(kind)
            self.groups.append(_Group(key[0], key[1], tuple(members), kind))
            for bit, gpu in enumerate(members):
                self.position[gpu.uuid] = (gid, 1 << bit)
        self._held_id: int | None = None
        self._held_state: FreeState | None = None
        self._in_service: dict[str, ModelAvailability] | None = None

    def __len__(self) -> int:
        return len(self.gpus)

    def __getitem__(self, i):  # type: ignore[override]
        return self.gpus[i]

    def __iter__(self) -> Iterator[GPU]:
        return iter(self.gpus)

    def in_service(self) -> dict[str, ModelAvailability]:
        """Slug -> availability with nothing held (:mod:`gpuspawner.availability`), tallied once."""
        if self._in_service is None:
            self._in_service = by_model(self.gpus, ())
        return self._in_service

    def state(self, held: Collection[str]) -> FreeState:
        """The free state for ``held``; kept for the last frozenset passed (it cannot change)."""
        if isinstance(held, frozenset):
            if self._held_id == id(held) and self._held_state is not None and self._held_state.held is held:
                return self._held_state
            state = FreeState(self, held)
            state.held = held
            self._held_id, self._held_state = id(held), state
            return state
        return FreeState(self, held)


class FreeState:
    """Which GPUs of an index are free, bucketed by (kind, free mask); updated in place."""

    def __init__(self, index: PlacementIndex, held: Iterable[str] = ()) -> None:
        self.index = index
        self.held: frozenset[str] | None = None  # set by PlacementIndex.state for its memo
        self.masks = [(1 << len(g.gpus)) - 1 for g in index.groups]
        position = index.position
        for uuid in held:
            where = position.get(uuid)
            if where is not None:
                self.masks[where[0]] &= ~where[1]
        self.buckets: dict[tuple[int, int], set[int]] = {}
        for gid, group in enumerate(index.groups):
            if self.masks[gid]:
                self.buckets.setdefault((group.kind, self.masks[gid]), set()).add(gid)

    def _move(self, gid: int, new: int) -> None:
        kind = self.index.groups[gid].kind
        old = self.masks[gid]
        if old == new:
            return
        if old:
            bucket = self.buckets[(kind, old)]
            bucket.discard(gid)
            if not bucket:
                del self.buckets[(kind, old)]
        if new:
            self.buckets.setdefault((kind, new), set()).add(gid)
        self.masks[gid] = new

    def take(self, uuids: Iterable[str]) -> None:
        """Mark ``uuids`` held (those not in the index are ignored)."""
        for uuid in uuids:
            where = self.index.position.get(uuid)
            if where is not None:
                self._move(where[0], self.masks[where[0]] & ~where[1])

    def give(self, uuids: Iterable[str]) -> None:
        """Mark ``uuids`` free again."""
        for uuid in uuids:
            where = self.index.position.get(uuid)
            if where is not None:
                self._move(where[0], self.masks[where[0]] | where[1])

    def availability(self) -> dict[str, ModelAvailability]:
        """Slug -> :class:`~gpuspawner.availability.ModelAvailability` now (what refusals count).

        The parts that do not depend on what is held come from the index
        (tallied once); free and largest from the free masks.
        """
        free: dict[str, int] = {}
        largest: dict[str, int] = {}
        for gid, group in enumerate(self.index.groups):
            n = self.masks[gid].bit_count()
            free[group.slug] = free.get(group.slug, 0) + n
            if n > largest.get(group.slug, 0):
                largest[group.slug] = n
        return {
            slug: replace(m, free=free.get(slug, 0), largest=largest.get(slug, 0))
            for slug, m in self.index.in_service().items()
        }

    def _large(self, kind: int, k: int) -> Iterator[tuple[int, int, int]]:
        """(class, free count, mask) of the masks present for a kind of more than MAX_SCORED GPUs."""
        layout = self.index.kinds[kind][1]
        present = sorted(
            (_best(layout, mask, k)[0], mask.bit_count(), mask)
            for (kd, mask) in self.buckets
            if kd == kind and mask.bit_count() >= k
        )
        yield from present

    def choose(self, count: int, models: tuple[str, ...], max_class: int | None) -> tuple[GPU, ...] | None:
        """The GPUs of the best set per the module's rules, or None when none fits."""
        index = self.index
        best: tuple | None = None
        for slug, kinds in index.kinds_of.items():
            rank = model_rank(models, slug)
            if rank is None:
                continue
            for kind in kinds:
                layout = index.kinds[kind][1]
                if layout.n < count:
                    continue
                order = _order(layout, count) if layout.n <= MAX_SCORED else self._large(kind, count)
                found: tuple[int, int] | None = None
                for cls, free, mask in order:
                    if max_class is not None and cls > max_class:
                        break
                    if found is not None and (cls, free) != found:
                        break
                    if best is not None and (cls, free, rank) > best[:3]:
                        break
                    gids = self.buckets.get((kind, mask))
                    if not gids:
                        continue
                    found = (cls, free)
                    gid = min(gids)
                    group = index.groups[gid]
                    key = (cls, free, rank, group.host, slug, gid, mask)
                    if best is None or key < best:
                        best = key
        if best is None:
            return None
        gid, mask = best[5], best[6]
        group = index.groups[gid]
        chosen = _best(index.kinds[group.kind][1], mask, count)[1]
        return tuple(gpu for bit, gpu in enumerate(group.gpus) if chosen >> bit & 1)


# --------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------


def _as_set(held: Collection[str]) -> AbstractSet[str]:
    """``held`` with O(1) membership tests."""
    return held if isinstance(held, AbstractSet) else frozenset(held)


def place_in(state: FreeState, held: Collection[str], request: GPURequest) -> tuple[GPU, ...]:
    """:func:`place` on a :class:`FreeState` that already reflects ``held`` (the ledger's)."""
    if request.count == 0:
        return ()
    nvlink = request.interconnect == "nvlink" and request.count > 1
    chosen = state.choose(request.count, request.models, max(NVLINK_CLASSES) if nvlink else None)
    if chosen is not None:
        return chosen
    if nvlink and state.choose(request.count, request.models, None) is not None:
        # could such a set ever be free here (everything released)? else waiting will not help
        empty = FreeState(state.index)
        anywhere = empty.choose(request.count, request.models, max(NVLINK_CLASSES)) is not None
        raise explain_interconnect(state.availability(), request, anywhere)
    raise explain_refusal(
        state.index, _as_set(held), request, availability=state.availability(), unhealthy=state.index.unhealthy
    )


def place(inventory: Iterable[GPU], held: Collection[str], request: GPURequest) -> tuple[GPU, ...]:
    """Choose ``request.count`` GPUs for ``request``, or raise :class:`PlacementError`.

    ``held`` holds the UUIDs already allocated. The result is ordered by
    index. Inventory UUIDs are assumed unique. ``inventory`` may be a
    :class:`PlacementIndex` (built once, much faster); a tuple of GPUs (an
    inventory reading's) is indexed at its first placement and the index kept
    (:func:`~gpuspawner.gpu.per_gpus`). See the module docstring for the rules.
    """
    if request.count == 0:
        return ()
    index = inventory if isinstance(inventory, PlacementIndex) else per_gpus(inventory, PlacementIndex, PlacementIndex)
    return place_in(index.state(held), held, request)


def never_fits(inventory: Iterable[GPU], request: GPURequest) -> PlacementError | None:
    """The refusal of a request that no GPU of ``inventory`` could ever take, even with every GPU free.

    More GPUs of a model than any one machine has, a model (or NVLink set) the
    hub does not have, no GPU at all: the sentence is :func:`place`'s own
    (:mod:`gpuspawner.refusals`). ``None`` when the request fits once GPUs are
    given back or come back into service: a wait (the queue) can cure that.
    """
    if request.count == 0:
        return None
    try:
        place(inventory, (), request)
    except PlacementError as e:
        return None if e.code in WAITABLE else e
    return None
