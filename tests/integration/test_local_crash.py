"""gpu-local survives a hub SIGKILL in the middle of a spawn storm.

A real hub with 4 simulated GPUs gets a burst of concurrent spawn requests and
is killed (SIGKILL, no cleanup) while they are being served, then started
again on the same database. What every user could check from the process
table must hold afterwards: the live server processes hold disjoint GPU sets,
every live process belongs to a server the hub reports as running (the
others were stopped), and new spawns are placed only on GPUs nobody holds.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import Hub, pid_alive

pytestmark = pytest.mark.integration

PROFILES = [
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"],
     "gpu_counts": [1, 2], "default_gpus": 1, "default": True},
]
REQUESTS = [
    {"profile": "gpu", "gpus": 1, "gpu_model": "a100-sxm4-80gb"},
    {"profile": "gpu", "gpus": 1, "gpu_model": "t4"},
    {"profile": "gpu", "gpus": 2, "gpu_model": "any"},
    {"profile": "gpu", "gpus": 1, "gpu_model": "any"},
]


def marked_processes(api_url: str) -> dict[int, dict[str, str]]:
    """pid -> environment of every live process started for this hub's servers (from /proc).

    Found by the hub API URL JupyterHub gives every server (and its kernels inherit), not by
    anything gpuspawner adds, so the test does not trust the code it checks.
    """
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue
        env = dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)
        if env.get("JUPYTERHUB_API_URL") == api_url and pid_alive(int(entry.name)):
            found[int(entry.name)] = env
    return found


def running_servers(hub: Hub) -> dict[str, int]:
    """user -> pid of each server the hub reports as ready."""
    out = {}
    for user in hub.api("GET", "/users").json():
        server = user["servers"].get("")
        if server and server.get("ready"):
            out[user["name"]] = server["state"]["pid"]
    return out


def storm(hub: Hub, users: list[str], results: dict) -> list[threading.Thread]:
    def one(i: int, name: str) -> None:
        try:
            results[name] = hub.spawn(name, REQUESTS[i % len(REQUESTS)]).status_code
        except requests.RequestException as e:  # the hub was killed under it
            results[name] = type(e).__name__

    threads = [threading.Thread(target=one, args=(i, n), daemon=True) for i, n in enumerate(users)]
    for thread in threads:
        thread.start()
    return threads


def settled(hub: Hub, api_url: str, timeout: float = 90) -> tuple[dict[str, int], dict[int, dict[str, str]]]:
    """Wait until every live marked process belongs to a running server, and no spawn is pending."""
    deadline = time.monotonic() + timeout
    while True:
        users = hub.api("GET", "/users").json()
        pending = [u["name"] for u in users if any(s.get("pending") for s in u["servers"].values())]
        running = running_servers(hub)
        processes = marked_processes(api_url)
        leaders = {pid for pid, env in processes.items() if int(_ppid(pid)) not in processes}
        if not pending and leaders <= set(running.values()):
            return running, processes
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not settled after {timeout}s: pending {pending}, running {running}, "
                f"live server processes {sorted(leaders)}\n{hub.log()}"
            )
        time.sleep(0.5)


def _ppid(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return text[text.rfind(")") + 2:].split()[1]


def gpus_of(env: dict[str, str]) -> set[str]:
    return {u for u in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if u}


def assert_disjoint(running: dict[str, int], processes: dict[int, dict[str, str]]) -> dict[str, set[str]]:
    held = {}
    for name, pid in running.items():
        assert pid in processes, f"{name}'s server pid {pid} is not a live process of this hub"
        assert processes[pid]["JUPYTERHUB_USER"] == name
        held[name] = gpus_of(processes[pid])
    # every process of every live server, kernels included, is on its server's GPUs
    for pid, env in processes.items():
        owner = env["JUPYTERHUB_USER"]
        assert owner in held, f"pid {pid} runs for {owner}, whose server is not running"
        assert gpus_of(env) == held[owner]
    seen: dict[str, str] = {}
    for name, gpus in held.items():
        for uuid in gpus:
            assert uuid not in seen, f"GPU {uuid} is held by the live servers of {seen[uuid]} and {name}"
            seen[uuid] = name
    return held


@pytest.mark.parametrize("kill_at", [1, 3])
def test_hub_sigkill_during_spawn_storm_never_gives_a_gpu_twice(tmp_path, fakenvml_libdir, kill_at):
    """The hub is killed as soon as ``kill_at`` server processes exist, while the other spawns are in flight."""
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, simulated_config(a100=2, t4=2))
    hub_id = "crash-" + secrets.token_hex(4)
    hub = Hub(tmp_path / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES,
              extra_config=f"c.GPUSpawnerMixin.gpu_hub_id = {hub_id!r}\n")
    api_url = hub.settings["hub_bind_url"] + "/hub/api"
    users = [f"user{i}" for i in range(10)]
    hub.start()
    try:
        hub.add_users(*users)
        results: dict[str, object] = {}
        threads = storm(hub, users, results)
        deadline = time.monotonic() + 60
        while len(marked_processes(api_url)) < kill_at and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(marked_processes(api_url)) >= kill_at, f"no server process started\n{hub.log()}"
        hub.proc.send_signal(signal.SIGKILL)
        hub.proc.wait()
        hub._stop_proxy()
        for thread in threads:
            thread.join(30)
        survivors = marked_processes(api_url)

        hub.start()
        running, processes = settled(hub, api_url)
        held = assert_disjoint(running, processes)
        # what was alive at the crash is either adopted or gone: nothing runs unaccounted for
        for pid in survivors:
            assert pid in processes or not pid_alive(pid)

        # the restarted hub's ledger agrees with the processes: new spawns go to free GPUs only
        free = 4 - sum(len(g) for g in held.values())
        idle = [u for u in users if u not in running]
        for name in idle:
            r = hub.spawn(name, {"profile": "gpu", "gpus": 1, "gpu_model": "any"})
            if free:
                assert r.status_code in (201, 202), f"{free} GPU(s) should be free: {r.status_code} {r.text}"
                hub.wait_ready(name)
                free -= 1
            else:
                assert r.status_code == 409, r.text
                assert "0 of 4 free" in r.json()["message"]
                break
        running, processes = settled(hub, api_url)
        assert_disjoint(running, processes)
    finally:
        hub.server_pids.update(marked_processes(api_url))
        hub.close()
        for pid in marked_processes(api_url):  # anything the test could not stop through the hub
            os.kill(pid, signal.SIGKILL)
