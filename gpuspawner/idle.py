"""The GPU culler's pure idle decision: :class:`IdleTracker` (no I/O, no clock of its own).

Fed (sample time, highest GPU utilisation) pairs per server start, it says how long that
start's GPUs have stayed below the threshold and what to do now: nothing, warn, or stop.
The culler service (:mod:`gpuspawner.hub.culler`) feeds it what the servers' monitors read;
the replay (:mod:`gpuspawner.replay`) feeds it a simulated day.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Idle:
    idle_since: float | None = None  # sample time when the current idle stretch began
    last_sample: float = float("-inf")  # newest sample seen (known or not)
    last_known: float = float("-inf")  # newest sample with a utilisation value
    warned_at: float | None = None  # wall time of the warning


@dataclass
class IdleTracker:
    """Pure bookkeeping: per server start (any hashable key), since when its GPUs are idle and
    what to do now."""

    threshold: float
    idle_timeout: float
    warn_before: float
    _servers: dict[str, _Idle] = field(default_factory=dict)

    def observe(self, key: str, samples: list[tuple[float, float | None]], now: float) -> tuple[str, float]:
        """Feed (sample time, highest GPU utilisation) pairs; return (action, seconds idle).

        Actions: ``"busy"``, ``"idle"`` (not long enough yet), ``"warn"`` (warn now)
        and ``"stop"`` (warned long enough ago and still idle).
        """
        state = self._servers.setdefault(key, _Idle())
        for at, utilization in sorted(samples):
            if at <= state.last_sample:
                continue
            state.last_sample = at
            if utilization is None:  # unknown time counts neither as idle nor as busy
                continue
            state.last_known = at
            if utilization >= self.threshold:
                state.idle_since, state.warned_at = None, None
            elif state.idle_since is None:
                state.idle_since = at
        if state.idle_since is None:
            return "busy", 0.0
        idle_for = state.last_known - state.idle_since
        if state.warned_at is None:
            if idle_for >= self.idle_timeout - self.warn_before:
                return "warn", idle_for
            return "idle", idle_for
        if idle_for >= self.idle_timeout and now - state.warned_at >= self.warn_before:
            return "stop", idle_for
        return "idle", idle_for

    def warned(self, key: str, now: float) -> None:
        self._servers.setdefault(key, _Idle()).warned_at = now

    def forget_except(self, keys: set[str]) -> None:
        for gone in set(self._servers) - keys:
            del self._servers[gone]
