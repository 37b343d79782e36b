"""GPUs of a Slurm cluster, from ``sinfo --json``. Pure: no I/O here.

Slurm counts GPUs as a generic resource (GRES) named ``gpu``, optionally typed:
a node's ``gres`` reads ``gpu:a100:2,gpu:t4:2`` and its ``gres_used`` reads
``gpu:a100:1(IDX:0),gpu:t4:0(IDX:N/A)``. A GRES *type* is what a user picks as
``gpu_model``: :class:`GresTypes` maps model slugs to GRES types (by default
the type itself, lower-cased, is the slug).

:func:`gpu_availability` gives the free/total per model the spawn form shows
(:mod:`gpuspawner.availability` says what the counts mean); :func:`choose_type`
picks the GRES type of a request, or raises :class:`NeverFits` with the sentence
a user reads when no node of the partition could ever run it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...availability import ModelAvailability, Tally
from ...compat import cuda_version_text
from ...gpu import model_rank, model_slug
from ...refusals import PlacementError, refuse
from .cuda import CudaNeed, DriverCuda, feature_cuda

__all__ = ["GresTypes", "NeverFits", "SlurmNode", "check_errors", "choose_type", "cuda_constraint", "gpu_availability",
           "parse_gres", "read_nodes"]

#: GRES of no type (``gpu:4``); such GPUs answer only requests for any model.
UNTYPED = ""

# Node states in which Slurm starts jobs; flags that take a node out of service.
_SERVING_STATES = {"idle", "mixed", "allocated", "completing", "planned"}
_OUT_FLAGS = {"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "NOT_RESPONDING", "MAINTENANCE",
              "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
_PARENS = re.compile(r"\([^)]*\)")


def parse_gres(text: str | None) -> dict[str, int]:
    """GPU counts per GRES type in a node's ``gres`` or ``gres_used`` string.

    >>> parse_gres("gpu:a100:2,gpu:t4:2")
    {'a100': 2, 't4': 2}
    >>> parse_gres("gpu:a100:1(IDX:0,1),mps:100")
    {'a100': 1}
    >>> parse_gres("gpu:4(S:0-1)")
    {'': 4}
    """
    counts: dict[str, int] = {}
    if not text or text in ("(null)", "N/A"):
        return counts
    for item in _PARENS.sub("", text).split(","):
        parts = item.strip().split(":")
        if len(parts) < 2 or parts[0] != "gpu" or not parts[-1].isdigit():
            continue
        kind = parts[1].lower() if len(parts) >= 3 else UNTYPED
        counts[kind] = counts.get(kind, 0) + int(parts[-1])
    return counts


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``sinfo --json`` lists it: its partitions, state and GPUs per GRES type."""

    name: str
    partitions: tuple[str, ...]
    state: str
    flags: tuple[str, ...] = ()
    gpus: Mapping[str, int] = field(default_factory=dict)
    used: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""
    features: tuple[str, ...] = ()  # active features (``Feature=`` in slurm.conf): ``cuda12.4`` names its driver
    reason_since: float | None = None  # when its reason was set (``reason_changed_at``), where there is one

    @property
    def in_service(self) -> bool:
        """Whether Slurm starts jobs on it now (not down, drained, failing or powered down)."""
        return self.state.lower() in _SERVING_STATES and not set(self.flags) & _OUT_FLAGS

    def free(self, gres_type: str) -> int:
        return max(0, self.gpus.get(gres_type, 0) - self.used.get(gres_type, 0)) if self.in_service else 0


def check_errors(data: Mapping[str, Any], command: str) -> None:
    """ValueError when Slurm's JSON output lists errors: ``sinfo --json`` and ``squeue --json`` (22.05)
    exit 0 with ``"errors": [{"error": "Unspecified error"}]`` and no nodes or jobs when slurmctld
    does not answer, which must not read as "a cluster without GPUs" or "no jobs"."""
    errors = data.get("errors") if isinstance(data, Mapping) else None
    if errors:
        said = "; ".join(str(e.get("error") or e.get("description") or e) if isinstance(e, Mapping) else str(e)
                         for e in errors)
        raise ValueError(f"{command} answered with an error instead of a listing ({said}): is slurmctld up?")


def read_nodes(sinfo: str | bytes | Mapping[str, Any]) -> tuple[SlurmNode, ...]:
    """The nodes of ``sinfo --json`` output (text or parsed); ValueError when it is not that,
    or when it reports errors (see :func:`check_errors`)."""
    data = json.loads(sinfo) if isinstance(sinfo, (str, bytes)) else sinfo
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        raise ValueError("not sinfo --json output: no 'nodes' list")
    check_errors(data, "sinfo --json")
    nodes: dict[str, SlurmNode] = {}
    for raw in data["nodes"]:
        if not isinstance(raw, Mapping) or not raw.get("name"):
            continue
        state = raw.get("state", "")
        state = state[0] if isinstance(state, list) and state else state  # newer Slurm: a list of words
        name = str(raw["name"])
        partitions = tuple(str(p) for p in raw.get("partitions") or ())
        if name in nodes:  # some versions list a node once per partition
            partitions = tuple(dict.fromkeys(nodes[name].partitions + partitions))
        nodes[name] = SlurmNode(
            name=name,
            partitions=partitions,
            state=str(state).lower(),
            flags=tuple(str(f).upper() for f in raw.get("state_flags") or ()),
            gpus=parse_gres(raw.get("gres")),
            used=parse_gres(raw.get("gres_used")),
            reason=str(raw.get("reason") or ""),
            features=_features(raw),
            reason_since=_epoch(raw.get("reason_changed_at")),
        )
    return tuple(nodes[n] for n in sorted(nodes))


def _epoch(value: Any) -> float | None:
    """A time ``sinfo --json`` gives: seconds since the epoch (22.05), or ``{"set": true, "number": N}`` (newer);
    None where not set (0)."""
    if isinstance(value, Mapping):
        value = value.get("number") if value.get("set", True) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _features(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """A node's active features: ``"active_features": "a,b"`` (22.05) or ``"features": {"active": "a,b"}`` (23.02+)."""
    text = raw.get("active_features")
    features = raw.get("features")
    if isinstance(features, Mapping):
        text = features.get("active") or features.get("total")
    elif not text:
        text = features
    if isinstance(text, list):
        return tuple(str(f) for f in text if f)
    return tuple(f for f in str(text or "").split(",") if f)


@dataclass(frozen=True)
class GresTypes:
    """Model slug <-> Slurm GRES type: ``{"a100": "nvidia_a100-sxm4-80gb"}``; unmapped types are their own slug."""

    by_slug: Mapping[str, str] = field(default_factory=dict)

    def slug(self, gres_type: str) -> str:
        for slug, known in self.by_slug.items():
            if known.lower() == gres_type:
                return slug
        return model_slug(gres_type) if gres_type else "gpu"

    def gres_type(self, slug: str) -> str:
        return self.by_slug.get(slug, slug).lower()

    def name(self, gres_type: str) -> str:
        return f"{gres_type.upper()} (gpu:{gres_type})" if gres_type else "GPU (untyped)"


def _in(node: SlurmNode, partitions: Iterable[str]) -> bool:
    wanted = set(partitions)
    return not wanted or bool(wanted & set(node.partitions))


def gpu_availability(
    nodes: Iterable[SlurmNode], types: GresTypes, partitions: Iterable[str] = (),
) -> list[ModelAvailability]:
    """Free/total per GPU model on the nodes of ``partitions`` (all nodes when none are named)."""
    partitions = tuple(partitions)
    tally = Tally()
    for node in nodes:
        if not _in(node, partitions):
            continue
        for gres_type, count in node.gpus.items():
            tally.add(types.slug(gres_type), types.name(gres_type), node.name, count=count,
                      free=node.free(gres_type), in_service=node.in_service)
    return sorted(tally.models().values(), key=lambda a: (a.name, a.slug))


class NeverFits(PlacementError):
    """No node of the partition could ever run the request; ``str(e)`` is the user's sentence.

    A :class:`~gpuspawner.refusals.PlacementError` like the hub's own refusals: its ``code``
    (``no_gpus``, ``no_matching_model``, ``exceeds_host_size`` or ``cuda_too_old``) and sentence
    come from :data:`~gpuspawner.refusals.SENTENCES`.
    """


def _where(partitions: tuple[str, ...]) -> str:
    if not partitions:
        return "in the Slurm cluster"
    return f"in Slurm partition {partitions[0]}" if len(partitions) == 1 else \
        f"in Slurm partitions {', '.join(partitions)}"


def choose_type(
    nodes: Iterable[SlurmNode], types: GresTypes, models: tuple[str, ...], count: int,
    partitions: Iterable[str] = (), cuda: CudaNeed | None = None, drivers: DriverCuda | None = None,
) -> str:
    """The GRES type to ask Slurm for: ``count`` GPUs of one of ``models`` (patterns; ``()``: any) on one node.

    Among the types that fit on one node of ``partitions``, one with ``count`` GPUs
    free on one node now wins, so Slurm can start it at once; then the model listed
    first, the most free on one node, the type name. Untyped GRES is
    :data:`UNTYPED` (``gres=gpu:N``). Nodes out of service still count for "could ever fit".
    With ``cuda``, only nodes whose driver supports that CUDA version (or is not
    known, see :class:`~gpuspawner.backends.slurm.cuda.DriverCuda`) count for fitting.
    Raises :class:`NeverFits` naming the GPU types and the most of each on one node,
    or the newest CUDA version of the fitting nodes' drivers.
    """
    partitions = tuple(partitions)
    asked = {"requested": count, "models": tuple(models)}
    drivers = drivers or DriverCuda()
    most: dict[str, int] = {}  # the most GPUs of each type on one node
    usable: dict[str, int] = {}  # ... on one node whose driver is new enough (or not known)
    newest: dict[str, tuple[int, int]] = {}  # the newest known driver's CUDA of each type's nodes
    free: dict[str, int] = {}
    for node in nodes:
        if not _in(node, partitions):
            continue
        for gres_type, n in node.gpus.items():
            most[gres_type] = max(most.get(gres_type, 0), n)
            have = drivers.version(node.features, types.slug(gres_type)) if cuda else None
            if have is not None and n >= count:
                newest[gres_type] = max(newest.get(gres_type, have), have)
            if have is not None and have < cuda.version:
                continue
            usable[gres_type] = max(usable.get(gres_type, 0), n)
            free[gres_type] = max(free.get(gres_type, 0), node.free(gres_type))
    sizes = ", ".join(f"{types.slug(t)} (up to {n} per node)" for t, n in sorted(most.items()) if n)
    where = _where(partitions)
    if not sizes:
        raise refuse("slurm_no_gpus", {"where": where}, NeverFits, **asked)
    ranked = [(model_rank(models, types.slug(t)), t) for t in most if most[t]]
    matching = [(rank, t) for rank, t in ranked if rank is not None]
    if not matching:
        wanted = " or ".join(models)
        raise refuse("slurm_no_matching_model", {"where": where, "wanted": wanted, "sizes": sizes}, NeverFits, **asked)
    fitting = [(rank, t) for rank, t in matching if most[t] >= count]
    if not fitting:
        what = " or ".join(models) if models else "GPUs of one type"
        raise refuse("slurm_exceeds_host_size", {"where": where, "count": count, "what": what, "sizes": sizes},
                     NeverFits, **asked)
    if cuda is not None:
        known = [newest[t] for _, t in fitting if t in newest]
        fitting = [(rank, t) for rank, t in fitting if usable.get(t, 0) >= count]
        if not fitting:
            ceiling = cuda_version_text(max(known)) if known else "unknown"
            what = " or ".join(models) + " " if models else ""
            raise refuse("slurm_cuda_too_old", {
                "subject": cuda.subject, "need": cuda_version_text(cuda.version), "where": where, "count": count,
                "what": what, "newest": ceiling, "instead": cuda.instead}, NeverFits, **asked)
    fitting.sort(key=lambda rt: (free.get(rt[1], 0) < count, rt[0], -free.get(rt[1], 0), rt[1]))
    return fitting[0][1]


def cuda_constraint(
    nodes: Iterable[SlurmNode], types: GresTypes, gres_type: str, count: int, partitions: Iterable[str],
    cuda: CudaNeed, drivers: DriverCuda,
) -> str:
    """The ``--constraint`` that keeps a job of ``count`` GPUs of ``gres_type`` off nodes whose driver is
    too old for ``cuda``: the CUDA features of the nodes new enough (``"cuda12.4|cuda12.6"``), or ``""``
    when no node it could run on is too old, or when some such node declares no CUDA feature (a
    constraint would keep the job off it too)."""
    partitions = tuple(partitions)
    wanted: set[str] = set()
    too_old = False
    for node in nodes:
        if not _in(node, partitions) or node.gpus.get(gres_type, 0) < count:
            continue
        declared = [f for f in node.features if feature_cuda((f,))]
        if not declared:
            have = drivers.version((), types.slug(gres_type))
            if have is not None and have < cuda.version:
                continue  # the map says too old; whether a constraint can exclude it depends on the others
            return ""
        if feature_cuda(tuple(declared)) < cuda.version:
            too_old = True
        else:
            wanted.update(f for f in declared if feature_cuda((f,)) >= cuda.version)
    return "|".join(sorted(wanted)) if too_old and wanted else ""
