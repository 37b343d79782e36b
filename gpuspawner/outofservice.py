"""GPUs out of service: held by the hub because what last held them is not over.

When a stopped server (or an ended job) leaves processes behind that the hub
cannot end (a process stuck in the kernel, e.g. in a GPU driver call, dies only
when it comes back), its GPUs must not go to anyone else: those processes can
still use them. The hub moves them, in one ledger step, to a holder of their
own, ``<server or job>/out-of-service-<start>``, with a sentence saying why
(the admin overview shows both), and retries every few seconds; once the
retry finds the processes gone, the GPUs are given back and the queue woken.

One :class:`OutOfService` per hub, on its :class:`~gpuspawner.state.HubState`.
Nothing here knows about processes or JupyterHub: the backend hands in the
retry, which says why the GPUs are still held, or ``None`` once they are free.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from .ledger import Ledger

log = logging.getLogger("gpuspawner.outofservice")

#: ``await retry()``: None once the GPUs may go back, else a sentence saying why they may not
Retry = Callable[[], Awaitable[str | None]]

__all__ = ["OutOfService", "Retry", "Withheld", "withheld_owner"]


def withheld_owner(was: str, start: str) -> str:
    """The ledger owner of GPUs ``was`` (``user/server`` or ``user/job/<id>``) left out of service."""
    return f"{was}/out-of-service-{start[:12]}"


@dataclass(frozen=True)
class Withheld:
    """GPUs out of service: whose they were, why they are held."""

    owner: str  # the ledger owner holding them now (withheld_owner)
    was: str  # the server or job that held them: "user/server-name" or "user/job/<id>"
    start: str  # the start that left something behind
    uuids: tuple[str, ...]
    reason: str  # a sentence for the admin
    since: float  # time.time() when they went out of service


class OutOfService:
    """The GPUs one hub holds out of service, and the retries that give them back."""

    def __init__(self, ledger: Ledger, wake: Callable[[], None] = lambda: None) -> None:
        self._ledger = ledger
        self._wake = wake  # told when GPUs come back (the queue)
        self._held: dict[str, Withheld] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._back: dict[str, asyncio.Future] = {}

    def withhold(self, was: str, start: str, reason: str, retry: Retry, interval: float,
                 holder: str | None = None) -> Withheld:
        """Move what ``holder`` (default: ``was``) holds out of service and retry every ``interval`` s.

        Also where it holds no GPU (a CPU-only server): what it left behind is retried all the same.
        """
        owner = withheld_owner(was, start)
        if owner in self._held:  # a second report of the same start: it still holds them
            return self.update(owner, reason)
        uuids = self._ledger.transfer(holder or was, owner)
        entry = self._held[owner] = Withheld(owner, was, start, uuids, reason, time.time())
        log.error("GPUs %s are out of service: %s", ", ".join(uuids) or "(none)", reason)
        self._back[owner] = asyncio.get_running_loop().create_future()
        self._tasks[owner] = asyncio.ensure_future(self._retry(owner, retry, interval))
        return entry

    def update(self, owner: str, reason: str) -> Withheld:
        entry = self._held[owner]
        if entry.reason != reason:
            entry = self._held[owner] = replace(entry, reason=reason)
        return entry

    def get(self, owner: str) -> Withheld | None:
        """The out-of-service entry whose ledger owner is ``owner``."""
        return self._held.get(owner)

    def of(self, was: str) -> list[Withheld]:
        """What server or job ``was`` left out of service."""
        return [w for w in self._held.values() if w.was == was]

    def entries(self) -> list[Withheld]:
        return sorted(self._held.values(), key=lambda w: w.since)

    async def given_back(self, owner: str, timeout: float | None = None) -> bool:
        """Wait until ``owner``'s GPUs are back in service (True), or ``timeout`` seconds (False)."""
        back = self._back.get(owner)
        if back is None:
            return owner not in self._held
        try:
            await asyncio.wait_for(asyncio.shield(back), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def give_back(self, owner: str) -> tuple[str, ...]:
        """Back in service: release ``owner``'s GPUs and wake the queue."""
        entry = self._held.pop(owner, None)
        task = self._tasks.pop(owner, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        freed = self._ledger.release(owner)
        back = self._back.pop(owner, None)
        if back is not None and not back.done():
            back.set_result(freed)
        if entry is not None:
            log.info("GPUs %s are back in service: what %s left behind is gone", ", ".join(freed) or "(none)",
                     entry.was)
        if freed:
            self._wake()
        return freed

    async def _retry(self, owner: str, retry: Retry, interval: float) -> None:
        while owner in self._held:
            await asyncio.sleep(interval)
            try:
                reason = await retry()
            except Exception:
                log.exception("retrying the out-of-service GPUs of %s failed", owner)
                continue
            if reason is None:
                self.give_back(owner)
                return
            self.update(owner, reason)

    def close(self) -> None:
        """Stop retrying (the GPUs stay held in this hub; a restarted hub finds their processes again)."""
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
