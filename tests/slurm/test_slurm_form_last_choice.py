"""gpu-slurm preselects a user's last choice in the spawn form (profile, GPU model, count), and says
which counts no node could ever hold.

A real GPUSlurmSpawner object renders its form for a user whose last user_options are set
(JupyterHub keeps them in its database). Its form reads ``sinfo --json`` of the test cluster
(one node, ``gpu:a100:2,gpu:t4:2``) through ``exec_prefix``, as a hub's does.
"""

from __future__ import annotations

import getpass
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from forms import Checked
from gpuspawner.backends.slurm.spawner import GPUSlurmSpawner

pytestmark = pytest.mark.slurm

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU", "gpu_counts": [1, 2], "default_gpus": 1, "default": True},
    {"slug": "big", "display_name": "Big", "gpu_models": ["a100", "t4"], "gpu_counts": [1, 2, 4], "default_gpus": 1},
]


async def form(cluster, last: dict | None) -> str:
    c = Config()
    c.GPUSpawnerMixin.gpu_profiles = PROFILES
    c.SlurmSpawner.exec_prefix = f"env SLURM_CONF={cluster.conf}"  # the hub's commands reach the test cluster
    # a user with an account here, as batchspawner's users have (their commands are filled in for it)
    spawner = GPUSlurmSpawner(config=c, user=SimpleNamespace(name=getpass.getuser(), groups=[]))
    spawner.req_keepvars = "ALL"  # its default is computed from a hub's environment for the server; no hub here
    if last is not None:
        spawner.user_options = dict(last)
    return await spawner._render_options_form()


async def test_gpu_slurm_preselects_the_last_choice(slurm_cluster):
    html = await form(slurm_cluster, {"profile": "big", "gpus": 2, "gpu_model": "t4"})
    checked = Checked(html)
    assert checked.radios["profile"] == "big"
    assert (checked.selected["gpu_model-big"], checked.selected["gpus-big"]) == ("t4", "2")
    # a request Slurm would queue is offered; one no node can ever hold says so
    assert ">4 GPUs (never fits here: needs 4 x T4 (gpu:t4) on one node; the largest here has 2)</option>" in html
    assert "A100 (gpu:a100): 2 of 2 free · T4 (gpu:t4): 2 of 2 free" in html  # each model's free/total, as sinfo says
    fresh = Checked(await form(slurm_cluster, None))  # a new user: the defaults
    assert fresh.radios["profile"] == "gpu" and fresh.selected["gpus-big"] == "1"
