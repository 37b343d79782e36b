"""``python -m gpuspawner.jobs.execute``: the executor's public name, which job commands run.

The executor is :mod:`gpuspawner.jobmodel.execute`; this name stays, as a user's image may
hold an older gpuspawner where it lived here.
"""

import sys

from ..jobmodel.execute import *  # noqa: F403
from ..jobmodel.execute import main

if __name__ == "__main__":
    sys.exit(main())
