"""One GPU sampler per server: a background thread, a ring buffer, pushes to clients.

NVML is read only in the sampler's thread (``reading.py``), never on the event
loop and never because of a particular client: every client shares the same
samples. The thread hands each sample to the event loop
(``call_soon_threadsafe``), where listeners (the SSE streams) get it.

Sampling pauses when nobody has asked for a while: no stream open and no
request for ``idle_pause`` seconds. A request (:meth:`Sampler.fresh`) wakes it.
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
from .visibility import Visibility

log = logging.getLogger(__name__)

Listener = Callable[[dict, str], None]  # (sample, the sample as JSON text)

#: Threads reading PCIe throughput side by side (two 20 ms NVML calls per GPU): 8 GPUs' at once.
PCIE_READERS = 16


class Sampler:
    """Samples this server's GPUs every ``interval`` seconds while someone is watching."""

    def __init__(
        self,
        visibility: Visibility,
        interval: float = 1.0,
        history_seconds: float = 600.0,
        idle_pause: float = 30.0,
        static_refresh: float = 60.0,
        attribute: Attribution | None = None,
    ) -> None:
        self.visibility = visibility
        self.interval = interval
        self.idle_pause = idle_pause
        self.static_refresh = static_refresh
        self.attribute = attribute
        self._history: deque[dict] = deque(maxlen=max(1, round(history_seconds / interval)))
        self._lock = threading.Lock()  # guards _history
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._static: Static | None = None
        self._last_demand = time.monotonic()
        self._streams = 0  # open streams; changed on the loop, read by the thread
        self._listeners: set[Listener] = set()  # loop side only
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
        return self._streams == 0 and time.monotonic() - self._last_demand > self.idle_pause

    def demand(self) -> None:
        """Someone wants samples: keep sampling (or wake up). Call on the loop."""
        self._last_demand = time.monotonic()
        if self._thread is None and not self._stopping.is_set():
            self.start()
        self._wake.set()

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(sample, encoded)`` on the loop for every new sample until :meth:`unsubscribe`."""
        self._listeners.add(listener)
        self._streams = len(self._listeners)
        self.demand()

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.discard(listener)
        self._streams = len(self._listeners)
        self._last_demand = time.monotonic()

    async def fresh(self, max_age: float | None = None, timeout: float = 15.0) -> dict:
        """The newest sample, waiting for a new one if the newest is older than ``max_age``."""
        max_age = 2 * self.interval if max_age is None else max_age
        self.demand()
        latest = self.latest
        if latest is not None and time.time() - latest["time"] <= max_age:
            return latest
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

    def sample_once(self) -> dict:
        """Read one sample now (in the calling thread) and keep it in the history."""
        static = self._static_info()
        if self.attribute is not None:
            sample = read_sample(static, self.attribute, pool=self._pcie)
        else:
            sample = read_sample(static, pool=self._pcie)
        sample["interval"] = self.interval
        with self._lock:
            self._history.append(sample)
        self.samples_taken += 1
        return sample

    def _run(self) -> None:
        while not self._stopping.is_set():
            if self.paused:
                self._wake.wait()
                self._wake.clear()
                continue
            started = time.monotonic()
            try:
                sample = self.sample_once()
                encoded = dumps(sample)  # once per sample, here, not once per client on the loop
            except Exception:  # a bug here must not kill sampling for good
                log.exception("GPU sampling failed")
                self._stopping.wait(self.interval)
                continue
            loop = self._loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._publish, sample, encoded)
                except RuntimeError:  # the loop closed meanwhile
                    return
            self._wake.clear()
            self._stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def _publish(self, sample: dict, encoded: str) -> None:
        """On the loop: deliver a sample to waiting requests and open streams."""
        self.latest = sample
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
