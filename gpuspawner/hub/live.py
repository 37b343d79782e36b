"""Live GPU numbers for the admin overview, never blocking the hub's event loop.

Two sources: each running server's monitor (``GET {server}/api/gpus``, called
concurrently with short timeouts and cached a few seconds) and, when the hub
runs on the GPU host, NVML in a worker thread. Every value keeps the time it
was sampled, so the overview can say how old it is.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from .. import nvml


@dataclass(frozen=True)
class GPUNumbers:
    """One GPU's live values and when (``time.time()``) they were sampled."""

    utilization_gpu: float | None
    memory_used: int | None
    memory_total: int | None
    sampled_at: float
    source: str  # "monitor" or "hub-nvml"


@dataclass
class _Fetched:
    at: float  # time.monotonic() of the fetch
    numbers: dict[str, GPUNumbers]
    error: str | None = None


class LiveStats:
    """Cached, concurrent reads of the servers' monitors and the hub's NVML."""

    def __init__(self, ttl: float = 3.0, timeout: float = 2.0) -> None:
        self.ttl = ttl
        self.timeout = timeout
        self._servers: dict[str, _Fetched] = {}
        self._nvml: _Fetched | None = None
        self._inflight: dict[str, asyncio.Future] = {}

    async def from_monitors(
        self, targets: dict[str, str], token: str | None
    ) -> tuple[dict[str, GPUNumbers], dict[str, str]]:
        """uuid -> numbers from the servers in ``targets`` (owner -> server URL), and owner -> error."""
        now = time.monotonic()
        due = [o for o in targets if o not in self._servers or now - self._servers[o].at > self.ttl]
        if due and token:
            await asyncio.gather(*(self._fetch_once(o, targets[o], token) for o in due))
        numbers: dict[str, GPUNumbers] = {}
        errors: dict[str, str] = {}
        for owner in targets:
            fetched = self._servers.get(owner)
            if fetched is None:
                errors[owner] = "no token to read this server's monitor"
                continue
            numbers.update(fetched.numbers)
            if fetched.error:
                errors[owner] = fetched.error
        for gone in set(self._servers) - set(targets):
            del self._servers[gone]
        return numbers, errors

    def _fetch_once(self, owner: str, url: str, token: str) -> asyncio.Future:
        future = self._inflight.get(owner)
        if future is None or future.done():
            future = self._inflight[owner] = asyncio.ensure_future(self._fetch(owner, url, token))
        return future

    async def _fetch(self, owner: str, url: str, token: str) -> None:
        request = HTTPRequest(
            url.rstrip("/") + "/api/gpus", headers={"Authorization": f"token {token}"},
            connect_timeout=self.timeout, request_timeout=self.timeout, follow_redirects=False,
        )
        previous = self._servers.get(owner)
        kept = previous.numbers if previous else {}
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
            if response.code != 200:
                raise ValueError(f"the server's monitor answered HTTP {response.code}")
            sample = json.loads(response.body)
            sampled_at = _number(sample["time"])
            if sampled_at is None:
                raise ValueError("the server's monitor gave no sample time")
            numbers = {  # a server is its user's: only finite numbers of the right kind are taken
                g["uuid"]: GPUNumbers(_number(g.get("utilization_gpu")), _number(g.get("memory_used"), int),
                                      _number(g.get("memory_total"), int), sampled_at, "monitor")
                for g in sample.get("gpus", []) if isinstance(g.get("uuid"), str) and g["uuid"]
            }
            error = None if sample.get("status") == "ok" else f"monitor: {sample.get('status')}"
            self._servers[owner] = _Fetched(time.monotonic(), numbers, error)
        except Exception as e:  # unreachable, timeout, bad JSON: keep the old numbers, say why
            reason = str(e) or type(e).__name__
            self._servers[owner] = _Fetched(time.monotonic(), kept, f"monitor not reachable: {reason}")

    async def from_hub_nvml(self, uuids: list[str]) -> dict[str, GPUNumbers]:
        """uuid -> numbers read through NVML on the hub's host (in a thread)."""
        if self._nvml is None or time.monotonic() - self._nvml.at > self.ttl:
            numbers = await asyncio.to_thread(_read_nvml, tuple(uuids))
            self._nvml = _Fetched(time.monotonic(), numbers)
        return self._nvml.numbers


def _number(value: object, kind: type = float) -> float | int | None:
    """A finite, non-negative number from a monitor's JSON as ``kind`` (a whole number stays one), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        return None
    return value if kind is float and isinstance(value, int) else kind(value)


def _read_nvml(uuids: tuple[str, ...]) -> dict[str, GPUNumbers]:
    wanted = set(uuids)
    out = {}
    for device in nvml.devices().devices:  # none when NVML cannot start
        if device.uuid.value not in wanted:
            continue
        util = nvml.query("nvmlDeviceGetUtilizationRates", device.handle.value)
        memory = nvml.memory_info(device.handle.value)  # used as nvidia-smi: without reserved memory
        out[device.uuid.value] = GPUNumbers(
            util.value.gpu if util.ok else None,
            memory.value.used if memory.ok else None,
            memory.value.total if memory.ok else None,
            time.time(), "hub-nvml",
        )
    return out
