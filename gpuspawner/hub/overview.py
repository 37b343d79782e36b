"""The admin GPU overview as plain JSON. Pure: from the hub's facts to a dict.

Used by ``GET /hub/api/gpus`` and rendered by the ``/hub/gpus`` page. A hub keeps one
:class:`GPUEntries` from one build to the next: each GPU's entry and its JSON are written
again only when the GPU, its holder or its live numbers changed (10,000 GPUs: a read took
about 50 ms to build and write them all, now about 5 ms).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..availability import model_availability
from ..gpu import GPU
from ..inputs import dumps
from ..inventory import InventoryReading
from ..ledger import cluster_holdings
from ..owner import Owner
from ..queue import Waiter
from .live import GPUNumbers

#: Seconds after which a live number is reported as stale.
STALE_AFTER = 10.0


@dataclass(frozen=True)
class Holder:
    """A server holding GPUs."""

    owner: str  # "user/server"
    user: str
    server: str  # "" for the default server
    since: float | None  # time.time() when it got the GPUs
    state: str  # "running", "starting", "stopping", "not running" or "out of service" (see outofservice.py)
    url: str | None = None  # the server's public path, when running
    kind: str = "server"  # or "job": a notebook GPU job (server is "job/<id>")
    wait: dict | None = None  # a starting server's wait as its backend words it (gpu-slurm, gpu-kube's Kueue)


def _numbers(n: GPUNumbers | None, now: float) -> dict:
    if n is None:
        return {"utilization_gpu": None, "memory_used": None, "sampled_at": None, "age": None,
                "stale": True, "source": None}
    age = max(0.0, now - n.sampled_at)
    return {"utilization_gpu": n.utilization_gpu, "memory_used": n.memory_used, "sampled_at": n.sampled_at,
            "age": round(age, 1), "stale": age > STALE_AFTER, "source": n.source}


_NOT_SAMPLED = _numbers(None, 0.0)


def _holder(owner: str, holder: Holder | None, problems: Mapping[str, str]) -> dict:
    return {
        "owner": owner,
        "user": holder.user if holder else Owner.parse(owner).user,
        "server": holder.server if holder else Owner.parse(owner).label,
        "since": holder.since if holder else None,
        "state": holder.state if holder else "unknown",
        "url": holder.url if holder else None,
        "kind": holder.kind if holder else "server",
        "problem": problems.get(owner),
    }


class Entries(list):
    """The overview's GPU entries, with their JSON (``json``) written as they were built."""

    json: str = "[]"


_ENCODER = json.JSONEncoder(allow_nan=False)


def _text(entry: dict) -> str:
    try:
        return _ENCODER.encode(entry)
    except ValueError:  # a number that is not finite: dumps writes null
        return dumps(entry)


def _entry(gpu: GPU, holder: dict | None, numbers: dict) -> dict:
    return {
        "uuid": gpu.uuid, "index": gpu.index, "host": gpu.host, "name": gpu.name, "model": gpu.model,
        "memory_total": gpu.memory_total,
        "health": "ok" if gpu.healthy else (gpu.reason or "unhealthy"),
        "holder": holder,
        **numbers,
    }


def _unheld(reading: InventoryReading) -> tuple:
    """A reading's GPUs in the overview's order (by host, then index), each UUID's places in it, and each
    GPU's entry and its JSON, held by nobody and not sampled."""
    order = tuple(sorted(reading.gpus, key=lambda g: (g.host, g.index)))
    at: dict[str, tuple[int, ...]] = {}
    for n, gpu in enumerate(order):
        at[gpu.uuid] = (*at.get(gpu.uuid, ()), n)
    entries = Entries(_entry(gpu, None, _NOT_SAMPLED) for gpu in order)
    texts = [_text(entry) for entry in entries]
    entries.json = "[" + ", ".join(texts) + "]"
    return order, at, entries, texts


class GPUEntries:
    """One hub's GPU entries from its last overview and their JSON, changed where a GPU's holder or live
    numbers changed: what it costs is the GPUs held or sampled, not every GPU.

    Used on the hub's event loop (a new reading's entries are written in a worker thread:
    :meth:`prepare`). The entries are shared by the overviews built from them: read them, never
    change them.
    """

    def __init__(self) -> None:
        self._reading: InventoryReading | None = None
        self._order: tuple[GPU, ...] = ()  # the GPUs as the overview lists them (by host, then index)
        self._at: dict[str, tuple[int, ...]] = {}  # uuid -> its places in that order
        self._shown: dict[str, tuple] = {}  # uuid -> its holder's and live numbers' values (GPUs held or sampled)
        self._entries = Entries()
        self._texts: list[str] = []  # each entry's JSON

    async def prepare(self, reading: InventoryReading) -> None:
        """Write the entries of a new reading's GPUs in a worker thread, not on the event loop (10,000 GPUs:
        0.1 to 0.2 s, which every request would wait for), before an overview is built from it."""
        if reading is not self._reading and (self._reading is None or reading.gpus != self._reading.gpus):
            self._install(reading, await asyncio.to_thread(_unheld, reading))

    def _read(self, reading: InventoryReading) -> None:
        """Every GPU's entry, unheld and not sampled, when the GPUs differ from the last reading's."""
        if reading is self._reading:
            return
        if self._reading is None or reading.gpus != self._reading.gpus:
            self._install(reading, _unheld(reading))
        self._reading = reading

    def _install(self, reading: InventoryReading, unheld: tuple) -> None:
        self._order, self._at, self._entries, self._texts = unheld
        self._shown, self._reading = {}, reading

    def allocated(self, reading: InventoryReading, held: Mapping[str, Any]) -> Counter[str]:
        """Model slug -> how many GPU records of ``reading`` are ``held`` (UUIDs not in it are ignored)."""
        self._read(reading)
        return Counter(self._order[n].model for uuid in held for n in self._at.get(uuid, ()))

    def entries(self, reading: InventoryReading, by_uuid: Mapping[str, str], holders: Mapping[str, dict],
                live: Mapping[str, GPUNumbers], now: float) -> Entries:
        """Every GPU's entry, in the overview's order: ``by_uuid`` says who holds it, ``holders`` each
        holder's fields (by owner), ``live`` its live numbers."""
        self._read(reading)
        shown: dict[str, tuple] = {}
        numbers: dict[str, dict] = {}
        for uuid in by_uuid.keys() | live.keys():
            if uuid in self._at:
                sampled = live.get(uuid)
                if sampled is not None:
                    numbers[uuid] = _numbers(sampled, now)
                holder = holders[by_uuid[uuid]] if uuid in by_uuid else None
                shown[uuid] = (holder and tuple(holder.values()), sampled and tuple(numbers[uuid].values()))
        changed = [uuid for uuid in shown.keys() | self._shown.keys() if shown.get(uuid) != self._shown.get(uuid)]
        if changed:
            entries, texts = Entries(self._entries), list(self._texts)
            for uuid in changed:
                holder = holders[by_uuid[uuid]] if uuid in by_uuid else None
                for n in self._at[uuid]:
                    entries[n] = _entry(self._order[n], holder, numbers.get(uuid, _NOT_SAMPLED))
                    texts[n] = _text(entries[n])
            entries.json = "[" + ", ".join(texts) + "]"
            self._entries, self._texts = entries, texts
        self._shown = shown
        return self._entries


def to_json(data: dict) -> str:
    """An overview as JSON text (:func:`~gpuspawner.inputs.dumps`), the GPU entries' JSON as they were built."""
    gpus = data.get("gpus")
    if not isinstance(gpus, Entries):
        return dumps(data)
    rest = dumps({key: value for key, value in data.items() if key != "gpus"})
    return "".join((rest[:-1], ", " if len(rest) > 2 else "", '"gpus": ', gpus.json, "}"))  # (one copy of 3 MB)


def build(
    reading: InventoryReading,
    allocations: Mapping[str, tuple[str, ...]],
    holders: Mapping[str, Holder],
    live: Mapping[str, GPUNumbers],
    problems: Mapping[str, str],
    waiters: list[Waiter],
    now: float,
    kept: GPUEntries | None = None,
    why: Callable[[Waiter, int], str] | None = None,
) -> dict:
    """Every GPU with its holder and live numbers; free/total per model; the queue.

    Per model: ``free``, ``total`` and ``unavailable`` as :mod:`gpuspawner.availability`
    defines them (total: GPUs in service), ``allocated``: GPUs held, whatever their health.

    Servers whose GPUs the cluster placed (gpu-kube: counted in the ledger as
    cluster tokens, not inventory GPUs) are listed under ``cluster``, with their
    count per cluster resource; they never appear as GPUs of the inventory.

    ``kept``: the hub's :class:`GPUEntries` (a new one without), whose entries are reused where
    nothing they show changed. ``why``: a waiting request's place and its rule in words
    (:meth:`gpuspawner.queue.GPUQueue.why`), each queue entry's ``why``.
    """
    kept = kept if kept is not None else GPUEntries()
    by_uuid = {u: owner for owner, uuids in allocations.items() for u in uuids}
    held = {owner: _holder(owner, holders.get(owner), problems) for owner in allocations}
    gpus = kept.entries(reading, by_uuid, held, live, now)
    allocated = kept.allocated(reading, by_uuid)
    cluster = []
    for owner, keys in sorted(allocations.items()):
        resources = cluster_holdings(keys)
        if resources:
            holder = holders.get(owner)
            cluster.append({**_holder(owner, holder, problems), **((holder and holder.wait) or {}),
                            "gpus": sum(resources.values()), "resources": resources})
    models = [
        {"model": m.slug, "name": m.name, "free": m.free, "total": m.total, "unavailable": m.unavailable,
         "allocated": allocated[m.slug]}
        for m in model_availability(reading.gpus, set(by_uuid))
    ]
    queue = [
        {"position": n, "user": w.user, "server": Owner.parse(w.owner).label, "gpus": w.count,
         "models": list(w.models) or ["any"], "profile": w.profile, "waiting_seconds": round(now - w.joined, 1),
         "estimate": w.estimate.as_json(now) if w.estimate is not None else None,
         "why": why(w, n) if why is not None else None}
        for n, w in enumerate(waiters, 1)
    ]
    return {
        "time": now,
        "simulated": reading.simulated,
        "problems": list(reading.problems),
        "models": models,
        "gpus": gpus,
        "cluster": cluster,
        "queue": queue,
        "stale_after": STALE_AFTER,
    }


def own_view(data: dict, user: str) -> dict:
    """What ``user`` (no reader of everyone's GPUs) sees of an overview: free/total per model, and only
    the GPUs, cluster holdings and queue places of their own servers and jobs."""
    def mine(holder: dict | None) -> bool:
        return holder is not None and holder["user"] == user

    return {**data, "gpus": [g for g in data["gpus"] if mine(g["holder"])],
            "cluster": [h for h in data["cluster"] if mine(h)],
            "queue": [q for q in data["queue"] if q["user"] == user],
            "isolation": None, "viewer": user,
            "outages": {u: o for u, o in data.get("outages", {}).items()
                        if any(g["uuid"] == u and mine(g["holder"]) for g in data["gpus"])}}


def held_by_owner(data: dict) -> list[dict]:
    """One row per server or job holding GPUs (by user, then server): its holder's fields, the GPU
    count and ``held``, the count per model in words (``"2 x NVIDIA A100-SXM4-80GB"``)."""
    rows: dict[str, dict] = {}
    for gpu in data["gpus"]:
        if gpu["holder"]:
            row = rows.setdefault(gpu["holder"]["owner"], {**gpu["holder"], "gpus": 0, "per_model": {}})
            row["gpus"] += 1
            row["per_model"][gpu["name"]] = row["per_model"].get(gpu["name"], 0) + 1
    for holding in data["cluster"]:
        row = rows.setdefault(holding["owner"], {**holding, "gpus": 0, "per_model": {}})
        row["gpus"] += holding["gpus"]
        for resource, count in holding["resources"].items():
            row["per_model"][resource] = row["per_model"].get(resource, 0) + count
    out = []
    for row in sorted(rows.values(), key=lambda r: (r["user"], r["server"])):
        per_model = row.pop("per_model")
        row.pop("resources", None)
        out.append({**row, "held": ", ".join(f"{n} x {name}" for name, n in sorted(per_model.items()))})
    return out
