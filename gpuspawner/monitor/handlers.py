"""The monitor's HTTP API: JSON snapshot, Server-Sent Events stream, Prometheus metrics.

Every handler is a jupyter_server ``APIHandler`` behind ``@web.authenticated``
and ``@authorized`` (resource ``"gpus"``), like every Jupyter API: token,
cookie (JupyterHub's OAuth included) and the server's authorizer apply.
Handlers never call NVML: they read the sampler's samples. Watching GPUs is
not user activity, so these requests do not reset the server's idle time.

- ``GET {base_url}api/gpus``: the newest sample; ``?history=1`` adds all kept
  samples, ``?history=SECONDS`` the last SECONDS of them.
- ``GET {base_url}api/gpus/stream``: ``text/event-stream``; one ``sample``
  event per new sample (``?history=...`` as above sends a ``history`` event first;
  ``?view=panel``: it feeds a GPU panel on screen, so every sample reads everything).
- ``GET {base_url}api/gpus/metrics``: Prometheus text exposition.
"""

from __future__ import annotations

import asyncio
import math

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tornado import web
from tornado.iostream import StreamClosedError

from ..inputs import dumps
from .sampler import Sampler

AUTH_RESOURCE = "gpus"
KEEPALIVE_SECONDS = 15.0


class _GPUHandler(APIHandler):
    auth_resource = AUTH_RESOURCE
    _track_activity = False

    @property
    def sampler(self) -> Sampler:
        return self.settings["gpuspawner_sampler"]

    def _history_seconds(self) -> float | None | bool:
        """False: no history asked; None: all of it; else seconds."""
        raw = self.get_argument("history", None)
        if raw is None or raw in ("", "0", "false", "no"):
            return False
        if raw in ("1", "true", "yes", "all"):
            return None
        try:
            seconds = float(raw)
        except ValueError:
            raise web.HTTPError(400, f"history: expected 1 or a number of seconds, not {raw!r}") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise web.HTTPError(400, f"history: expected a number of seconds >= 0, not {raw!r}")
        return seconds


class SnapshotHandler(_GPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        history = self._history_seconds()
        sample = await self.sampler.fresh(history=history)  # a history reader keeps utilisation sampled
        body = dict(sample)
        if history is not False:
            body["history"] = self.sampler.history(history)
        self.set_header("Cache-Control", "no-store")
        self.finish(dumps(body))


class StreamHandler(_GPUHandler):
    """Server-Sent Events: the sampler pushes; a client never causes an NVML call."""

    _queue: asyncio.Queue | None = None

    def _deliver(self, sample: dict, encoded: str) -> None:
        queue = self._queue
        if queue is None:
            return
        if queue.full():  # a slow client skips samples rather than growing memory
            queue.get_nowait()
        queue.put_nowait((sample["time"], encoded))

    def on_connection_close(self) -> None:
        if self._queue is not None:
            if self._queue.full():
                self._queue.get_nowait()
            self._queue.put_nowait(None)

    @web.authenticated
    @authorized
    async def get(self) -> None:
        history = self._history_seconds()
        view = self.get_argument("view", "status")
        if view not in ("status", "panel"):
            raise web.HTTPError(400, f"view: expected status or panel, not {view!r}")
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache, no-store")
        self.set_header("X-Accel-Buffering", "no")  # proxies: do not buffer the stream
        self._queue = asyncio.Queue(maxsize=8)
        sampler = self.sampler
        sampler.subscribe(self._deliver, panel=view == "panel")
        try:
            self.write("retry: 3000\n\n")
            if history is not False:
                self.write(f"event: history\ndata: {dumps(sampler.history(history))}\n\n")
            # values the stream carries anyway (read within detail_interval) do for a joining status bar
            slack = 0 if view == "panel" else sampler.schedule.detail_interval
            first = await sampler.fresh(detail_age=slack + 2 * sampler.interval)
            self.write(f"event: sample\ndata: {dumps(first)}\n\n")
            await self.flush()
            last_time = first["time"]
            while True:
                try:
                    item = await asyncio.wait_for(self._queue.get(), KEEPALIVE_SECONDS)
                except asyncio.TimeoutError:
                    self.write(": keepalive\n\n")
                    await self.flush()
                    continue
                if item is None:  # the client went away
                    break
                sample_time, encoded = item
                if sample_time <= last_time:  # already sent as the first sample
                    continue
                last_time = sample_time
                self.write(f"event: sample\ndata: {encoded}\n\n")
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            sampler.unsubscribe(self._deliver)
            self._queue = None


class _SampleCollector:
    """Prometheus gauges built from one sample."""

    def __init__(self, sample: dict) -> None:
        self.sample = sample

    def collect(self):
        labels = ["index", "uuid", "name"]
        up = GaugeMetricFamily("gpuspawner_gpu_monitor_up", "1 when NVML answers and a GPU is visible",
                               labels=["status"])
        up.add_metric([self.sample["status"]], 1.0 if self.sample["status"] == "ok" else 0.0)
        yield up
        gauges = {
            "utilization_gpu": ("gpuspawner_gpu_utilization_percent", "GPU utilisation (%)", 1),
            "utilization_memory": ("gpuspawner_gpu_memory_utilization_percent", "memory bandwidth utilisation (%)", 1),
            "memory_used": ("gpuspawner_gpu_memory_used_bytes",
                            "GPU memory allocated by processes, as nvidia-smi's memory.used (bytes)", 1),
            "memory_reserved": ("gpuspawner_gpu_memory_reserved_bytes",
                                "GPU memory the driver reserves for itself (bytes)", 1),
            "memory_total": ("gpuspawner_gpu_memory_total_bytes", "GPU memory (bytes)", 1),
            "temperature": ("gpuspawner_gpu_temperature_celsius", "GPU temperature (Celsius)", 1),
            "power": ("gpuspawner_gpu_power_watts", "power draw (W)", 1),
            "power_limit": ("gpuspawner_gpu_power_limit_watts", "enforced power limit (W)", 1),
        }
        families = {key: GaugeMetricFamily(name, doc, labels=labels) for key, (name, doc, _) in gauges.items()}
        clocks = GaugeMetricFamily("gpuspawner_gpu_clock_hertz", "current clock (Hz)", labels=[*labels, "clock"])
        procs = GaugeMetricFamily("gpuspawner_gpu_process_memory_bytes",
                                  "GPU memory per process, counted once for a compute+graphics process (bytes)",
                                  labels=[*labels, "pid", "kernel_id", "path"])
        mig_labels = [*labels, "mig_uuid", "mig_name"]
        mig_families = {
            key: GaugeMetricFamily(f"gpuspawner_gpu_mig_{key}_bytes", doc, labels=mig_labels)
            for key, doc in (("memory_used", "MIG device memory allocated by processes (bytes)"),
                             ("memory_reserved", "MIG device memory the driver reserves (bytes)"),
                             ("memory_total", "MIG device memory (bytes)"))
        }
        for gpu in self.sample["gpus"]:
            values = [str(gpu["index"]), gpu["uuid"] or "", gpu["name"] or ""]
            for key, family in families.items():
                if gpu.get(key) is not None:
                    family.add_metric(values, float(gpu[key]))
            for clock in ("sm", "memory", "graphics"):
                if gpu.get(f"clock_{clock}") is not None:
                    clocks.add_metric([*values, clock], gpu[f"clock_{clock}"] * 1e6)
            for m in gpu["mig"]:
                for key, family in mig_families.items():
                    if m.get(key) is not None:
                        family.add_metric([*values, m["uuid"] or "", m["name"] or ""], float(m[key]))
            for p in gpu["processes"]:
                if p["used_memory"] is not None:
                    kernel = p["kernel"] or {}
                    procs.add_metric([*values, str(p["pid"]), kernel.get("id") or "", kernel.get("path") or ""],
                                     float(p["used_memory"]))
        yield from families.values()
        yield clocks
        yield procs
        yield from mig_families.values()


class MetricsHandler(_GPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        sample = await self.sampler.fresh()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_SampleCollector(sample))
        self.finish(generate_latest(registry), set_content_type=CONTENT_TYPE_LATEST)


def handlers(base_url: str) -> list[tuple[str, type]]:
    """The routes, under the server's base_url."""
    return [
        (url_path_join(base_url, "api/gpus"), SnapshotHandler),
        (url_path_join(base_url, "api/gpus/stream"), StreamHandler),
        (url_path_join(base_url, "api/gpus/metrics"), MetricsHandler),
    ]
