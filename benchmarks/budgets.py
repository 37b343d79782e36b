"""How long the hub takes to look at budgets: one user's standing (each GPU spawn, the form) and everyone's
(``GET /hub/api/gpus/budgets`` for a reader, and the watch of users holding GPUs).

    scripts/bench budgets [ROWS] [USERS]

ROWS allocations (default 20000) of USERS users (default 500) over the last 30 days, in a SQLite
database as the hub keeps them; budgets: 20 GPU-hours a rolling week per user, 500 a calendar month
per group, weights for A100s. Prints the time of one user's look (read and count), of all users' in
one read, and the machine's load average.
"""

from __future__ import annotations

import json
import os
import sys
import time

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from gpuspawner.backends.budgets import BudgetKeeper
from gpuspawner.budgets import BudgetPolicy, BudgetSpec, parse_weights
from gpuspawner.usage import Allocation, migrate


def main(rows: int = 20000, users: int = 500) -> None:
    engine = create_engine("sqlite://")
    now = time.time()
    with engine.begin() as conn:
        migrate(conn)
    db = Session(engine)
    for i in range(rows):
        started = now - 30 * 86400 * (i / rows)
        db.add(Allocation(owner=f"user{i % users}/", user=f"user{i % users}", kind="server",
                          groups=json.dumps([f"group{i % 10}"]), gpu_count=1 + i % 2,
                          model="a100-sxm4-80gb" if i % 3 else "t4", host="h", gpus="[]", started=started,
                          ended=started + 3600 if i % 50 else None))
    db.commit()
    policy = BudgetPolicy(per_user=BudgetSpec(20, "week", rolling=True),
                          per_group={f"group{g}": BudgetSpec(500, "month") for g in range(10)},
                          weights=parse_weights({"a100*": 4}))
    keeper = BudgetKeeper()
    started = time.perf_counter()
    for n in range(20):
        keeper.standing(db, policy, f"user{n}", [f"group{n % 10}"], now)
    one = (time.perf_counter() - started) / 20
    started = time.perf_counter()
    keeper.standings(db, policy, {f"user{n}": [f"group{n % 10}"] for n in range(users)}, now)
    everyone = time.perf_counter() - started
    print(f"budgets: {rows} allocation rows of {users} users over 30 days (SQLite)")
    print(f"  one user's standing (a GPU spawn, the form): {one * 1000:.1f} ms")
    print(f"  all {users} users' standings, one read: {everyone * 1000:.0f} ms")
    print(f"  load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
