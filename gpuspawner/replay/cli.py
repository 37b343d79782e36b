"""``python -m gpuspawner.replay``: the command line (every trace parameter is an option)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace

from ..estimate import HIGH, LOW
from .estimates import COLUMNS as ESTIMATE_COLUMNS, Figures, fit, measure
from .report import chart, table
from .simulation import default_policies, replay
from .tail import describe, tail
from .trace import OFFICE_HOURS, TraceParams, gpus, load_history, offered_load, synthetic_trace


def parse_args(argv: list[str]) -> argparse.Namespace:
    defaults = TraceParams()
    summary = (sys.modules[__package__].__doc__ or "").split("\n\n")[0]  # the package's first paragraph
    p = argparse.ArgumentParser(prog="python -m gpuspawner.replay", description=summary)
    p.add_argument("--gpus", default="a100=8,t4=8", help="the GPUs: MODEL=COUNT,... (a100, t4)")
    p.add_argument("--host-gpus", type=int, default=4,
                   help="GPUs per host (default 4): a request's GPUs are on one host, so fewer, larger hosts "
                        "show how much of the wait comes from free GPUs split across hosts")
    p.add_argument("--history", help="replay GET /hub/api/gpus/usage?by=allocation output (.json or .csv) "
                                     "instead of a synthetic trace")
    for name in ("load", "hours", "session_hours", "active_minutes", "pause_minutes", "cpu_share",
                 "break_share", "abandon_share", "tab_open_share", "batch_share", "batch_hours", "heavy_users",
                 "heavy_demand"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name),
                       help=f"trace parameter (default {getattr(defaults, name)})")
    p.add_argument("--users", type=int, default=defaults.users, help=f"users (default {defaults.users})")
    p.add_argument("--seed", type=int, default=defaults.seed, help="random seed of the synthetic trace's first day")
    p.add_argument("--days", type=int, default=5,
                   help="synthetic days replayed (seeds SEED, SEED+1, ...); the figures pool them (default 5)")
    p.add_argument("--office-hours", action="store_true",
                   help="arrivals peaking at twice the day's mean from 9 to 17 h (default: 1.4 times)")
    p.add_argument("--timeouts", default="10,15,20,30,60,120", help="culler idle timeouts to sweep, minutes")
    p.add_argument("--chart", help="write a PNG of busy/idle/free GPUs over the day (needs matplotlib)")
    p.add_argument("--estimates", action="store_true",
                   help="measure the wait estimator instead: estimate at enqueue vs real start, per load")
    p.add_argument("--estimate-loads", default="0.85,0.7",
                   help="with --estimates: the trace's --load values to measure at (default 0.85,0.7: the "
                        "documented days, offered load 85 %% and 71 %%)")
    p.add_argument("--backfill", default="off", choices=("off", "first-fit", "nearest-host"),
                   help="with --estimates: the queue's backfill rule (gpu_queue_backfill) the hub runs and the "
                        "estimates follow (default off, the hub's default)")
    p.add_argument("--fit-seed", type=int, default=1001,
                   help="with --estimates or --choices: the first seed of the days whose history the estimator uses, "
                        "held out from the days measured (default 1001)")
    p.add_argument("--tail", action="store_true",
                   help="also say who waited longest with the runnable hub's settings, and why: what the GPUs "
                        "they could use were doing while they waited (busy, held idle, free but kept for a "
                        "request ahead, free but too few on one host, between tries)")
    p.add_argument("--bookings", action="store_true",
                   help="measure a booking load instead (policy gpuspawner): share of bookings honoured at their "
                        "start, everyone else's waits (see gpuspawner/replay/bookings.py)")
    p.add_argument("--choices", action="store_true",
                   help="measure what users do with a long wait estimate instead: queue, take another model, "
                        "come back at the estimate, or book a window from it (see gpuspawner/replay/choices.py), "
                        "beside the same policies as is")
    p.add_argument("--patience", type=float, default=20.0,
                   help="with --choices: the longest estimated wait, minutes, a user queues for as asked (default 20)")
    p.add_argument("--fairness", action="store_true",
                   help="compare the queue's order instead, arrival (FIFO) vs fair-share, on the same trace: Jain's "
                        "index of GPU-hours per user, median waits of light and heavy users (see "
                        "gpuspawner/replay/fairness.py; --heavy-users 0.2 gives users unequal demand)")
    p.add_argument("--half-life", type=float, default=168.0,
                   help="with --fairness: gpu_fair_share_half_life, hours (default 168)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    return p.parse_args(argv)


def _days(args: argparse.Namespace, inventory: tuple, seed: int, load: float) -> list:
    fields = {k: getattr(args, k) for k in TraceParams.__dataclass_fields__ if hasattr(args, k)}
    if args.office_hours:
        fields["hourly_weights"] = OFFICE_HOURS
    return [synthetic_trace(TraceParams(**{**fields, "seed": seed + d, "load": load}), len(inventory))
            for d in range(args.days)]


def estimates(args: argparse.Namespace, inventory: tuple) -> list[Figures]:
    """``--estimates``: the estimator's figures at each load, fitted on held-out days."""
    policy = replace(next(p for p in default_policies(()) if p.name == "gpuspawner"), backfill=args.backfill)
    out = []
    for load in (float(x) for x in args.estimate_loads.split(",") if x.strip()):
        history = fit(_days(args, inventory, args.fit_seed, load), inventory, policy, args.hours)
        days = _days(args, inventory, args.seed, load)
        offered = statistics.mean(offered_load(d, len(inventory), args.hours) for d in days)
        out.append(measure(days, inventory, policy, history, offered, args.hours)[1])
    last = args.days - 1
    rule = "" if args.backfill == "off" else f", backfill {args.backfill}"
    print(f"Wait estimates, policy gpuspawner{rule}, {len(inventory)} GPUs, {args.days} day(s) per load: the estimator "
          f"draws on the history of seeds {args.fit_seed}-{args.fit_seed + last} and is measured on seeds "
          f"{args.seed}-{args.seed + last}: held out. Its interval, the {100 * LOW:g}-{100 * HIGH:g}% quantiles, "
          f"was chosen on other days (seeds 2001-2005 and 4001-4005, history of 1001-1005), not on these figures.")
    return _shown(out, args, ESTIMATE_COLUMNS)


def _shown(out: list, args: argparse.Namespace, columns: list) -> list:
    """Print ``out`` (figures objects) as JSON or as a table of ``columns``; return it."""
    if args.json:
        print(json.dumps([f.__dict__ for f in out], indent=1))
    else:
        print(table(out, markdown=args.markdown, columns=columns))
    return out


def bookings(args: argparse.Namespace, inventory: tuple) -> list:
    """``--bookings``: the booking load's figures on the synthetic days."""
    from .bookings import COLUMNS as BOOKING_COLUMNS, measure

    policy = next(p for p in default_policies(()) if p.name == "gpuspawner")
    days = _days(args, inventory, args.seed, args.load)
    out = measure(days, inventory, policy, args.hours)
    load = statistics.mean(offered_load(d, len(inventory), args.hours) for d in days)
    print(f"Bookings, policy gpuspawner, {len(inventory)} GPUs, {len(days)} day(s) (seeds {args.seed}-"
          f"{args.seed + len(days) - 1}), offered load {100 * load:.0f}% before the booked sessions")
    return _shown(out, args, BOOKING_COLUMNS)


def choices(args: argparse.Namespace, inventory: tuple) -> list:
    """``--choices``: the runnable hub's settings, strict and first-fit, as is, with users choosing, and with
    users choosing or booking."""
    from .choices import COLUMNS as CHOICE_COLUMNS, measure

    days = _days(args, inventory, args.seed, args.load)
    policies = [p for p in default_policies(()) if p.name in ("gpuspawner", "gpuspawner, backfill first-fit")]
    out = measure(days, _days(args, inventory, args.fit_seed, args.load), inventory, policies,
                  args.patience * 60, args.hours)
    load = statistics.mean(offered_load(d, len(inventory), args.hours) for d in days)
    print(f"Users choosing by the estimates: {len(inventory)} GPUs, {len(days)} day(s) (seeds {args.seed}-"
          f"{args.seed + len(days) - 1}), offered load {100 * load:.0f}%, patience {args.patience:g} minutes; the "
          f"estimates draw on the history of seeds {args.fit_seed}-{args.fit_seed + len(days) - 1}")
    return _shown(out, args, CHOICE_COLUMNS)


def fairness(args: argparse.Namespace, inventory: tuple) -> list:
    """``--fairness``: the runnable hub's settings with the queue by arrival and by fair share."""
    from .fairness import COLUMNS as FAIRNESS_COLUMNS, measure

    arrival = next(p for p in default_policies(()) if p.name == "gpuspawner")
    policies = [replace(arrival, name="gpuspawner, arrival (FIFO)"),
                replace(arrival, name="gpuspawner, fair-share", queue_order="fair-share", half_life=args.half_life)]
    days = _days(args, inventory, args.seed, args.load)
    out = measure(days, inventory, policies, args.hours)
    load = statistics.mean(offered_load(d, len(inventory), args.hours) for d in days)
    mix = (f"a {args.heavy_users:g} share of the users asking {args.heavy_demand:g} times as often as the others"
           if args.heavy_users > 0 else "every user alike")
    print(f"Queue order, {len(inventory)} GPUs, {len(days)} day(s) (seeds {args.seed}-{args.seed + len(days) - 1}), "
          f"offered load {100 * load:.0f}%, {args.users} users, {mix}; fair-share half-life {args.half_life:g} h. "
          f"Light/heavy: the bottom/top quartile of each day's users by GPU-hours asked for")
    return _shown(out, args, FAIRNESS_COLUMNS)


def main(argv: list[str] | None = None) -> list:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    inventory = gpus(args.gpus, args.host_gpus)
    if args.estimates:
        return estimates(args, inventory)
    if args.bookings:
        return bookings(args, inventory)
    if args.choices:
        return choices(args, inventory)
    if args.fairness:
        return fairness(args, inventory)
    if args.history:
        days = [load_history(args.history)]
    else:
        days = _days(args, inventory, args.seed, args.load)
    timeouts = [float(m) * 60 for m in args.timeouts.split(",") if m.strip()]
    results = [replay(days, inventory, policy, args.hours) for policy in default_policies(timeouts)]
    sessions = sum(len(d) for d in days)
    load = statistics.mean(offered_load(d, len(inventory), args.hours) for d in days)
    if args.json:
        print(json.dumps({"offered_load": round(load, 3), "sessions": sessions, "days": len(days),
                          "results": [r.row() for r in results]}, indent=1))
    else:
        print(f"{sessions} sessions over {len(days)} day(s) of {args.hours:g} h on {len(inventory)} GPUs, "
              f"offered load {100 * load:.0f}%")
        print(table(results, markdown=args.markdown))
    if args.tail:
        policy = next(p for p in default_policies(()) if p.name == "gpuspawner")
        print(describe(*tail(days, inventory, policy, args.hours), policy.name))
    if args.chart:
        charted = ("jupyterhub-default", "gpuspawner", "gpuspawner, backfill first-fit")
        shown = [r for r in results if r.policy in charted]
        if chart(shown, args.chart, len(inventory)):
            print(f"chart: {args.chart}")
        else:
            print("chart: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    return results
