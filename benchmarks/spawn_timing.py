"""Timing spawns from the hub's REST API and printing the medians, shared by the spawn benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import requests


def timed_spawn(hub, name: str, body, server_url: Callable[[], str | None]) -> tuple[float, float]:
    """Seconds from the POST until (the server answers at its own address, the hub says ready).

    ``server_url()`` names the server's ``/user/NAME/api`` at its own address, or None until
    it can be known; it is polled every 20 ms, and the hub's readiness once the server
    answers (the hub's own check backs off with jitter, so that figure is coarser).
    """
    t0 = time.perf_counter()
    r = hub.spawn(name, body)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"{name}: {r.status_code} {r.text}\n{hub.log()}")
    answered = ready = None
    url = None
    deadline = time.monotonic() + 300
    while (answered is None or ready is None) and time.monotonic() < deadline:
        if answered is None:
            url = url or server_url()
            if url:
                try:
                    if requests.get(url, timeout=1).status_code == 200:
                        answered = time.perf_counter() - t0
                except requests.RequestException:
                    pass
        if ready is None and answered is not None:
            server = hub.user(name)["servers"].get("")
            if server and server.get("ready"):
                ready = time.perf_counter() - t0
        time.sleep(0.02)
    if answered is None or ready is None:
        raise RuntimeError(f"{name} not ready:\n{hub.log()}")
    return answered, ready


def interleaved(hubs: Mapping[str, object], rounds: int,
                spawn: Callable[[str, object, str, int], tuple[float, float]]) -> dict[str, list[float]]:
    """``rounds`` timed spawns per hub, interleaved; ``times[key]`` and ``times[key + "_hub"]``.

    ``spawn(key, hub, user, round)`` spawns, times (:func:`timed_spawn`) and stops one
    server. Round 0 warms every hub up and is not counted; who goes first rotates every round.
    """
    times: dict[str, list[float]] = {}
    for n in range(rounds + 1):
        name = f"r{n:02d}"
        order = list(hubs.items())
        order = order[n % len(order):] + order[:n % len(order)]
        for key, hub in order:
            hub.add_users(name)
            answered, ready = spawn(key, hub, name, n)
            if n:
                times.setdefault(key, []).append(answered)
                times.setdefault(key + "_hub", []).append(ready)
    return times


def print_medians(times: Mapping[str, list[float]], labels: Mapping[str, str], suffix: str) -> None:
    """One line per spawner: median, min and max of ``times[key + suffix]`` (seconds)."""
    for key, label in labels.items():
        v = times[key + suffix]
        print(f"    {label:36s} {statistics.median(v):6.3f} s (min {min(v):.3f}, max {max(v):.3f})")


def no_engine_here() -> bool:
    """Say why no private Docker engine can run here (tests/docker/engine.py), if so."""
    from engine import unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}")
    return bool(reason)
