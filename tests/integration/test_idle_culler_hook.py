"""jupyterhub-idle-culler 2.0, run by a real hub as a managed service, made GPU-aware by
gpuspawner's ``cull_arbiter_hook`` (:class:`gpuspawner.hub.arbiter.GPUCullArbiter`).

The culler's own rule (inactive for ``--timeout`` seconds) would stop every server here:
no user touches their server after starting it. With the hook (``kernel_activity=True``),
the server whose GPUs compute keeps running, and so does the one whose kernel computes on
the CPU; the one whose GPUs and kernels idle is warned in JupyterLab, then stopped, and its
usage record says it was culled; a server holding no GPU keeps the culler's own rule.
Utilisation is scripted on the stand-in NVML library.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import datetime

import pytest
import requests

from gpuspawner.simulation import simulated_config
from hub import login
from kernels import execute, start_kernel
from ops_hub import OpsHub
from test_default_culler import LOOP
from test_local_hub import start
from test_ops_culler import busy_alice_idle_bob, notices
from test_ops_overview import user_token, wait_for
from test_usage_accounting import record

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2],
             "default_gpus": 1, "default": True},
            {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]}]
TIMEOUT, CULL_EVERY, WARN_BEFORE = 14, 2, 6

# what a site adds to its hub's configuration: the culler as a managed service, with its role
SERVICE_CONFIG = """
from gpuspawner.hub.arbiter import ARBITER_SCOPES
c.JupyterHub.services.append({{"name": "idle-culler", "command": {command!r}}})
c.JupyterHub.load_roles.append({{
    "name": "idle-culler", "services": ["idle-culler"],
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers", *ARBITER_SCOPES],
}})
"""
# ... and to the culler's configuration file
CULLER_CONFIG = """
from gpuspawner.hub.arbiter import GPUCullArbiter
c.IdleCuller.cull_arbiter_hook = GPUCullArbiter({url!r}, threshold=10, warn_before={warn_before}, kernel_activity=True)
"""


@pytest.fixture
def culler_hub(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, devices=simulated_config(a100=3, t4=3),
                 server_args=["--GPUMonitor.interval=0.5"])
    culler_config = tmp_path / "idle_culler_config.py"
    culler_config.write_text(CULLER_CONFIG.format(url=hub.url, warn_before=WARN_BEFORE))
    command = [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={TIMEOUT}",
               f"--cull-every={CULL_EVERY}", f"--config={culler_config}"]
    with open(hub.config_file, "a") as f:
        f.write(SERVICE_CONFIG.format(command=command))
    hub.start()
    try:
        yield hub
    finally:
        hub.close()


def test_idle_culler_keeps_the_gpu_busy_server_and_culls_the_idle_one_after_a_warning(culler_hub):
    hub = culler_hub
    hub.add_users("carol", "dave")
    r = hub.spawn("carol", {"profile": "cpu", "gpus": 0})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("carol")
    alice_gpus, bob_gpus, alice_token, bob_token = busy_alice_idle_bob(hub)
    dave_gpus = start(hub, "dave", {"profile": "gpu", "gpus": 1, "gpu_model": "any"})
    # dave's GPU idles while his notebook computes on the CPU: with kernel_activity, that is use
    dave, dave_token = f"{hub.url}/user/dave/", user_token(hub, login(hub, "dave"), "dave")
    kernel = start_kernel(dave, dave_token)
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):  # still running: it goes on without us
        execute(dave, dave_token, kernel, LOOP, timeout=2)
    hub.set_utilization(dict.fromkeys(dave_gpus, 2))

    warning = wait_for(lambda: notices(hub, "bob", bob_token), timeout=120, interval=0.2)
    assert warning, hub.log()
    assert warning[0]["level"] == "warning" and warning[0]["source"] == "idle-culler"
    assert warning[0]["message"].startswith(f"This server will be stopped in {WARN_BEFORE} seconds or a little "
                                            "later because its GPUs and kernels are idle (GPUs below 10% "
                                            "utilisation, no code run, for "), warning
    assert hub.user("bob")["servers"][""]["ready"], "warned first, still running"

    assert wait_for(lambda: not hub.user("bob")["servers"], timeout=120), hub.log()
    bob_record = wait_for(lambda: record(hub, "bob/"), timeout=30)
    assert bob_record and bob_record["end_reason"] == "culled", bob_record
    log = hub.log_path.read_text()
    culled = [line for line in log.splitlines() if "gpuspawner: culling bob/" in line]
    assert len(culled) == 1 and all(u in culled[0] for u in bob_gpus), log

    # carol holds no GPU: the culler's own rule stopped her inactive server, as before
    assert wait_for(lambda: not hub.user("carol")["servers"], timeout=60), hub.log()

    # alice has not touched her server for longer than the culler's timeout, but her GPUs compute
    wait_for(lambda: False, timeout=3 * CULL_EVERY)
    alice = hub.user("alice")["servers"][""]
    assert alice["ready"], hub.log()
    assert notices(hub, "alice", alice_token) == []
    inactive = time.time() - datetime.fromisoformat(alice["last_activity"].replace("Z", "+00:00")).timestamp()
    assert inactive >= TIMEOUT, f"alice looks active to the hub ({inactive:.0f} s): the test proves nothing"
    log = hub.log_path.read_text()
    assert "alice/" not in "".join(line for line in log.splitlines() if "gpuspawner: " in line)
    r = requests.get(f"{hub.url}/user/alice/api/gpus", headers={"Authorization": f"token {alice_token}"}, timeout=30)
    assert r.status_code == 200 and {g["uuid"] for g in r.json()["gpus"]} == alice_gpus

    # dave's kernel ran all along: never warned, still running
    assert hub.user("dave")["servers"][""]["ready"], hub.log()
    assert notices(hub, "dave", dave_token) == []
    assert "dave/" not in "".join(line for line in log.splitlines() if "gpuspawner: " in line)
    requests.post(f"{dave}api/kernels/{kernel}/interrupt", headers={"Authorization": f"token {dave_token}"}, timeout=30)
