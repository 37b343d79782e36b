"""The queue, quota and culler settings the runnable hub uses (jupyterhub_config.py), chosen with the
replay (``python -m gpuspawner.replay``; README "Choosing settings with the replay").

Plain values, so that the replay (core) and the hub's setup (:mod:`gpuspawner.hub.setup`, which
re-exports them) read the same numbers.
"""

from __future__ import annotations

#: The GPU culler's settings: seconds between rounds, utilisation % below which a GPU is idle,
#: seconds idle before a server is stopped, seconds of warning before that.
RECOMMENDED_CULLER = {"period": 60, "threshold": 5, "idle_timeout": 480, "warn_before": 180}
#: Seconds a queued spawn waits for a GPU (``gpu_queue_timeout``).
RECOMMENDED_QUEUE_TIMEOUT = 1800.0
#: GPUs one user may hold at once (``gpu_quota_per_user``).
RECOMMENDED_QUOTA_PER_USER = 4
