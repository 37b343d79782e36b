"""What one server or job asks placement for: :class:`GPURequest`. Pure.

Its own module so that :mod:`gpuspawner.placement` (which places it) and
:mod:`gpuspawner.refusals` (which words why it cannot be placed) both read it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuspawner.topology import INTERCONNECTS

__all__ = ["ANY_MODEL", "GPURequest"]

ANY_MODEL = "any"


@dataclass(frozen=True)
class GPURequest:
    """What one user server asks for.

    ``models`` holds patterns for :func:`~gpuspawner.gpu.slug_matches`, in
    order of preference; ``()`` or a tuple containing ``"any"`` accepts any
    model. Patterns are normalised to stripped lower case, and a single string
    is accepted as a one-element tuple. ``interconnect="nvlink"`` accepts only
    GPUs NVLink joins (for two or more GPUs).
    """

    owner: str
    count: int
    models: tuple[str, ...] = ()
    interconnect: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.owner, str) or not self.owner:
            raise ValueError("GPURequest.owner must be a non-empty string")
        if isinstance(self.count, bool) or not isinstance(self.count, int):
            raise ValueError(f"GPURequest.count must be an int, got {self.count!r}")
        if self.count < 0:
            raise ValueError(f"GPURequest.count must be >= 0, got {self.count}")
        if self.interconnect is not None and self.interconnect not in INTERCONNECTS:
            raise ValueError(f"GPURequest.interconnect must be None or one of {INTERCONNECTS}")
        models = (self.models,) if isinstance(self.models, str) else tuple(self.models)
        cleaned = tuple(p.strip().lower() for p in models if p and p.strip())
        object.__setattr__(self, "models", cleaned)

    @property
    def any_model(self) -> bool:
        """Whether every model is acceptable."""
        return not self.models or ANY_MODEL in self.models
