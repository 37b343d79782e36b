"""Does an image's CUDA fit the host's driver? Pure functions, no I/O.

A CUDA image says which CUDA it needs in its environment, the way NVIDIA's
container toolkit reads it:

- ``NVIDIA_REQUIRE_CUDA``: an expression such as
  ``"cuda>=12.2 brand=tesla,driver>=470,driver<471"``. Space-separated groups
  are alternatives (OR); comma-separated constraints within a group must all
  hold (AND). Other ``NVIDIA_REQUIRE_*`` variables must hold too (AND).
- otherwise ``CUDA_VERSION`` (``"12.6.1"``) or the label
  ``com.nvidia.cuda.version``: the image needs at least that major.minor.
- ``NVIDIA_DISABLE_REQUIRE`` set to a true value turns the check off, as it
  does in the toolkit.

Configuration names an image's CUDA too (gpu-kube's ``image_cuda``):
:func:`min_cuda` reads ``"12.4"`` or a whole ``NVIDIA_REQUIRE_CUDA`` value with
the same parser. The host side is what NVML reports: the CUDA version the driver supports
(``nvmlSystemGetCudaDriverVersion``: 12040 means 12.4) and the driver version
(``"550.54.15"``). :func:`check_image` turns both into a refusal sentence, or
None when the image can run. A constraint that cannot be judged from what is
known (a GPU brand or architecture, an unknown driver) never refuses: only a
definite mismatch does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .gpu import GPU

__all__ = [
    "Constraint",
    "CudaVersion",
    "HostCuda",
    "Requirement",
    "check_image",
    "cuda_version_text",
    "host_cuda",
    "image_requirements",
    "min_cuda",
    "parse_requirement",
]

#: A CUDA version as (major, minor): (12, 4).
CudaVersion = tuple[int, int]

_PLAIN_VERSION = re.compile(r"\s*([0-9]{1,3})(?:\.([0-9]{1,3}))?(?:\.[0-9]{1,4})?\s*")
_CONSTRAINT = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|==|=|>|<)\s*([A-Za-z0-9._-]+)\s*$")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Constraint:
    """One ``key OP value`` term, e.g. ``cuda>=12.2`` or ``brand=tesla``."""

    key: str  # cuda, driver, brand, arch
    op: str  # >=, <=, =, >, <
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


@dataclass(frozen=True)
class Requirement:
    """One ``NVIDIA_REQUIRE_*`` expression: any group may hold; all of a group's terms must."""

    source: str  # where it came from, e.g. "NVIDIA_REQUIRE_CUDA"
    groups: tuple[tuple[Constraint, ...], ...]

    @property
    def min_cuda(self) -> tuple[int, ...] | None:
        """The CUDA version the first group asks for (``cuda>=X``), for messages."""
        for group in self.groups:
            for term in group:
                if term.key == "cuda" and term.op in (">=", ">", "=", "=="):
                    return _version(term.value)
        return None


@dataclass(frozen=True)
class HostCuda:
    """What the driver of one host offers."""

    host: str
    cuda: CudaVersion | None  # (12, 4) for NVML's 12040
    driver: str | None  # "550.54.15"


def parse_requirement(text: str, source: str = "NVIDIA_REQUIRE_CUDA") -> Requirement:
    """Parse an ``NVIDIA_REQUIRE_*`` value; raise ValueError naming a bad term."""
    groups = []
    for group_text in text.split():
        terms = []
        for term in group_text.split(","):
            if not term:
                continue
            m = _CONSTRAINT.match(term)
            if not m:
                raise ValueError(f"{source}: cannot read the constraint {term!r}")
            key, op, value = m.groups()
            terms.append(Constraint(key, "=" if op == "==" else op, value))
        if terms:
            groups.append(tuple(terms))
    return Requirement(source, tuple(groups))


def min_cuda(text: object) -> CudaVersion:
    """The CUDA version (major, minor) a configured requirement asks for at least.

    Accepts a version (``"12.4"``, ``"12"``, ``"12.4.1"``) or an expression as
    :func:`parse_requirement` reads it (``"cuda>=12.4"``, or a whole
    ``NVIDIA_REQUIRE_CUDA`` value such as ``"cuda>=12.4 brand=tesla,driver>=470,driver<471"``:
    its ``cuda`` term counts). Raises ValueError for anything else.

    >>> min_cuda("cuda>=12.4 brand=tesla,driver>=470,driver<471")
    (12, 4)
    >>> min_cuda("11")
    (11, 0)
    """
    if not isinstance(text, str):  # configuration: callers catch ValueError
        kind = type(text).__name__
        raise ValueError(f"CUDA requirement must be a string such as '12.4', not {kind}")
    plain = _PLAIN_VERSION.fullmatch(text)
    if plain:
        return int(plain.group(1)), int(plain.group(2) or 0)
    try:
        needed = parse_requirement(text).min_cuda
    except ValueError:
        needed = None
    if not needed:
        shown = text if len(text) <= 60 else text[:60] + "..."
        raise ValueError(f"{shown!r} is not a CUDA requirement such as '12.4' or 'cuda>=12.4'")
    return needed[0], needed[1] if len(needed) > 1 else 0


def _env_dict(env: Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if isinstance(env, Mapping):
        return dict(env)
    pairs = (item.partition("=") for item in env)
    return {k: v for k, _, v in pairs}


def image_requirements(
    env: Iterable[str] | Mapping[str, str] | None,
    labels: Mapping[str, str] | None = None,
) -> tuple[Requirement, ...]:
    """The CUDA requirements an image declares (its ``Config.Env`` and ``Config.Labels``).

    Returns ``()`` when the image declares none or turns the check off with
    ``NVIDIA_DISABLE_REQUIRE``. Unreadable expressions raise ValueError.
    """
    values = _env_dict(env)
    labels = dict(labels or {})
    if values.get("NVIDIA_DISABLE_REQUIRE", "").strip().lower() in _TRUE:
        return ()
    found = [
        parse_requirement(value, key)
        for key, value in sorted(values.items())
        if key.startswith("NVIDIA_REQUIRE_") and value.strip()
    ]
    if not any(r.source == "NVIDIA_REQUIRE_CUDA" for r in found):
        version = values.get("CUDA_VERSION") or labels.get("com.nvidia.cuda.version")
        if version and _version(version):
            major_minor = ".".join(str(p) for p in _version(version)[:2])
            source = "CUDA_VERSION" if values.get("CUDA_VERSION") else "label com.nvidia.cuda.version"
            found.append(Requirement(source, ((Constraint("cuda", ">=", major_minor),),)))
    return tuple(found)


def host_cuda(gpus: Sequence[GPU]) -> HostCuda:
    """The driver facts of the host the GPUs are on (placement keeps them on one host)."""
    host = gpus[0].host if gpus else "?"
    versions = [g.cuda_driver_version for g in gpus if g.cuda_driver_version]
    drivers = [g.driver_version for g in gpus if g.driver_version]
    cuda = None
    if versions:
        v = min(versions)
        cuda = (v // 1000, (v % 1000) // 10)
    return HostCuda(host, cuda, drivers[0] if drivers else None)


def cuda_version_text(version: tuple[int, ...] | None) -> str:
    return ".".join(str(p) for p in version) if version else "unknown"


def check_image(image: str, requirements: Sequence[Requirement], host: HostCuda) -> str | None:
    """None if the image can run on the host; otherwise a sentence saying why not."""
    for requirement in requirements:
        verdicts = [_group_holds(group, host) for group in requirement.groups]
        if not verdicts or any(v is not False for v in verdicts):
            continue  # some alternative holds, or cannot be judged
        needed = requirement.min_cuda
        driver = f" (driver {host.driver})" if host.driver else ""
        if needed is not None and host.cuda is not None:
            return (
                f"Image {image} needs CUDA {cuda_version_text(needed)} but the driver on host "
                f"{host.host} supports CUDA {cuda_version_text(host.cuda)} at most{driver}. "
                f"Pick an image built for CUDA {cuda_version_text(host.cuda)} or older, "
                f"or ask an admin to update the driver."
            )
        expression = " ".join(",".join(str(t) for t in g) for g in requirement.groups)
        return (
            f"Image {image} requires {expression} ({requirement.source}), which the driver on host "
            f"{host.host} (CUDA {cuda_version_text(host.cuda)}{driver}) does not meet. "
            f"Pick another image or ask an admin to update the driver."
        )
    return None


# ------------------------------------------------------------------ helpers


def _version(text: str) -> tuple[int, ...] | None:
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts) if parts else None


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    # compare on the precision of the constraint: driver>=470 holds for 470.82
    have = have[: len(want)]
    have = have + (0,) * (len(want) - len(have))
    return {
        ">=": have >= want, ">": have > want, "<=": have <= want, "<": have < want, "=": have == want,
    }[op]


def _term_holds(term: Constraint, host: HostCuda) -> bool | None:
    """True, False, or None when the host facts cannot say."""
    if term.key == "cuda":
        have = host.cuda
    elif term.key == "driver":
        have = _version(host.driver) if host.driver else None
    else:  # brand, arch: not known to the hub
        return None
    want = _version(term.value)
    if have is None or want is None:
        return None
    return _compare(have, term.op, want)


def _group_holds(group: tuple[Constraint, ...], host: HostCuda) -> bool | None:
    verdicts = [_term_holds(t, host) for t in group]
    if any(v is False for v in verdicts):
        return False
    if all(v is True for v in verdicts):
        return True
    return None
