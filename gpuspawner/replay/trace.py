"""The replay's sessions: a synthetic trace of days (:class:`TraceParams`, :func:`synthetic_trace`) or
what a hub recorded (:func:`trace_from_usage`), and the GPUs they run on (:func:`gpus`).
See :mod:`gpuspawner.replay` for what the parameters mean."""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ..gpu import GPU
from ..owner import Owner

DAY = 24 * 3600.0
MODELS = {"a100": "NVIDIA A100-SXM4-80GB", "t4": "Tesla T4"}


def gpus(spec: str, per_host: int = 4) -> tuple[GPU, ...]:
    """GPUs from ``"a100=8,t4=8"``: hosts of ``per_host`` GPUs each (the last of a model may have fewer),
    one model per host."""
    if per_host < 1:
        raise ValueError(f"GPUs per host must be 1 or more, not {per_host}")
    out: list[GPU] = []
    for part in spec.split(","):
        model, _, count = part.strip().partition("=")
        if model not in MODELS or not count.isdigit():
            raise ValueError(f"GPU spec {part!r}: use MODEL=COUNT with MODEL one of {', '.join(MODELS)}")
        for i in range(int(count)):
            host = f"{model}-node{i // per_host + 1}"
            out.append(GPU(uuid=f"GPU-{model}-{i:03d}", name=MODELS[model], index=i % per_host, host=host))
    return tuple(out)


#: ``--office-hours``: nearly every session between 8 and 18 h
OFFICE_HOURS = (0.2, 0.2, 0.2, 0.2, 0.2, 0.3, 0.5, 1.0, 1.8, 2.0, 2.0, 1.6,
                1.2, 1.8, 2.0, 1.8, 1.5, 1.0, 0.7, 0.5, 0.4, 0.3, 0.3, 0.2)


@dataclass(frozen=True)
class TraceParams:
    """The synthetic trace's parameters (see the module docstring)."""

    load: float = 0.70
    hours: float = 24.0
    users: int = 40
    hourly_weights: tuple[float, ...] = (0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 1.0, 1.3, 1.4, 1.4, 1.3,
                                         1.1, 1.3, 1.4, 1.3, 1.2, 1.0, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6)
    session_hours: float = 2.5
    active_minutes: float = 40.0
    pause_minutes: float = 3.0
    cpu_share: float = 0.3
    break_share: float = 0.3
    break_minutes: tuple[float, float] = (30.0, 90.0)
    abandon_share: float = 0.3
    tab_open_share: float = 0.5
    batch_share: float = 0.15
    batch_hours: float = 1.5
    count_weights: tuple[tuple[int, float], ...] = ((1, 0.7), (2, 0.2), (4, 0.1))
    model_weights: tuple[tuple[str, float], ...] = (("any", 0.5), ("a100", 0.3), ("t4", 0.2))
    seed: int = 1
    heavy_users: float = 0.0  # share of the users who are heavy (0: every user alike, the documented day)
    heavy_demand: float = 4.0  # how many times as many sessions a heavy user starts as another


@dataclass
class Session:
    """One request for GPUs and what its user then does with them."""

    id: int
    user: str
    arrive: float
    count: int
    models: tuple[str, ...]
    spans: list[tuple[str, float]]  # ("active" | "cpu" | "away", seconds), in order
    stops: bool = True  # False: the user walks away at the end and leaves it idle
    tab_open: bool = False  # an abandoned server whose browser tab stays open
    job: bool = False

    @property
    def owner(self) -> str:
        return str(Owner.of_job(self.user, str(self.id)) if self.job else Owner.of_server(self.user, f"s{self.id}"))

    @property
    def planned(self) -> float:
        return sum(seconds for _kind, seconds in self.spans)


def _pick(rng: random.Random, weighted: Iterable[tuple]) -> object:
    items = list(weighted)
    return rng.choices([v for v, _w in items], weights=[w for _v, w in items])[0]


def _user(rng: random.Random, params: TraceParams) -> int:
    """A session's user: any alike, or (``heavy_users`` > 0) the first ``heavy_users`` x ``users`` users
    ``heavy_demand`` times as likely as each other."""
    if params.heavy_users <= 0:
        return rng.randrange(params.users)
    heavy = max(1, round(params.heavy_users * params.users))
    weights = [params.heavy_demand if u < heavy else 1.0 for u in range(params.users)]
    return rng.choices(range(params.users), weights=weights)[0]


def synthetic_trace(params: TraceParams, capacity: int) -> list[Session]:
    """Sessions until their planned GPU-hours reach ``load`` x ``capacity`` x ``hours``."""
    rng = random.Random(params.seed)
    hours = list(range(len(params.hourly_weights)))
    target = params.load * capacity * params.hours * 3600
    offered, sessions = 0.0, []
    for i in itertools.count():
        if offered >= target:
            break
        hour = rng.choices(hours, weights=params.hourly_weights)[0]
        arrive = (hour + rng.random()) * 3600 * params.hours / 24
        count = int(_pick(rng, params.count_weights))
        model = str(_pick(rng, params.model_weights))
        user = f"user{_user(rng, params):02d}"
        if rng.random() < params.batch_share:
            length = rng.expovariate(1 / (params.batch_hours * 3600))
            session = Session(i, user, arrive, count, (model,), [("active", length)], job=True)
        else:
            sigma = 0.5
            length = rng.lognormvariate(math.log(params.session_hours * 3600) - sigma ** 2 / 2, sigma)
            spans: list[tuple[str, float]] = []
            breaks = 1 if rng.random() < params.break_share else 0
            total = 0.0
            while total < length:
                active = min(rng.expovariate(1 / (params.active_minutes * 60)), length - total)
                spans.append(("active", active))
                total += active
                if total >= length:
                    break
                if breaks and rng.random() < 0.5:
                    pause = ("away", rng.uniform(*params.break_minutes) * 60)
                    breaks = 0
                else:
                    kind = "cpu" if rng.random() < params.cpu_share else "away"
                    pause = (kind, rng.expovariate(1 / (params.pause_minutes * 60)))
                spans.append(pause)
                total += pause[1]
            stops = rng.random() >= params.abandon_share
            session = Session(i, user, arrive, count, (model,), spans, stops=stops,
                              tab_open=not stops and rng.random() < params.tab_open_share)
        offered += session.count * session.planned
        sessions.append(session)
    return sorted(sessions, key=lambda s: (s.arrive, s.id))


def trace_from_usage(rows: list[dict]) -> list[Session]:
    """Sessions from ``GET /hub/api/gpus/usage?by=allocation`` rows (JSON, or CSV read as dicts).

    Each allocation becomes one session starting when it started (relative to
    the first one's midnight, UTC): busy time first, then its idle time as a
    pause; unsampled time counts as busy. A culled allocation was left idle by
    its user (not stopped); the others were stopped.
    """
    sessions = []
    parsed = [(datetime.fromisoformat(r["started"].replace("Z", "+00:00")).timestamp(), r) for r in rows]
    if not parsed:
        return []
    first = min(t for t, _r in parsed)
    midnight = first - first % DAY
    for i, (started, row) in enumerate(sorted(parsed, key=lambda p: p[0])):
        count = int(row["gpu_count"]) or 1
        held, busy, idle = (float(row[k]) * 3600 / count for k in ("gpu_hours", "busy_gpu_hours", "idle_gpu_hours"))
        spans = [("active", max(held - idle, 0.0))] + ([("away", idle)] if idle > 0 else [])
        sessions.append(Session(i, str(row["user"]), started - midnight, count, (str(row["model"]) or "any",),
                                spans, stops=row.get("end_reason") != "culled", job=row.get("kind") == "job"))
    return sessions


def offered_load(sessions: list[Session], capacity: int, hours: float) -> float:
    return sum(s.count * s.planned for s in sessions) / (capacity * hours * 3600)


def load_history(path: str) -> list[Session]:
    with open(path, newline="") as f:
        if path.endswith(".csv"):
            return trace_from_usage(list(csv.DictReader(f)))
        return trace_from_usage(json.load(f)["rows"])
