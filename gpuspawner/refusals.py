"""Why a GPU request gets nothing: the refusal codes, the ONE table of sentences a user reads, :class:`PlacementError`.

Every refusal of a spawn, whoever decides it, is a :class:`PlacementError` (or a subclass:
:class:`~gpuspawner.quota.QuotaError`, :class:`~gpuspawner.queue.QueueTimeout`,
Kubernetes' :class:`~gpuspawner.backends.kube.capacity.CapacityError`, Slurm's
:class:`~gpuspawner.backends.slurm.capacity.NeverFits`)
with a :class:`Refusal` code, worded from :data:`SENTENCES`, so the hub handles them one way:
HTTP 409 with the sentence, the code in metrics, a wait only for the codes in :data:`WAITABLE`.

:func:`gpuspawner.placement.place` decides for the hub's own GPUs; when it cannot place a
request it raises what :func:`explain_refusal` builds here. Pure, like placement. The
counts in the sentences ("0 of 2 free. 1 more is unavailable: GPU is lost.")
are those of :mod:`gpuspawner.availability`, the same the spawn form shows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from gpuspawner.availability import ModelAvailability, by_model
from gpuspawner.gpu import GPU, model_rank
from gpuspawner.request import GPURequest

__all__ = ["SENTENCES", "WAITABLE", "PlacementError", "Refusal", "amount", "explain_interconnect",
           "explain_refusal", "refuse", "words"]


class Refusal(str, Enum):
    """Why a request is refused: the stable keyword of metrics, logs and :attr:`PlacementError.code`.

    A ``str``: ``Refusal.NONE_FREE == "none_free"``, and it prints as its value.
    """

    NO_GPUS = "no_gpus"  # no GPUs at all
    NO_MATCHING_MODEL = "no_matching_model"  # none of the models asked for
    EXCEEDS_HOST_SIZE = "exceeds_host_size"  # more than any one machine or node has
    DRIVER_TOO_OLD = "driver_too_old"  # Kubernetes: no node's driver is new enough for the image's CUDA
    CUDA_TOO_OLD = "cuda_too_old"  # Slurm: the same
    NO_NVLINK_HOST = "no_nvlink_host"  # no machine has such GPUs joined by NVLink
    NONE_USABLE = "none_usable"  # all of them out of service now
    NONE_FREE = "none_free"  # all taken now
    NOT_ENOUGH_ON_ONE_HOST = "not_enough_on_one_host"  # enough free, but not on one machine
    NO_NVLINK_SET = "no_nvlink_set"  # enough free, none joined by NVLink
    QUOTA_USER = "quota_user"  # over the user's quota
    QUOTA_GROUP = "quota_group"  # over a group's quota
    QUEUED_AHEAD = "queued_ahead"  # others wait in the queue for these GPUs
    QUEUE_TIMEOUT = "queue_timeout"  # waited in the queue for the queue's limit
    BOOKED = "booked"  # the GPUs are booked (gpuspawner.bookings words it)
    BUDGET = "budget"  # the user's (or a group's) GPU-hour budget is spent (gpuspawner.budgets)

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


#: Refusal codes that a wait can cure (GPUs are busy or out of service now). Any other code
#: means the request never fits here (or, for quotas, not before the user frees GPUs).
WAITABLE = frozenset({Refusal.NONE_FREE, Refusal.NOT_ENOUGH_ON_ONE_HOST, Refusal.NONE_USABLE,
                      Refusal.NO_NVLINK_SET})

R = Refusal
#: Every sentence a refused user reads: key -> (code, template for :meth:`str.format`). Keys without a
#: code are fragments of other sentences (filled in first). Kept word for word: users and tests know them.
SENTENCES: dict[str, tuple[Refusal | None, str]] = {
    # the hub places (gpu-local, gpu-docker): explain_refusal, explain_interconnect
    "booked": (R.BOOKED, "{sentence}"),  # a sentence of gpuspawner.bookings.WORDS
    "booked_wait": (R.NONE_FREE, "{sentence}"),  # the same, to a request in the hub's queue (it waits on)
    "no_gpus": (R.NO_GPUS, "This hub has no GPUs to give out. Please contact your administrators."),
    "no_matching_model": (R.NO_MATCHING_MODEL, "This hub has no GPU matching {patterns}. Models here: {models}."),
    "exceeds_host_size": (R.EXCEEDS_HOST_SIZE, "{amount} {was} requested but no machine here has more than "
                                               "{most} {subjects}{one_model}. Ask for {most} or fewer."),
    "none_usable": (R.NONE_USABLE, "No {subject} is usable right now: {n} of {n} {are} unavailable ({reasons})."
                                   "{alternatives} {next_step}"),
    "none_free": (R.NONE_FREE, "No {subject} is free right now: 0 of {total} free.{broken}{alternatives} {next_step}"),
    "not_enough_on_one_host": (R.NOT_ENOUGH_ON_ONE_HOST, "{amount} were requested but at most {best} {are} "
                               "free{one_model} on one machine ({free} of {total} free in all)."
                               "{broken}{alternatives} {next_step}"),
    "no_nvlink_host": (R.NO_NVLINK_HOST, "{amount} joined by NVLink were requested, but no machine here has "
                                         "{count} {many} joined by NVLink. "
                                         "Pick a profile without the NVLink requirement."),
    "no_nvlink_set": (R.NO_NVLINK_SET, "{amount} joined by NVLink were requested, but no {count} free on one "
                                       "machine are joined by NVLink ({free} of {total} free in all). "
                                       "Try again later, or pick a profile without the NVLink requirement."),
    "unavailable": (None, " {n} {more}{are} unavailable: {reasons}."),
    "has_free": (None, " {name} has {free} free."),
    "others_free": (None, " Other models with room: {listed}."),
    # Kubernetes places (gpu-kube): gpuspawner.backends.kube.capacity.place
    "kube_no_matching_model": (R.NO_MATCHING_MODEL, "No node in this cluster has a {what}. {inventory}"),
    "kube_driver_too_old": (R.DRIVER_TOO_OLD, "No {what} node has a driver new enough for CUDA {cuda}, which this "
                                              "image needs; the newest there supports CUDA {newest}. {inventory}"),
    "kube_exceeds_host_size": (R.EXCEEDS_HOST_SIZE, "No node has {count} x {what}: at most {most} on one node. "
                                                    "{inventory}"),
    "kube_none_usable": (R.NONE_USABLE, "No {what} is usable right now: {down} of {down} {are} unavailable "
                                        "(node not ready or cordoned, or GPU unhealthy).{others} "
                                        "Pick another model or try again later."),
    "kube_none_free": (R.NONE_FREE, "No {what} is free right now: {free} of {total} free, at most {largest} on one "
                                    "node, and you asked for {count}.{unavailable}{others} "
                                    "Pick another model or try again later."),
    "kube_unavailable": (None, " {down} more {are} unavailable: node not ready or cordoned, or GPU unhealthy."),
    # Slurm places (gpu-slurm): gpuspawner.backends.slurm.capacity.choose_type
    "slurm_no_gpus": (R.NO_GPUS, "No node {where} has GPUs."),
    "slurm_no_matching_model": (R.NO_MATCHING_MODEL, "No node {where} has {wanted} GPUs; the GPUs there: {sizes}."),
    "slurm_exceeds_host_size": (R.EXCEEDS_HOST_SIZE, "No node {where} has {count} {what} GPUs; the most on one node: "
                                                     "{sizes}. Ask for fewer GPUs."),
    "slurm_cuda_too_old": (R.CUDA_TOO_OLD, "{subject} needs CUDA {need} but the drivers of the nodes {where} with "
                                           "{count} {what}GPUs support CUDA {newest} at most. Pick {instead} built "
                                           "for CUDA {newest} or older, or ask an admin to update the driver."),
    # every backend: gpuspawner.quota, gpuspawner.queue, the queue's order (spawners.policies)
    "quota_user": (R.QUOTA_USER, "Your quota is {limit} and your servers hold {total} (servers: {servers}){also}; "
                                 "asking for {count} more would exceed it. "
                                 "Stop one of your servers or ask for fewer GPUs."),
    "quota_group": (R.QUOTA_GROUP, "The quota of group '{group}' is {limit} and its members' servers hold "
                                   "{total}{also}; asking for {count} more would exceed it. "
                                   "Try again when a member of '{group}' stops a server."),
    "queued_ahead": (R.QUEUED_AHEAD, "{waiting} queued request(s) from {users} user(s) are waiting for these GPUs; "
                                     "choose a profile that queues, or try again later."),
    "gpus_gone": (R.NO_GPUS, "this hub no longer has its GPU(s) {gpus}"),  # a kept Docker container's
    "queue_timeout": (R.QUEUE_TIMEOUT, "No GPU became free within {minutes}, the queue's limit "
                                       "(you were number {position} in the queue). "
                                       "Try again later or ask for fewer GPUs."),
    # gpuspawner.budgets: a spent GPU-hour budget ({reset}: when GPU profiles open again)
    "budget": (R.BUDGET, "Your GPU budget is spent: {whose} used {used} of {limit} {unit} {period}.{reset} "
                         "CPU-only profiles still start; ask an administrator if you need more."),
    "budget_reset": (None, " GPU profiles open again at {time}."),
    "budget_queue_last": (None, "Your GPU budget is spent, so your GPU requests wait in the queue behind everyone "
                                "with budget left; CPU-only profiles start as usual."),
    # a refusal a wait would cure, where a profile this user may pick waits in the queue for it
    "queue_instead": (None, ' Pick "{profile}" to wait in the queue instead.'),
    # the spawn form: why a GPU count is offered disabled, after its label ("4 GPUs (not free now)")
    "form_not_free": (None, "not free now"),
    "form_never_fits": (None, "never fits here: needs {amount} on one {host}; the largest here has {most}"),
}
del R


def words(key: str, **fields: object) -> str:
    """The sentence (or fragment) ``key`` of :data:`SENTENCES`, filled in."""
    return SENTENCES[key][1].format(**fields)


class PlacementError(Exception):
    """A request that cannot be placed now; ``str(e)`` is the sentence shown to the user.

    The structured fields exist for logs and metrics:

    * ``code``: a :class:`Refusal` (a ``str``; a plain string is turned into one);
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
        code: Refusal | str,
        requested: int = 0,
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
        self.code = Refusal(code)
        self.requested = requested
        self.models = models
        self.free = free
        self.total = total
        self.unavailable = unavailable
        self.max_free_on_one_host = max_free_on_one_host
        self.max_on_one_host = max_on_one_host
        self.free_by_model = dict(free_by_model or {})


E = TypeVar("E", bound=PlacementError)


def refuse(key: str, fields: Mapping[str, object], error: type[E] = PlacementError, **details: object) -> E:
    """The ``error`` (a :class:`PlacementError`) for sentence ``key`` of :data:`SENTENCES`, with its code.

    ``fields`` fill the sentence in; ``details`` are the error's other keyword arguments.
    """
    code, template = SENTENCES[key]
    assert code is not None, f"{key} is a fragment, not a refusal"
    return error(template.format(**fields), code=code, **details)


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


def amount(count: int, subject: str) -> str:
    """``"2 GPUs"`` or ``"2 x Tesla T4"`` (``subject``: ``"GPU"`` or a model's name)."""
    if subject == "GPU":
        return f"{count} {_plural(count, 'GPU', 'GPUs')}"
    return f"{count} x {subject}"


def _unavailable_sentence(survey: _Shortfall, prefix: str) -> str:
    """``"1 more is unavailable: GPU is lost."``, or ``""`` when all are healthy."""
    n = survey.unavailable
    if not n:
        return ""
    return words("unavailable", n=n, more=prefix, are=_plural(n, "is", "are"), reasons=_reasons(survey))


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
        return words("has_free", name=survey.names[slug], free=n)
    return words("others_free", listed=", ".join(f"{survey.names[slug]} ({n} free)" for slug, n in room))


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
    return _error(survey, request, *_refusal_fields(survey, request))


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
        return _error(survey, request, "no_nvlink_host",
                      {"amount": amount(count, subject), "count": count, "many": _many(subject)})
    return _error(survey, request, "no_nvlink_set",
                  {"amount": amount(count, subject), "count": count, "free": survey.free, "total": survey.total})


def _error(survey: _Shortfall, request: GPURequest, key: str, fields: Mapping[str, object]) -> PlacementError:
    return refuse(
        key, fields,
        requested=request.count,
        models=request.models,
        free=survey.free,
        total=survey.total,
        unavailable=survey.unavailable,
        max_free_on_one_host=survey.largest(survey.matching),
        max_on_one_host=survey.most_on_one_host(survey.matching),
        free_by_model={slug: (m.free, m.total) for slug, m in survey.models.items()},
    )


def _refusal_fields(survey: _Shortfall, request: GPURequest) -> tuple[str, dict[str, object]]:
    """(sentence key, its fields) for a refused request."""
    count = request.count
    subject = _subject(request, survey)
    if not survey.names:
        return "no_gpus", {}
    if not survey.matching:
        return "no_matching_model", {"patterns": _patterns(request.models), "models": ", ".join(survey.names.values())}
    host_max = survey.most_on_one_host(survey.matching)
    if count > host_max:
        return "exceeds_host_size", {
            "amount": amount(count, subject), "was": _plural(count, "was", "were"), "most": host_max,
            "subjects": _plural(host_max, subject, _many(subject)), "one_model": _one_model(survey)}
    alternatives = _alternatives(survey, count)
    if survey.total == 0:
        n = survey.unavailable
        return "none_usable", {"subject": subject, "n": n, "are": _plural(n, "is", "are"), "reasons": _reasons(survey),
                               "alternatives": alternatives, "next_step": _next_step(alternatives)}
    broken = _unavailable_sentence(survey, "more ")
    if survey.free == 0:
        return "none_free", {"subject": subject, "total": survey.total, "broken": broken,
                             "alternatives": alternatives, "next_step": _next_step(alternatives)}
    best = survey.largest(survey.matching)
    return "not_enough_on_one_host", {
        "amount": amount(count, subject), "best": best, "are": _plural(best, "is", "are"),
        "one_model": _one_model(survey), "free": survey.free, "total": survey.total, "broken": broken,
        "alternatives": alternatives, "next_step": _next_step(alternatives, fewer=best)}


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
