"""gpu-kube's waiting in words: Kueue's queue watched, pod events explained: :class:`KubeWaitingMixin`.

A parent of :class:`~gpuspawner.backends.kube.spawner.GPUKubeSpawner`. Where a profile's
pods go to a Kueue queue, KubeSpawner's start is raced against a watch of the pod and its
Workload: the queue position goes into the progress ("waiting in queue team-a: position 3
(Kueue)"), and a Workload Kueue rejects or evicts fails the spawn with a sentence (409).
The progress is gpuspawner's own steps, then KubeSpawner's pod events in plain words
(:mod:`gpuspawner.backends.kube.events`).
"""

from __future__ import annotations

import asyncio
import contextlib

from kubespawner import KubeSpawner
from traitlets.config import Configurable

from ...profiles import Profile
from ..errors import user_error
from .api import read_pod, why_failed
from .events import EventContext, explain_event
from .kueue import (
    KueueReader,
    events_problem,
    gated,
    pod_gone,
    pod_problem,
    queue_position,
    waiting_message,
    workload_of,
    workload_problem,
)


class KubeWaitingMixin(Configurable):
    """Kueue's queue and the pod's events in the spawn's progress (see the module's words)."""

    _kueue_queue: str | None = None
    _kueue_messages: list[str] = []  # replaced per spawn, never appended to in place
    _kueue_position_error: str | None = None
    _kueue_pod_uid: str | None = None
    _kueue_stale_uid: str | None = None
    _kueue_workload: str | None = None
    #: while Kueue's gate holds the pod: its queue and place (``kueue_queue``, ``kueue_position``, None when
    #: the visibility API did not say), listed in ``/hub/api/gpus``; None otherwise
    gpu_wait: dict | None = None

    def kueue_queue(self, profile: Profile) -> str | None:
        """The Kueue LocalQueue of a profile's pods: its own ``kueue``, else ``kueue_queue_name``."""
        return profile.kueue or self.kueue_queue_name

    def kueue_reader(self) -> KueueReader:
        return KueueReader(self.api.api_client, timeout=self.k8s_api_request_timeout)

    async def _kueue_verdict(self, reader: KueueReader, queue: str, last: str | None) -> str | None:
        """One look at the queued pod: a new waiting message is recorded; an eviction or rejection is returned."""
        pod = await read_pod(self.api, self.namespace, self.pod_name, self.k8s_api_request_timeout)
        uid = ((pod or {}).get("metadata") or {}).get("uid")
        if uid and uid == self._kueue_stale_uid:  # a pod left from before this spawn, which KubeSpawner replaces
            return None
        seen, self._kueue_pod_uid = self._kueue_pod_uid, uid or self._kueue_pod_uid
        if seen and uid != seen:  # this spawn's pod was deleted between two looks (Kueue evicts by deleting)
            return await self._kueue_gone(reader, queue, seen)
        if pod is None:  # not created yet
            return None
        workload = workload_of(await reader.workloads(self.namespace, uid), self.pod_name)
        self._kueue_workload = ((workload or {}).get("metadata") or {}).get("name") or self._kueue_workload
        # an evicted pod's Workload goes with the pod Kueue deletes: the pod's own condition says it too
        problem = (workload_problem(workload, queue) if workload else None) or pod_problem(pod, queue)
        if problem:
            return problem
        if not gated(pod):
            self.gpu_wait = None
        else:
            try:
                position = queue_position(await reader.pending_workloads(self.namespace, queue), self.pod_name)
            except Exception as e:  # still waiting in the queue, place unknown
                if why_failed(e) != self._kueue_position_error:  # once, not every poll
                    self._kueue_position_error = why_failed(e)
                    self.log.warning("%s: Kueue's queue positions not read: %s", self._log_name, why_failed(e))
                position = None
            self.gpu_wait = {"kueue_queue": queue, "kueue_position": position}  # /hub/api/gpus lists it
            message = waiting_message(queue, position)
            if message != last:
                self._kueue_messages = [*self._kueue_messages, message]
        return None

    async def _kueue_gone(self, reader: KueueReader, queue: str, uid: str) -> str:
        """Why this spawn's pod is gone: its Workload if still there, else the events Kueue left on it."""
        workload = workload_of(await reader.workloads(self.namespace, uid), self.pod_name)
        problem = workload_problem(workload, queue) if workload else None
        if not problem and self._kueue_workload:
            problem = events_problem(await reader.workload_events(self.namespace, self._kueue_workload), queue)
        return problem or pod_gone(queue)

    async def _watch_kueue(self, queue: str) -> str:
        """Until cancelled: record the pod's place in the queue; return the sentence once Kueue evicts or rejects."""
        reader = self.kueue_reader()
        while True:
            last = self._kueue_messages[-1] if self._kueue_messages else None
            try:
                problem = await self._kueue_verdict(reader, queue, last)
            except Exception as e:  # the pod still starts; Kueue's state is only shown
                self.log.warning("%s: Kueue state not read: %s", self._log_name, why_failed(e))
                problem = None
            if problem:
                return problem
            await asyncio.sleep(self.kueue_poll_interval)

    async def _start(self):
        """KubeSpawner's start; with Kueue, watched so an eviction or rejection fails it with a sentence."""
        try:
            return await self._start_watched()
        finally:
            self._options_loaded_for_start = False  # loaded once, for this start only
            self.gpu_wait = None

    async def _start_watched(self):
        """KubeSpawner's ``_start``, raced against the Kueue watch where the pod goes to a Kueue queue."""
        queue = self._kueue_queue
        if not queue:
            return await super()._start()
        self._kueue_pod_uid = self._kueue_workload = None  # this spawn's pod and Workload, once the watch saw them
        stale = await read_pod(self.api, self.namespace, self.pod_name, self.k8s_api_request_timeout)
        self._kueue_stale_uid = ((stale or {}).get("metadata") or {}).get("uid")
        start = asyncio.ensure_future(super()._start())
        watch = asyncio.ensure_future(self._watch_kueue(queue))
        try:
            await asyncio.wait({start, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (start, watch):
                if not task.done():
                    task.cancel()
        if start.done() and not start.cancelled():
            return start.result()
        problem = watch.result()
        self.gpu_event(f"Refused: {problem}", 100)
        raise user_error(409, problem)

    # ------------------------------------------------------------ progress

    #: what this start asked for, in the form's words: the pod's events are explained in them
    _event_context: EventContext | None = None

    async def progress(self):
        """gpuspawner's own steps, then KubeSpawner's pod events in plain words, with Kueue's queue position."""
        for event in list(getattr(self, "_gpu_events", [])):
            yield event
        context = self._event_context or EventContext("GPU", 0)
        # KubeSpawner's, named: the mixin's progress (next in the MRO) is gpuspawner's steps, already sent above
        events = KubeSpawner.progress(self).__aiter__()
        sent = 0
        following = asyncio.ensure_future(events.__anext__())
        try:
            while True:
                await asyncio.wait({following}, timeout=self.kueue_poll_interval)  # Kueue's news between events
                for message in self._kueue_messages[sent:]:
                    sent += 1
                    yield {"progress": 40, "message": message}
                if not following.done():
                    continue
                try:
                    event = following.result()
                except StopAsyncIteration:
                    break
                raw = event.get("raw_event")
                plain = explain_event(raw, context) if isinstance(raw, dict) else None
                if plain:
                    event = {**event, "message": plain}
                yield event
                following = asyncio.ensure_future(events.__anext__())
        finally:
            if not following.done():
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await following
            await events.aclose()

