"""What the job tests share: their hub's profiles and configuration, the notebooks they run, readers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def write(path: Path, *cells: str, parameters: str | None = None) -> Path:
    """A notebook with a ``parameters`` cell (if given) then ``cells``, and the folders it needs: all
    owned by whoever owns the folder they are made in (a user's home: their account), as if they made them."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNELSPEC
    if parameters is not None:
        nb.cells.append(nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nb.cells.extend(nbformat.v4.new_code_cell(c) for c in cells)
    existing = next(p for p in path.parents if p.exists())
    made = [p for p in path.parents if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    owner = existing.stat()
    for made_path in (*made, path):
        os.chown(made_path, owner.st_uid, owner.st_gid)
    return path


# prints the job's GPUs as CUDA sees them (the environment) and its own pid, then sleeps `seconds`
GPU_REPORT = (
    "import os, time\n"
    "print('GPUS=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''))\n"
    "print('PID=%d' % os.getppid())\n"
    "time.sleep(seconds)\n"
    "print('slept', seconds)"
)


def outputs_text(path: Path) -> str:
    """Every stream output of an executed notebook, joined."""
    nb = nbformat.read(str(path), as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [0, 1, 2], "default": True,
     "default_gpus": 1},
    {"slug": "queued", "display_name": "Queued T4", "gpu_models": ["t4"], "gpu_counts": [1], "default_gpus": 1,
     "queue": True},
]
# appended to the test hub's configuration: quotas, a job time limit, the GPU overview and job API
JOBS_CONFIG = """
from gpuspawner.hub.setup import configure
c.GPUSpawnerMixin.gpu_quota_per_user = 2
c.GPUSpawnerMixin.gpu_job_time_limit = 600
c.JupyterHub.load_roles[0]["scopes"] += ["tokens", "custom:gpus:read"]
configure(c)
"""


def holders(hub) -> dict[str, dict]:
    """GPU uuid -> its holder, from /hub/api/gpus."""
    r = hub.api("GET", "/gpus")
    assert r.status_code == 200, r.text
    return {g["uuid"]: g["holder"] for g in r.json()["gpus"] if g.get("holder")}


def submit(hub, user: str, body: dict):
    """``POST /hub/api/users/USER/gpu-jobs``: the response (the tests check its status)."""
    return hub.api("POST", f"/users/{user}/gpu-jobs", json=body)


def job(hub, user: str, job_id: str) -> dict:
    r = hub.api("GET", f"/users/{user}/gpu-jobs/{job_id}")
    assert r.status_code == 200, r.text
    return r.json()


def wait_state(hub, user: str, job_id: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    """The job once it is in one of ``states``; TimeoutError (with the hub's log) otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = job(hub, user, job_id)
        if found["state"] in states:
            return found
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} is {found['state']} ({found['reason']}), not {states}:\n{hub.log()}")
