"""Pure: how a job's run ended (:class:`Ended`, what a runner answers) and what that means for the job."""

from __future__ import annotations

from dataclasses import dataclass

from .execute import STOPPED_EXIT


@dataclass(frozen=True)
class Ended:
    """How a job's run ended: its exit code where known, and the executor's status file."""

    exit_code: int | None
    outcome: str | None  # "completed" | "failed" | "stopped" | "timed_out" | None (no status written)
    error: str | None



def outcome_of(ended: Ended) -> tuple[str, str]:
    """A finished job's state and its reason in words, from how its run ended."""
    if ended.outcome == "timed_out":  # the backend's own time limit (Slurm's --time)
        return "timed_out", ended.error or "stopped at its time limit"
    if ended.outcome == "completed" or (ended.outcome is None and ended.exit_code == 0):
        return "completed", "completed"
    if ended.outcome == "stopped" or ended.exit_code in (STOPPED_EXIT, -15, 137, -9):
        return "cancelled", "stopped"
    if ended.outcome == "failed" or ended.error:
        return "failed", ended.error or "the notebook failed"
    if ended.exit_code is None:
        return "failed", "the job ended while the hub was down and left no outcome"
    return "failed", f"the job's process exited with status {ended.exit_code}"
