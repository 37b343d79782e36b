"""Pure GPU placement: which free GPUs a request gets, or why it gets none.

Nothing here does I/O or keeps state. :func:`place` looks at an inventory of
:class:`~gpuspawner.gpu.GPU` records and the set of UUIDs already given out,
and either returns the GPUs for one request or raises :class:`PlacementError`
whose message is a sentence a data scientist can act on.

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

import functools
from collections import Counter
from collections.abc import Collection, Iterable, Sequence, Set as AbstractSet
from dataclasses import dataclass, field

from gpuspawner.gpu import GPU, model_slug, slug_matches

__all__ = [
    "GPURequest",
    "PlacementError",
    "display_name",
    "free_by_model",
    "model_names",
    "place",
]

ANY_MODEL = "any"

# Leading words dropped by display_name(); "Tesla" stays, people say "Tesla T4".
_DISPLAY_DROP = ("nvidia",)


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


class PlacementError(Exception):
    """A request that cannot be placed now; ``str(e)`` is the sentence shown to the user.

    The structured fields exist for logs and metrics:

    * ``code``: a stable keyword: ``"no_gpus"``, ``"no_matching_model"``,
      ``"exceeds_host_size"``, ``"none_usable"``, ``"none_free"`` or
      ``"not_enough_on_one_host"``;
    * ``requested``: the GPU count asked for; ``models``: the request patterns;
    * ``free`` / ``total``: free and healthy GPUs of the acceptable models;
    * ``unavailable``: unhealthy GPUs of the acceptable models;
    * ``max_free_on_one_host``: the largest free (host, model) group;
    * ``max_on_one_host``: the largest (host, model) group, healthy or not;
    * ``free_by_model``: slug -> (free, total healthy) over the whole inventory.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        requested: int,
        models: tuple[str, ...] = (),
        free: int = 0,
        total: int = 0,
        unavailable: int = 0,
        max_free_on_one_host: int = 0,
        max_on_one_host: int = 0,
        free_by_model: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.requested = requested
        self.models = models
        self.free = free
        self.total = total
        self.unavailable = unavailable
        self.max_free_on_one_host = max_free_on_one_host
        self.max_on_one_host = max_on_one_host
        self.free_by_model = dict(free_by_model or {})


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _slug(name: str) -> str:
    """:func:`model_slug`, memoised: inventories repeat a handful of names."""
    return model_slug(name)


def display_name(name: str) -> str:
    """A short human label for a GPU model name.

    >>> display_name("NVIDIA A100-SXM4-80GB")
    'A100-SXM4-80GB'
    >>> display_name("Tesla T4")
    'Tesla T4'
    """
    words = name.split()
    while len(words) > 1 and words[0].lower() in _DISPLAY_DROP:
        words = words[1:]
    return " ".join(words) or name


def _as_set(held: Collection[str]) -> AbstractSet[str]:
    """``held`` with O(1) membership tests."""
    return held if isinstance(held, AbstractSet) else frozenset(held)


def _as_sequence(inventory: Iterable[GPU]) -> Sequence[GPU]:
    """``inventory`` in a form that can be walked more than once."""
    return inventory if isinstance(inventory, (tuple, list)) else tuple(inventory)


def _preference(models: tuple[str, ...], slug: str) -> int | None:
    """Rank of ``slug`` in the request's preference order; ``None`` if not allowed."""
    if not models:
        return 0
    for rank, pattern in enumerate(models):
        if slug_matches(pattern, slug):
            return rank
    return None


def model_names(inventory: Iterable[GPU]) -> dict[str, str]:
    """Model slug -> the human model name (``GPU.name``), sorted by slug.

    When several spellings share a slug the alphabetically first one is used,
    so the result does not depend on inventory order.
    """
    names: dict[str, str] = {}
    for gpu in inventory:
        slug = _slug(gpu.name)
        known = names.get(slug)
        if known is None or gpu.name < known:
            names[slug] = gpu.name
    return dict(sorted(names.items()))


def free_by_model(inventory: Iterable[GPU], held: Collection[str]) -> dict[str, tuple[int, int]]:
    """Model slug -> (free GPUs, healthy GPUs), sorted by slug.

    A model whose GPUs are all unhealthy still appears, as ``(0, 0)``, so a
    form can say it exists but is out of service.
    """
    held_set = _as_set(held)
    free: Counter[str] = Counter()
    healthy: Counter[str] = Counter()
    seen: set[str] = set()
    for gpu in inventory:
        slug = _slug(gpu.name)
        seen.add(slug)
        if gpu.healthy:
            healthy[slug] += 1
            if gpu.uuid not in held_set:
                free[slug] += 1
    return {slug: (free[slug], healthy[slug]) for slug in sorted(seen)}


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
        slug = _slug(gpu.name)
        if slug not in ranks:
            ranks[slug] = _preference(models, slug)
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


# --------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------


@dataclass
class _Shortfall:
    """What the inventory looks like from the point of view of one request.

    Filled in one pass over the inventory; ``free``/``healthy`` count per model
    slug, ``size``/``free_size`` per (host, slug) group.
    """

    names: dict[str, str] = field(default_factory=dict)
    matching: set[str] = field(default_factory=set)
    free_count: dict[str, int] = field(default_factory=dict)
    healthy: dict[str, int] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)
    size: dict[tuple[str, str], int] = field(default_factory=dict)
    free_size: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return sum(self.free_count.get(slug, 0) for slug in self.matching)

    @property
    def total(self) -> int:
        return sum(self.healthy.get(slug, 0) for slug in self.matching)

    @property
    def unavailable(self) -> int:
        return sum(self.reasons.values())

    def by_model(self) -> dict[str, tuple[int, int]]:
        """Same shape as :func:`free_by_model`."""
        return {
            slug: (self.free_count.get(slug, 0), self.healthy.get(slug, 0))
            for slug in sorted(self.names)
        }

    def biggest(self, counter: dict[tuple[str, str], int], slugs: set[str]) -> int:
        return max((n for (_, slug), n in counter.items() if slug in slugs), default=0)


def _survey(gpus: Sequence[GPU], held: AbstractSet[str], request: GPURequest) -> _Shortfall:
    """Count free, healthy and broken GPUs per model and per (host, model)."""
    survey = _Shortfall()
    names, size, free_size = survey.names, survey.size, survey.free_size
    healthy, free_count = survey.healthy, survey.free_count
    for gpu in gpus:
        slug = _slug(gpu.name)
        known = names.get(slug)
        if known is None:
            if _preference(request.models, slug) is not None:
                survey.matching.add(slug)
        if known is None or gpu.name < known:
            names[slug] = gpu.name
        key = (gpu.host, slug)
        size[key] = size.get(key, 0) + 1
        if not gpu.healthy:
            if slug in survey.matching:
                survey.reasons[_reason_text(gpu.reason)] += 1
            continue
        healthy[slug] = healthy.get(slug, 0) + 1
        if gpu.uuid not in held:
            free_count[slug] = free_count.get(slug, 0) + 1
            free_size[key] = free_size.get(key, 0) + 1
    survey.names = dict(sorted(names.items()))
    return survey


def _reason_text(reason: str | None) -> str:
    """An unhealthy GPU's reason as a sentence fragment."""
    text = (reason or "").strip().rstrip(".")
    return text or "no reason given"


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _subject(request: GPURequest, survey: _Shortfall) -> str:
    """How to name what was asked for: ``"GPU"`` or the model name(s)."""
    if request.any_model:
        return "GPU"
    return " or ".join(survey.names[slug] for slug in sorted(survey.matching))


def _amount(count: int, subject: str) -> str:
    """``"2 GPUs"`` or ``"2 x Tesla T4"``."""
    if subject == "GPU":
        return f"{count} {_plural(count, 'GPU', 'GPUs')}"
    return f"{count} x {subject}"


def _unavailable_sentence(survey: _Shortfall, prefix: str) -> str:
    """``"1 more is unavailable: GPU is lost."``, or ``""`` when all are healthy."""
    n = survey.unavailable
    if not n:
        return ""
    return f" {n} {prefix}{_plural(n, 'is', 'are')} unavailable: {_reasons(survey)}."


def _reasons(survey: _Shortfall) -> str:
    """Why GPUs are unhealthy: ``"GPU is lost"`` or ``"GPU is lost (2), XID 79 (1)"``."""
    if len(survey.reasons) == 1:
        return next(iter(survey.reasons))
    return ", ".join(f"{text} ({k})" for text, k in sorted(survey.reasons.items()))


def _alternatives(survey: _Shortfall, count: int) -> str:
    """Other models that could take the whole request on one machine now."""
    others = sorted(set(survey.names) - survey.matching)
    room = [(slug, survey.biggest(survey.free_size, {slug})) for slug in others]
    room = [(slug, n) for slug, n in room if n >= count]
    if not room:
        return ""
    if len(room) == 1:
        slug, n = room[0]
        return f" {survey.names[slug]} has {n} free."
    listed = ", ".join(f"{survey.names[slug]} ({n} free)" for slug, n in room)
    return f" Other models with room: {listed}."


def _patterns(models: tuple[str, ...]) -> str:
    return " or ".join(f"'{p}'" for p in models)


def explain_refusal(
    inventory: Iterable[GPU], held: Collection[str], request: GPURequest
) -> PlacementError:
    """The :class:`PlacementError` for a request that :func:`place` cannot satisfy.

    Call it only for such a request; the message picks the most useful
    explanation: no GPUs at all, no such model, a request bigger than any
    machine, GPUs out of service, all taken, or not enough on one machine.
    """
    gpus = _as_sequence(inventory)
    held_set = _as_set(held)
    survey = _survey(gpus, held_set, request)
    fields = dict(
        requested=request.count,
        models=request.models,
        free=survey.free,
        total=survey.total,
        unavailable=survey.unavailable,
        max_free_on_one_host=survey.biggest(survey.free_size, survey.matching),
        max_on_one_host=survey.biggest(survey.size, survey.matching),
        free_by_model=survey.by_model(),
    )
    code, message = _refusal_message(survey, request)
    return PlacementError(message, code=code, **fields)  # type: ignore[arg-type]


def _refusal_message(survey: _Shortfall, request: GPURequest) -> tuple[str, str]:
    """(code, sentence) for a refused request."""
    count = request.count
    subject = _subject(request, survey)
    if not survey.names:
        return "no_gpus", "This hub has no GPUs to give out. Please contact your administrators."
    if not survey.matching:
        models = ", ".join(survey.names.values())
        return "no_matching_model", (
            f"This hub has no GPU matching {_patterns(request.models)}. Models here: {models}."
        )
    host_max = survey.biggest(survey.size, survey.matching)
    if count > host_max:
        return "exceeds_host_size", (
            f"{_amount(count, subject)} {_plural(count, 'was', 'were')} requested but no machine "
            f"here has more than {host_max} {_plural(host_max, subject, _many(subject))}"
            f"{_one_model(survey)}. "
            f"Ask for {host_max} or fewer."
        )
    alternatives = _alternatives(survey, count)
    if survey.total == 0:
        n = survey.unavailable
        return "none_usable", (
            f"No {subject} is usable right now: {n} of {n} {_plural(n, 'is', 'are')} "
            f"unavailable ({_reasons(survey)}).{alternatives} "
            f"{_next_step(alternatives)}"
        )
    broken = _unavailable_sentence(survey, "more ")
    if survey.free == 0:
        return "none_free", (
            f"No {subject} is free right now: 0 of {survey.total} free.{broken}{alternatives} "
            f"{_next_step(alternatives)}"
        )
    best = survey.biggest(survey.free_size, survey.matching)
    return "not_enough_on_one_host", (
        f"{_amount(count, subject)} were requested but at most {best} "
        f"{_plural(best, 'is', 'are')} free{_one_model(survey)} on one machine "
        f"({survey.free} of {survey.total} free in all).{broken}{alternatives} "
        f"{_next_step(alternatives, fewer=best)}"
    )


def _one_model(survey: _Shortfall) -> str:
    """``" of one model"`` when several models are acceptable, since one request is one model."""
    return " of one model" if len(survey.matching) > 1 else ""


def _many(subject: str) -> str:
    """Plural of a subject: ``"GPUs"``, otherwise the model name unchanged."""
    return "GPUs" if subject == "GPU" else subject


def _next_step(alternatives: str, *, fewer: int = 0) -> str:
    """The closing advice of a refusal; ``fewer`` is the most that fits now, if any."""
    options = []
    if fewer:
        options.append(f"ask for at most {fewer}")
    if alternatives:
        options.append("pick another model")
    options.append("try again later")
    text = ", ".join(options[:-1]) + (" or " if len(options) > 1 else "") + options[-1]
    return text[0].upper() + text[1:] + "."
