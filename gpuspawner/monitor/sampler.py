"""One GPU sampler per server: a background thread, a ring buffer, pushes to clients.

NVML is read only in the sampler's thread (``reading.py``), never on the event
loop and never because of a particular client: every client shares the same
samples. The thread hands each sample to the event loop
(``call_soon_threadsafe``), where listeners (the SSE streams) get it.

How often and how much it reads is :class:`~.schedule.Schedule`'s: every
``interval`` while someone watches (utilisation and memory; everything every
``detail_interval``), utilisation only every ``idle_interval`` while nobody
watches but a reader of the history (the GPU culler) comes back, nothing
otherwise. A request that finds no recent complete sample (:meth:`Sampler.fresh`)
gets one at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..inputs import dumps
from .reading import Attribution, Static, read_sample, read_static
from .schedule import FULL, UTILIZATION, Schedule
from .visibility import Visibility

log = logging.getLogger(__name__)

Listener = Callable[[dict, str], None]  # (sample, the sample as JSON text)

#: Threads reading PCIe throughput side by side (two 20 ms NVML calls per GPU): 8 GPUs' at once.
PCIE_READERS = 16


class Sampler:
    """Samples this server's GPUs as its :class:`Schedule` says."""

    def __init__(
        self,
        visibility: Visibility,
        interval: float = 1.0,
        history_seconds: float = 600.0,
        idle_pause: float = 30.0,
        static_refresh: float = 300.0,
        attribute: Attribution | None = None,
        detail_interval: float = 15.0,
        idle_interval: float = 5.0,
    ) -> None:
        self.visibility = visibility
        self.interval = interval
        self.idle_pause = idle_pause
        self.schedule = Schedule(interval=interval, detail_interval=max(interval, detail_interval),
                                 idle_interval=max(interval, idle_interval), idle_pause=idle_pause,
                                 history_seconds=history_seconds)
        self._complete: dict | None = None  # the thread's: the last sample that read more than utilisation
        self.static_refresh = static_refresh
        self.attribute = attribute
        self._history: deque[dict] = deque(maxlen=max(1, round(history_seconds / interval)))
        self._lock = threading.Lock()  # guards _history and schedule
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._static: Static | None = None
        self._listeners: set[Listener] = set()  # loop side only
        self._panels: set[Listener] = set()  # of them, those feeding a GPU panel on screen
        self._waiters: list[asyncio.Future] = []  # loop side only
        self.latest: dict | None = None  # loop side: the newest sample
        self.samples_taken = 0
        self.on_publish: Callable[[], None] | None = None  # loop side, after each sample
        # reads the GPUs' PCIe throughput side by side (reading.py); threads start with the first read
        self._pcie = ThreadPoolExecutor(PCIE_READERS, thread_name_prefix="gpuspawner-gpu-pcie")

    # ----------------------------------------------------------- lifecycle --

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the thread; samples are delivered on ``loop`` (default: the running loop).

        Called by the first :meth:`demand` on the loop when not called before.
        """
        if self._thread is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="gpuspawner-gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pcie.shutdown(wait=False)

    # ------------------------------------------------------- client demand --

    @property
    def paused(self) -> bool:
        with self._lock:
            return self.schedule.paused(time.monotonic())

    def _wake_up(self) -> None:
        if self._thread is None and not self._stopping.is_set():
            self.start()
        self._wake.set()

    def demand(self, history: float | None | bool = False) -> None:
        """A snapshot request: keep sampling at full pace for ``idle_pause`` seconds (or wake up).
        With ``history`` (seconds, None: all kept) it is a history reader's: keep sampling utilisation
        as long as the history it read, so that it finds samples when it comes back. Call on the loop."""
        with self._lock:
            if history is False:
                self.schedule.snapshot(time.monotonic())
            else:
                self.schedule.history_read(time.monotonic(), history)
        self._wake_up()

    def subscribe(self, listener: Listener, panel: bool = False) -> None:
        """Call ``listener(sample, encoded)`` on the loop for every new sample until :meth:`unsubscribe`;
        ``panel``: it feeds a GPU panel on screen, which wants everything read every interval."""
        self._listeners.add(listener)
        if panel:
            self._panels.add(listener)
        with self._lock:
            self.schedule.streams, self.schedule.panels = len(self._listeners), len(self._panels)
        self._wake_up()

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.discard(listener)
        self._panels.discard(listener)
        with self._lock:
            self.schedule.streams, self.schedule.panels = len(self._listeners), len(self._panels)
            self.schedule.snapshot(time.monotonic())  # the pace slows idle_pause seconds after the last watcher

    async def fresh(self, max_age: float | None = None, timeout: float = 15.0,
                    history: float | None | bool = False, detail_age: float | None = None) -> dict:
        """The newest sample if it is at most ``max_age`` old and its slower fields (``detail_time``) at
        most ``detail_age`` (default: ``max_age``); else a new one with everything read, at once.
        ``history``: as for :meth:`demand`."""
        max_age = 2 * self.interval if max_age is None else max_age
        detail_age = max_age if detail_age is None else detail_age
        self.demand(history)
        latest = self.latest
        now = time.time()
        if (latest is not None and latest["detail_time"] is not None and now - latest["time"] <= max_age
                and now - latest["detail_time"] <= detail_age):
            return latest
        with self._lock:
            self.schedule.want_full()
        self._wake.set()
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            if self.latest is not None:
                return self.latest
            return {"time": time.time(), "status": "the GPU sampler has not answered yet", "detail":
                    "NVML is slow to answer; try again shortly.", "driver_version": None,
                    "cuda_driver_version": None, "gpus": []}
        finally:
            if future in self._waiters:
                self._waiters.remove(future)

    def history(self, seconds: float | None = None) -> list[dict]:
        """Samples of the last ``seconds`` (all kept ones when None), oldest first."""
        with self._lock:
            samples = list(self._history)
        if seconds is None:
            return samples
        since = time.time() - seconds
        return [s for s in samples if s["time"] >= since]

    # -------------------------------------------------------------- thread --

    def _static_info(self) -> Static:
        static = self._static
        if static is None or time.monotonic() - static.read_at > self.static_refresh:
            static = self._static = read_static(self.visibility, static)
        return static

    def sample_once(self, reads: str = FULL) -> dict:
        """Read one sample now (in the calling thread) and keep it in the history.

        ``reads``: what to read (schedule.py); a CORE reading carries the rest from the last complete one."""
        static = self._static_info()
        if self.attribute is not None:
            sample = read_sample(static, self.attribute, pool=self._pcie, reads=reads, previous=self._complete)
        else:
            sample = read_sample(static, pool=self._pcie, reads=reads, previous=self._complete)
        sample["interval"] = self.interval
        if reads != UTILIZATION:
            self._complete = sample
        with self._lock:
            self._history.append(sample)
        self.samples_taken += 1
        return sample

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            with self._lock:
                reads, wait = self.schedule.next(started)
            if reads is None:
                self._wake.wait(None if wait == float("inf") else wait)
                self._wake.clear()
                continue
            try:
                sample = self.sample_once(reads)
                encoded = dumps(sample)  # once per sample, here, not once per client on the loop
            except Exception:  # a bug here must not kill sampling for good
                log.exception("GPU sampling failed")
                self._stopping.wait(self.interval)
                continue
            # (a CORE reading that found a GPU missing from the last complete sample read everything)
            done = FULL if sample["detail_time"] == sample["time"] else reads
            with self._lock:
                self.schedule.taken(done, started)
            loop = self._loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._publish, sample, encoded)
                except RuntimeError:  # the loop closed meanwhile
                    return

    def _publish(self, sample: dict, encoded: str) -> None:
        """On the loop: deliver a sample to waiting requests and open streams."""
        self.latest = sample
        if sample["detail_time"] is None:  # utilisation only: not what a request waits for
            waiters = []
        else:
            waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(sample)
        for listener in list(self._listeners):
            try:
                listener(sample, encoded)
            except Exception:
                log.exception("a GPU stream listener failed")
        if self.on_publish is not None:
            try:
                self.on_publish()
            except Exception:
                log.exception("the GPU sampler's on_publish hook failed")
