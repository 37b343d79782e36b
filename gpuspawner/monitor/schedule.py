"""When the sampler reads NVML, and how much: a pure schedule (no I/O, no clock of its own).

Three readings, from cheap to complete (what each reads: ``reading.py``):

- ``UTILIZATION``: utilisation only (one NVML call per GPU), the one number the GPU idle culler and
  the usage accounting judge by;
- ``CORE``: utilisation and memory (two calls per GPU), what the status bar and the first two charts
  show every second; the slower fields are carried from the last complete reading;
- ``FULL``: everything (temperature, power, clocks, PCIe and NVLink throughput, processes, MIG memory).

Who asks decides the pace:

- *watched*: a live stream is open, or a snapshot (``api/gpus`` without ``history``, metrics) came
  within ``idle_pause`` seconds: a reading every ``interval``, ``FULL`` every ``detail_interval``
  and ``CORE`` in between; ``FULL`` every ``interval`` while a stream feeds a GPU panel on screen
  (``panels``: it charts and lists everything);
- *kept*: nobody watches, but a reader of the history (``api/gpus?history=...``: the GPU culler, the
  idle-culler hook) came within the seconds of history it asked for, so it will come back for the
  samples in between: ``UTILIZATION`` every ``idle_interval``;
- *paused*: otherwise. No NVML call at all.

Whatever the pace, a request that finds no sample recent and complete enough (:meth:`want_full`)
gets a ``FULL`` reading at once: a watcher joining after a quiet hour sees fresh values in the
time one reading takes, not after ``idle_interval``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

UTILIZATION, CORE, FULL = "utilization", "core", "full"

NEVER = math.inf


@dataclass
class Schedule:
    interval: float = 1.0
    detail_interval: float = 15.0
    idle_interval: float = 5.0
    idle_pause: float = 30.0
    history_seconds: float = 600.0
    streams: int = 0  # open live streams
    panels: int = 0  # of them, streams feeding a GPU panel on screen
    last_snapshot: float = -math.inf  # monotonic time of the last snapshot request
    keep_until: float = -math.inf  # history readers expect samples until then
    full_wanted: bool = False  # a request waits for a complete reading
    last_reading: float = -math.inf  # monotonic start of the last reading, whatever it read
    last_full: float = -math.inf  # monotonic start of the last complete reading

    # ---------------------------------------------------------------- demand --

    def snapshot(self, now: float) -> None:
        """A snapshot request (no history): watched for ``idle_pause`` seconds."""
        self.last_snapshot = now

    def history_read(self, now: float, seconds: float | None) -> None:
        """A request for the last ``seconds`` of history (None: all kept): keep sampling utilisation
        that long, so that the reader finds samples between its reads."""
        span = self.history_seconds if seconds is None else min(seconds, self.history_seconds)
        self.keep_until = max(self.keep_until, now + span)

    def want_full(self) -> None:
        self.full_wanted = True

    # ------------------------------------------------------------- the pace --

    def watched(self, now: float) -> bool:
        return self.streams > 0 or now - self.last_snapshot <= self.idle_pause

    def kept(self, now: float) -> bool:
        return now <= self.keep_until

    def paused(self, now: float) -> bool:
        return not (self.full_wanted or self.watched(now) or self.kept(now))

    def next(self, now: float) -> tuple[str | None, float]:
        """(what to read now, or None; else how many seconds until the next reading is due, NEVER
        while paused). A demand that comes meanwhile wakes the sampler, which asks again."""
        if self.full_wanted:
            return FULL, 0.0
        if self.watched(now):
            due = self.last_reading + self.interval
            if now < due:
                return None, due - now
            if self.panels > 0 or now - self.last_full >= self.detail_interval:
                return FULL, 0.0
            return CORE, 0.0
        if self.kept(now):
            due = self.last_reading + self.idle_interval
            if now < due:
                return None, due - now
            return UTILIZATION, 0.0
        return None, NEVER

    def taken(self, reads: str, started: float) -> None:
        """A reading of kind ``reads`` started at ``started`` is done."""
        self.last_reading = started
        if reads == FULL:
            self.last_full = started
            self.full_wanted = False
