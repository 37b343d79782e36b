"""The GPU culler's pure idle decision: :class:`IdleTracker` (no I/O, no clock of its own).

Fed (sample time, highest GPU utilisation) pairs per server start, it says how long that
start has stayed unused and what to do now: nothing, warn, or stop. A start is in use at a
moment when any of its GPUs is at or above the threshold, or, where the caller passes them,
at the moments its kernels were active (running code, or answering the user's editor):
the culler passes those only with ``--kernel-activity on``, so by default the rule is the
GPUs' alone. The culler service (:mod:`gpuspawner.hub.culler`) feeds it what the servers'
monitors (and kernels) read; the replay (:mod:`gpuspawner.replay`) feeds it a simulated day.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class _Idle:
    idle_since: float | None = None  # sample time when the current idle stretch began
    last_sample: float = float("-inf")  # newest sample seen (known or not)
    last_known: float = float("-inf")  # newest sample with a utilisation value
    last_active: float = float("-inf")  # newest kernel activity seen
    warned_at: float | None = None  # wall time of the warning


@dataclass
class IdleTracker:
    """Pure bookkeeping: per server start (any hashable key), since when its GPUs are idle and
    what to do now."""

    threshold: float
    idle_timeout: float
    warn_before: float
    _servers: dict[str, _Idle] = field(default_factory=dict)

    def observe(self, key: str, samples: list[tuple[float, float | None]], now: float,
                activity: Iterable[float] = ()) -> tuple[str, float]:
        """Feed (sample time, highest GPU utilisation) pairs, and optionally the times the server's
        kernels were active; return (action, seconds idle).

        Each activity time counts as a busy sample at that moment (the idle count starts again
        after it), whatever the GPUs read. Actions: ``"busy"``, ``"idle"`` (not long enough yet),
        ``"warn"`` (warn now) and ``"stop"`` (warned long enough ago and still idle).
        """
        state = self._servers.setdefault(key, _Idle())
        events = [(at, utilization, False) for at, utilization in samples]
        events += [(at, None, True) for at in activity]
        for at, utilization, active in sorted(events, key=lambda e: (e[0], e[2])):
            if active:
                if at > state.last_active:
                    state.last_active = at
                    state.idle_since, state.warned_at = None, None
                continue
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

    def idle_since(self, key: str) -> float | None:
        """Sample time at which ``key``'s current idle stretch began; None while in use or unseen."""
        state = self._servers.get(key)
        return None if state is None else state.idle_since

    def warned(self, key: str, now: float) -> None:
        self._servers.setdefault(key, _Idle()).warned_at = now

    def forget_except(self, keys: set[str]) -> None:
        for gone in set(self._servers) - keys:
            del self._servers[gone]
