"""Replay a day of GPU sessions through gpuspawner's real decision code, per policy (see gpuspawner/replay/).

    scripts/bench fleet [--chart docs/replay.png] [any option of python -m gpuspawner.replay]
    scripts/bench fleet --estimates    # the wait estimator: estimate at enqueue vs real start, 85 % and 71 % load
    scripts/bench fleet --tail         # also who waited longest, and what held them up
    scripts/bench fleet --choices      # users choosing by the estimate: queue, another model, or come back
    scripts/bench fleet --fairness --heavy-users 0.2   # the queue by arrival (FIFO) vs fair share

Prints the machine's load average with the figures: the replay runs on a simulated clock,
so its figures do not depend on the machine; only its run time does.
"""

from __future__ import annotations

import os
import sys
import time

from gpuspawner.replay import main

if __name__ == "__main__":
    started = time.perf_counter()
    main(sys.argv[1:])
    print(f"replayed in {time.perf_counter() - started:.1f} s; load average {os.getloadavg()[0]:.2f}")
