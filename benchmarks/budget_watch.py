"""Cost of one round of the budget watcher (gpuspawner.hub.budget_notices), which runs every 5 s in the hub.

A round that reads the budgets reads, through the hub's budget keeper, the standing of every user who
holds GPUs (one query of the usage rows in the longest budget's period, then each user's budgets over
them) and the open rows (what the GPUs held now spend), then decides for each server; a round between
reads (``Readings``: at most every 60 s, or when the holders or a stage change) carries the figures
forward. Figures for a week's budget per user plus one per group, an SQLite database of N usage rows
over three weeks, posts answered at once (the servers' notices are not in the figures). CPU time of this
process (the hub's event loop is busy that long), the least of three: wall time on a shared machine is noise.

    scripts/bench budget_watch
"""

from __future__ import annotations

import asyncio
import json
import random
import time

from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from gpuspawner.backends.budgets import BudgetKeeper
from gpuspawner.budgets import BudgetPolicy, BudgetSpec
from gpuspawner.hub.budget_notices import BudgetNotices, Holder, Readings, Rule, spends_of
from gpuspawner.usage import Allocation, migrate

NOW = time.time()
WEEK = 7 * 86400.0


def database(rows: int, users: int, holders: int) -> Session:
    engine = create_engine("sqlite://")
    with engine.begin() as conn:
        migrate(conn)
    session = Session(engine)
    rng = random.Random(7)
    for n in range(rows):
        started = NOW - rng.uniform(0, 3 * WEEK)
        session.add(Allocation(owner=f"user{n % users}/s{n}", user=f"user{n % users}", kind="server",
                               groups=json.dumps([f"group{n % users % 10}"]), gpu_count=rng.choice((1, 2)),
                               model=rng.choice(("a100-sxm4-80gb", "t4")), started=started,
                               ended=started + rng.uniform(60, 8 * 3600)))
    for n in range(holders):
        session.add(Allocation(owner=f"user{n}/", user=f"user{n}", kind="server", groups=json.dumps([f"group{n % 10}"]),
                               gpu_count=1, model="a100-sxm4-80gb", started=NOW - 600, ended=None))
    session.commit()
    return session


def rounds(session: Session, policy: BudgetPolicy, holders: list[Holder]) -> tuple[float, float]:
    """(seconds of a round that reads the budgets, seconds of one that carries them forward)."""
    keeper = BudgetKeeper()

    def read(users, now):
        groups = {user: [f"group{int(user[4:]) % 10}"] for user in users}
        held = list(session.execute(select(Allocation).where(Allocation.ended.is_(None))).scalars())
        return {s.user: spends_of(s, held, policy.weights, policy.low)
                for s in keeper.standings(session, policy, groups, now)}

    async def post(h, message, level):
        return True

    async def board(h):
        return None

    async def stop(h):
        return None

    readings, notices, rule = Readings(read), BudgetNotices(post, board, stop, lambda: NOW), Rule()
    times = []
    for now in (NOW, NOW + 5):
        start = time.process_time()
        asyncio.run(notices.round(holders, readings.get(holders, now, rule.warn_before), rule))
        times.append(time.process_time() - start)
    return times[0], times[1]


def main() -> None:
    policy = BudgetPolicy(per_user=BudgetSpec(40.0, "week"), per_group={f"group{g}": BudgetSpec(400.0, "week")
                                                                        for g in range(10)},
                          weights=(("a100*", 4.0),), unit="T4-hours")
    print("rows  holders  round reading ms CPU  round carrying ms CPU")
    for rows, holders in ((1_000, 20), (10_000, 50), (50_000, 200)):
        session = database(rows, users=500, holders=holders)
        found = [Holder(f"user{n}/", f"user{n}", "", NOW - 600, url=f"http://127.0.0.1:9/user/user{n}/")
                 for n in range(holders)]
        figures = [rounds(session, policy, found) for _ in range(3)]
        read, carry = min(f[0] for f in figures), min(f[1] for f in figures)
        print(f"{rows:>6} {holders:>8} {read * 1000:>21.1f} {carry * 1000:>22.1f}")
        session.close()


if __name__ == "__main__":
    main()
