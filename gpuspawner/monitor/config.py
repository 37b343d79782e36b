"""Configuration of the GPU monitor (traitlets, set in jupyter_server_config.py).

```python
c.GPUMonitor.interval = 1.0          # seconds between samples while someone watches
c.GPUMonitor.detail_interval = 15    # seconds between reads of everything beyond utilisation and memory
c.GPUMonitor.idle_interval = 5       # seconds between utilisation-only samples for the GPU culler
c.GPUMonitor.history_seconds = 600   # history a new tab starts with
c.GPUMonitor.idle_pause = 30         # slow down this long after the last client
```
"""

from __future__ import annotations

from traitlets import Bool, Float, TraitError, validate
from traitlets.config import Configurable


class GPUMonitor(Configurable):
    """Live GPU statistics of this server's GPUs, for the JupyterLab status bar and GPU panel."""

    enabled = Bool(
        True, help="Serve the GPU monitor's API (api/gpus, api/gpus/stream, api/gpus/metrics, "
        "api/gpus/notices). False: none of it, and no sampler; the JupyterLab status bar item and "
        "GPU panel then have nothing to show."
    ).tag(config=True)

    interval = Float(
        1.0,
        help="Seconds between two samples of every visible GPU while someone watches (a live stream is "
        "open, or a snapshot was asked for within idle_pause seconds) (0.1 to 60). One sampler thread per "
        "server reads NVML; every client shares its samples. Each sample reads utilisation and memory; "
        "the other live values every detail_interval.",
    ).tag(config=True)

    detail_interval = Float(
        15.0,
        help="Seconds between two reads of the live values beyond utilisation and memory (temperature, "
        "power, clocks, PCIe and NVLink throughput, processes, MIG devices' memory) while someone watches "
        "(0.1 to 3600; at least interval). The samples in between carry the last read values; a sample's "
        "detail_time says when they were read. A client that finds no recent sample (a watcher joining, a "
        "snapshot after a pause) gets a sample with everything read at once.",
    ).tag(config=True)

    idle_interval = Float(
        5.0,
        help="Seconds between two utilisation-only samples while nobody watches but a reader of the history "
        "(api/gpus?history=..., as the GPU idle culler reads every round) asked within the seconds of history "
        "it asked for, so that it finds the GPUs' use between its reads (0.1 to 3600; at least interval). "
        "With no such reader sampling stops idle_pause seconds after the last client.",
    ).tag(config=True)

    history_seconds = Float(
        600.0,
        help="Seconds of samples kept in memory, so a newly opened panel starts with history (0 to 86400; "
        "at least the newest sample is always kept).",
    ).tag(config=True)

    idle_pause = Float(
        30.0,
        help="Seconds after the last request (and with no live stream open) after which sampling every "
        "interval stops: then only idle_interval's utilisation samples for a history reader, or none; the "
        "next request wakes it (1 to 86400).",
    ).tag(config=True)

    static_refresh = Float(
        300.0,
        help="Seconds between re-reads of the slow-changing facts (GPU list, names, memory totals, power "
        "limits, maximum clocks, MIG layout) while sampling (1 to 86400).",
    ).tag(config=True)

    @staticmethod
    def _bounded(proposal, low: float, high: float) -> float:
        value = proposal["value"]
        if not low <= value <= high:
            raise TraitError(f"GPUMonitor.{proposal['trait'].name} must be between {low:g} and {high:g}, not {value!r}")
        return value

    @validate("interval")
    def _check_interval(self, proposal):
        return self._bounded(proposal, 0.1, 60)

    @validate("detail_interval", "idle_interval")
    def _check_slow(self, proposal):
        return self._bounded(proposal, 0.1, 3600)

    @validate("history_seconds")
    def _check_history(self, proposal):
        return self._bounded(proposal, 0, 86400)

    @validate("idle_pause")
    def _check_idle(self, proposal):
        return self._bounded(proposal, 1, 86400)

    @validate("static_refresh")
    def _check_static(self, proposal):
        return self._bounded(proposal, 1, 86400)
