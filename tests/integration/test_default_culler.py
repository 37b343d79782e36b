"""The runnable default's GPU culler while people work: a running kernel keeps its server.

The repository's jupyterhub_config.py on a machine without GPUs (the simulated GPUs read 0 %
whatever a notebook does), its culler made quick through GPUSPAWNER_CULLER_*: a server whose
kernel keeps running code is neither warned nor stopped; one whose kernel ran a cell and then
sat idle is warned, then stopped, and the culler's log says both its GPUs and its kernels were idle.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import requests

from hub import login
from kernels import execute, start_kernel
from test_default_config import runnable_default
from test_ops_overview import user_token, wait_for

pytestmark = pytest.mark.integration

CULLER = {"PERIOD": "2", "IDLE_TIMEOUT": "16", "WARN_BEFORE": "6"}
#: a loop that keeps the kernel executing (light on the CPU: the machine is shared)
LOOP = "import time\nwhile True:\n    sum(range(10000))\n    time.sleep(0.05)\n"


@pytest.fixture(scope="module")
def culling_hub(tmp_path_factory, fakenvml_libdir):
    env = {f"GPUSPAWNER_CULLER_{key}": value for key, value in CULLER.items()}
    with runnable_default(tmp_path_factory.mktemp("default-culler"), fakenvml_libdir,
                          {**env, "GPUSPAWNER_BACKEND": "local"}) as (hub, _state):
        yield hub


def start_server(hub, name: str) -> tuple[str, dict]:
    """``name``'s server on one simulated T4, started through the REST API; (server URL, auth header)."""
    auth = {"Authorization": f"token {user_token(hub, login(hub, name), name)}"}
    api = f"{hub.url}/hub/api/users/{name}"
    r = requests.post(api + "/server", json={"profile": "gpu", "gpus": 1, "gpu_model": "t4"}, headers=auth,
                      timeout=60)
    assert r.status_code in (201, 202), r.text + hub.log()
    ready = wait_for(lambda: requests.get(api, headers=auth, timeout=30).json()["servers"].get("", {}).get("ready"),
                     timeout=120)
    assert ready, hub.log()
    return f"{hub.url}/user/{name}/", auth


def notices(server: str, auth: dict) -> list[dict]:
    r = requests.get(server + "api/gpus/notices", headers=auth, timeout=30)
    return r.json()["notices"] if r.status_code == 200 else []


def running(hub, name: str, auth: dict) -> bool:
    return bool(requests.get(f"{hub.url}/hub/api/users/{name}", headers=auth, timeout=30).json()["servers"])


def test_a_running_kernel_keeps_its_server_an_idle_one_is_warned_then_stopped(culling_hub):
    hub = culling_hub
    busy, busy_auth = start_server(hub, "ada")
    busy_token = busy_auth["Authorization"].split()[1]
    kernel = start_kernel(busy, busy_token)
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):  # still running: it goes on without us
        execute(busy, busy_token, kernel, LOOP, timeout=2)
    # bob's server only once ada's kernel runs: on a loaded machine his start may take longer than
    # ada's idle timeout, and an idle server with no kernel yet is rightly warned
    idle, idle_auth = start_server(hub, "bob")
    idle_token = idle_auth["Authorization"].split()[1]
    assert execute(idle, idle_token, start_kernel(idle, idle_token), "print(6 * 7)") == "42\n"
    started = time.time()

    warning = wait_for(lambda: notices(idle, idle_auth), timeout=120, interval=0.3)
    assert warning, hub.log()
    assert warning[0]["message"].startswith(
        "This server will be stopped in 6 seconds because its GPUs and kernels are idle (GPUs below 5% utilisation, "
        "no code run, for"), warning
    assert wait_for(lambda: not running(hub, "bob", idle_auth), timeout=120, interval=0.3), hub.log()
    assert time.time() - started >= float(CULLER["IDLE_TIMEOUT"]), "stopped before its idle timeout"

    # ada's kernel ran all along: never warned, still running a round later
    time.sleep(2 * float(CULLER["PERIOD"]))
    assert running(hub, "ada", busy_auth) and notices(busy, busy_auth) == []
    log = hub.log_path.read_text()
    stops = [line for line in log.splitlines() if "stopping bob/ because" in line]
    assert len(stops) == 1 and "below 5% utilisation and its kernels ran no code for" in stops[0], log[-4000:]
    assert not [line for line in log.splitlines() if "warned ada/" in line or "stopping ada/" in line]
    requests.post(f"{busy}api/kernels/{kernel}/interrupt", headers=busy_auth, timeout=30)
