"""Why a GPU request gets nothing: :class:`PlacementError` and the sentences a user reads.

:func:`gpuspawner.placement.place` decides; when it cannot place a request it
raises what :func:`explain_refusal` builds here. Pure, like placement. The
counts in the sentences ("0 of 2 free. 1 more is unavailable: GPU is lost.")
are those of :mod:`gpuspawner.availability`, the same the spawn form shows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuspawner.availability import ModelAvailability, by_model
from gpuspawner.gpu import GPU, model_rank

if TYPE_CHECKING:
    from gpuspawner.placement import GPURequest

__all__ = ["WAITABLE", "PlacementError", "explain_refusal"]

#: Refusal codes that a wait can cure (GPUs are busy or out of service now). Any other code of
#: :func:`explain_refusal` and :func:`explain_interconnect` means the request never fits here.
WAITABLE = frozenset({"none_free", "not_enough_on_one_host", "none_usable", "no_nvlink_set"})


class PlacementError(Exception):
    """A request that cannot be placed now; ``str(e)`` is the sentence shown to the user.

    The structured fields exist for logs and metrics:

    * ``code``: a stable keyword: ``"no_gpus"``, ``"no_matching_model"``,
      ``"exceeds_host_size"``, ``"none_usable"``, ``"none_free"``,
      ``"not_enough_on_one_host"``, ``"no_nvlink_set"`` (enough free, none
      joined by NVLink, for a request that needs it) or ``"no_nvlink_host"``
      (no machine has such GPUs at all);
    * ``requested``: the GPU count asked for; ``models``: the request patterns;
    * ``free`` / ``total``: free / in-service GPUs of the acceptable models,
      as :mod:`gpuspawner.availability` defines them (``total`` leaves out
      unhealthy GPUs);
    * ``unavailable``: unhealthy GPUs of the acceptable models;
    * ``max_free_on_one_host``: the largest free (host, model) group;
    * ``max_on_one_host``: the largest (host, model) group, healthy or not;
    * ``free_by_model``: slug -> (free, total) over the whole inventory.
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


@dataclass
class _Shortfall:
    """What the inventory looks like from the point of view of one request."""

    models: dict[str, ModelAvailability]  # every model in the inventory, by slug
    matching: set[str]  # the slugs the request accepts
    reasons: Counter[str]  # why the matching unhealthy GPUs are out of service

    @property
    def names(self) -> dict[str, str]:
        """Slug -> model name, sorted by slug."""
        return {slug: m.name for slug, m in self.models.items()}

    @property
    def free(self) -> int:
        return sum(self.models[slug].free for slug in self.matching)

    @property
    def total(self) -> int:
        return sum(self.models[slug].total for slug in self.matching)

    @property
    def unavailable(self) -> int:
        return sum(self.models[slug].unavailable for slug in self.matching)

    def largest(self, slugs: Iterable[str]) -> int:
        """The most free GPUs of one of these models on one host."""
        return max((self.models[slug].largest for slug in slugs), default=0)

    def most_on_one_host(self, slugs: Iterable[str]) -> int:
        """The most GPUs of one of these models on one host, healthy or not."""
        return max((self.models[slug].most_on_one_host for slug in slugs), default=0)


def _survey(
    gpus: Iterable[GPU],
    held: Collection[str],
    request: GPURequest,
    availability: dict[str, ModelAvailability] | None = None,
    unhealthy: Iterable[GPU] | None = None,
) -> _Shortfall:
    """Count free, in-service and broken GPUs per model, and why the matching ones are broken.

    ``availability`` (:func:`~gpuspawner.availability.by_model` of ``gpus`` and
    ``held``) and ``unhealthy`` (the unhealthy GPUs of ``gpus``) may be given
    when the caller has them (placement's index), so the GPUs are not walked.
    """
    if availability is None or unhealthy is None:
        gpus = gpus if isinstance(gpus, (tuple, list)) else tuple(gpus)
        availability = by_model(gpus, held)
        unhealthy = [g for g in gpus if not g.healthy]
    matching = {slug for slug in availability if model_rank(request.models, slug) is not None}
    reasons = Counter(_reason_text(g.reason) for g in unhealthy if g.model in matching)
    return _Shortfall(availability, matching, reasons)


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
    room = [(slug, survey.largest([slug])) for slug in others]
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
    inventory: Iterable[GPU],
    held: Collection[str],
    request: GPURequest,
    *,
    availability: dict[str, ModelAvailability] | None = None,
    unhealthy: Iterable[GPU] | None = None,
) -> PlacementError:
    """The :class:`PlacementError` for a request that :func:`~gpuspawner.placement.place` cannot satisfy.

    Call it only for such a request; the message picks the most useful
    explanation: no GPUs at all, no such model, a request bigger than any
    machine, GPUs out of service, all taken, or not enough on one machine.
    ``availability`` and ``unhealthy``: see :func:`_survey` (a shortcut, same sentences).
    """
    survey = _survey(inventory, held, request, availability, unhealthy)
    return _error(survey, request, *_refusal_message(survey, request))


def explain_interconnect(
    availability: dict[str, ModelAvailability], request: GPURequest, anywhere: bool = True
) -> PlacementError:
    """The :class:`PlacementError` for an ``interconnect: nvlink`` request that fits only on GPUs NVLink does not join.

    ``availability``: :func:`~gpuspawner.availability.by_model` of the inventory now;
    ``anywhere``: whether some machine has such a set at all (busy now). Code
    ``"no_nvlink_set"`` (busy: a wait can cure it) or ``"no_nvlink_host"`` (none here).
    """
    survey = _survey((), (), request, availability, ())
    subject = _subject(request, survey)
    count = request.count  # only for 2 or more GPUs: one GPU needs no link
    if not anywhere:
        return _error(survey, request, "no_nvlink_host", (
            f"{_amount(count, subject)} joined by NVLink were requested, but no machine here has "
            f"{count} {_many(subject)} joined by NVLink. Pick a profile without the NVLink requirement."
        ))
    message = (
        f"{_amount(count, subject)} joined by NVLink were requested, but no {count} free on one "
        f"machine are joined by NVLink ({survey.free} of {survey.total} free in all). "
        f"Try again later, or pick a profile without the NVLink requirement."
    )
    return _error(survey, request, "no_nvlink_set", message)


def _error(survey: _Shortfall, request: GPURequest, code: str, message: str) -> PlacementError:
    return PlacementError(
        message,
        code=code,
        requested=request.count,
        models=request.models,
        free=survey.free,
        total=survey.total,
        unavailable=survey.unavailable,
        max_free_on_one_host=survey.largest(survey.matching),
        max_on_one_host=survey.most_on_one_host(survey.matching),
        free_by_model={slug: (m.free, m.total) for slug, m in survey.models.items()},
    )


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
    host_max = survey.most_on_one_host(survey.matching)
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
    best = survey.largest(survey.matching)
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
