"""Timing one spawn from the hub's REST API, shared by the spawn benchmarks (prints nothing)."""

from __future__ import annotations

import time
from collections.abc import Callable

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
