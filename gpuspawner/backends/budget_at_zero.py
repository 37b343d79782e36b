"""What happens to a running server or notebook job whose user's GPU budget runs out: :class:`GPUBudgetAtZeroMixin`.

A parent of :class:`~gpuspawner.backends.base.GPUSpawnerMixin`, so its traits are configured as
``c.GPUSpawnerMixin.gpu_budget_at_zero`` etc. The hub's watcher (:mod:`gpuspawner.hub.budget_notices`)
reads them; the budgets themselves (limits, periods, weights) are :mod:`gpuspawner.budgets`'.
"""

from __future__ import annotations

from traitlets import Float, TraitError, Unicode, validate
from traitlets.config import Configurable

AT_ZERO = ("stop", "finish")


class GPUBudgetAtZeroMixin(Configurable):
    """A running server's or job's end when its user's budget reaches zero (see the README's "Budgets")."""

    gpu_budget_at_zero = Unicode(
        "stop",
        help="""What happens to a user's running GPU servers and notebook GPU jobs when a GPU budget that
        applies to the user is spent (nothing left of it in its period).

        - ``"stop"``: they are stopped (a job is cancelled); their usage records end with the reason
          ``budget``.
        - ``"finish"``: they run on until their user stops them (a job until it ends); only new GPU
          servers and jobs meet the budget (``gpu_budget_exhausted``).

        Either way each server is warned before, by a notice JupyterLab shows (see
        ``gpu_budget_warn_before``), and told again when the budget is spent. Any other value is
        refused at hub start.""",
    ).tag(config=True)

    @validate("gpu_budget_at_zero")
    def _check_at_zero(self, proposal):
        if proposal["value"] not in AT_ZERO:
            raise TraitError(f"gpu_budget_at_zero must be 'stop' or 'finish', not {proposal['value']!r}")
        return proposal["value"]

    gpu_budget_warn_before = Float(
        900.0,
        help="""Seconds ahead that a running server is warned its user's GPU budget runs out: when, at the
        GPUs the user's servers and jobs hold now (weighted as the budget weighs them), what is left of a
        budget lasts this long or less. The warning says when it runs out and what happens then
        (``gpu_budget_at_zero``). ``0``: no warning before the budget is spent. A finite number, 0 or
        more.""",
    ).tag(config=True)

    @validate("gpu_budget_warn_before")
    def _check_budget_warn_before(self, proposal):
        if not 0 <= proposal["value"] < float("inf"):
            raise TraitError(f"gpu_budget_warn_before must be a finite number of seconds >= 0, "
                             f"not {proposal['value']}")
        return proposal["value"]
