"""The admin GPU overview as plain JSON. Pure: from the hub's facts to a dict.

Used by ``GET /hub/api/gpus`` and rendered by the ``/hub/gpus`` page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..availability import model_availability
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


def _numbers(n: GPUNumbers | None, now: float) -> dict:
    if n is None:
        return {"utilization_gpu": None, "memory_used": None, "sampled_at": None, "age": None,
                "stale": True, "source": None}
    age = max(0.0, now - n.sampled_at)
    return {"utilization_gpu": n.utilization_gpu, "memory_used": n.memory_used, "sampled_at": n.sampled_at,
            "age": round(age, 1), "stale": age > STALE_AFTER, "source": n.source}


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


def build(
    reading: InventoryReading,
    allocations: Mapping[str, tuple[str, ...]],
    holders: Mapping[str, Holder],
    live: Mapping[str, GPUNumbers],
    problems: Mapping[str, str],
    waiters: list[Waiter],
    now: float,
) -> dict:
    """Every GPU with its holder and live numbers; free/total per model; the queue.

    Per model: ``free``, ``total`` and ``unavailable`` as :mod:`gpuspawner.availability`
    defines them (total: GPUs in service), ``allocated``: GPUs held, whatever their health.

    Servers whose GPUs the cluster placed (gpu-kube: counted in the ledger as
    cluster tokens, not inventory GPUs) are listed under ``cluster``, with their
    count per cluster resource; they never appear as GPUs of the inventory.
    """
    by_uuid = {u: owner for owner, uuids in allocations.items() for u in uuids}
    gpus = []
    for gpu in sorted(reading.gpus, key=lambda g: (g.host, g.index)):
        owner = by_uuid.get(gpu.uuid)
        entry = {
            "uuid": gpu.uuid, "index": gpu.index, "host": gpu.host, "name": gpu.name, "model": gpu.model,
            "memory_total": gpu.memory_total,
            "health": "ok" if gpu.healthy else (gpu.reason or "unhealthy"),
            "holder": None,
            **_numbers(live.get(gpu.uuid), now),
        }
        if owner:
            entry["holder"] = _holder(owner, holders.get(owner), problems)
        gpus.append(entry)
    cluster = []
    for owner, keys in sorted(allocations.items()):
        resources = cluster_holdings(keys)
        if resources:
            cluster.append({**_holder(owner, holders.get(owner), problems),
                            "gpus": sum(resources.values()), "resources": resources})
    models = [
        {"model": m.slug, "name": m.name, "free": m.free, "total": m.total, "unavailable": m.unavailable,
         "allocated": sum(1 for g in reading.gpus if g.model == m.slug and g.uuid in by_uuid)}
        for m in model_availability(reading.gpus, set(by_uuid))
    ]
    queue = [
        {"position": n, "user": w.user, "server": Owner.parse(w.owner).label, "gpus": w.count,
         "models": list(w.models) or ["any"], "profile": w.profile, "waiting_seconds": round(now - w.joined, 1),
         "estimate": w.estimate.as_json(now) if w.estimate is not None else None}
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
            "isolation": None, "viewer": user}


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
