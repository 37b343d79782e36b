"""gpu-local's process table as the truth: finding server starts, adopting or stopping them."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys

import pytest
from traitlets.config import Config

from gpuspawner.spawners.local import GPUSimpleLocalProcessSpawner
from gpuspawner.spawners.processes import alive, end_processes, find_servers
from gpuspawner.state import stop_serving_hub_metrics

STATIC = [{"uuid": f"GPU-{i}", "name": "Tesla T4", "index": i} for i in range(4)]
# a "server" that starts a "kernel" child, both sleeping; the child ignores SIGTERM like a stuck kernel
SERVER = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'], start_new_session=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def hub_id():
    stop_serving_hub_metrics()
    yield "unit-" + secrets.token_hex(4)
    stop_serving_hub_metrics()


@pytest.fixture
def start_server(hub_id):
    started: list[subprocess.Popen] = []

    def start(owner: str, spawn: str, uuids: str) -> subprocess.Popen:
        env = dict(os.environ, GPUSPAWNER_HUB=hub_id, GPUSPAWNER_SERVER=owner, GPUSPAWNER_SPAWN=spawn,
                   CUDA_VISIBLE_DEVICES=uuids)
        proc = subprocess.Popen([sys.executable, "-c", SERVER], env=env)
        started.append(proc)
        return proc

    yield start
    for group in find_servers(hub_id):  # children included, by pid
        for pid in alive(group.pids):
            os.kill(pid, 9)
    for proc in started:
        proc.kill()
        proc.wait()


async def wait_for_children(hub_id: str, count: int) -> None:
    for _ in range(100):
        if sum(len(g.pids) for g in find_servers(hub_id)) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the test processes did not start")


def spawner(hub_id: str, user: str = "ada") -> GPUSimpleLocalProcessSpawner:
    config = Config()
    config.GPUSpawnerMixin.gpu_inventory = "static"
    config.GPUSpawnerMixin.static_gpus = STATIC
    config.GPUSpawnerMixin.gpu_hub_id = hub_id

    class User:
        name = user
        groups: list = []

    return GPUSimpleLocalProcessSpawner(config=config, user=User())


async def test_find_servers_groups_a_start_with_its_children(hub_id, start_server):
    proc = start_server("ada/", "start1", "GPU-0,GPU-1")
    await wait_for_children(hub_id, 2)
    [group] = find_servers(hub_id)
    assert group.owner == "ada/" and group.spawn == "start1"
    assert group.uuids == ("GPU-0", "GPU-1")
    assert group.leader == proc.pid and len(group.pids) == 2
    assert find_servers(hub_id, spawn="other") == []
    assert find_servers("another-hub") == []


async def test_recorded_start_is_adopted_and_unrecorded_one_is_stopped(hub_id, start_server):
    recorded = start_server("ada/", "start-a", "GPU-0")
    unrecorded = start_server("bob/", "start-b", "GPU-1,GPU-2")
    await wait_for_children(hub_id, 4)
    [orphan] = [g for g in find_servers(hub_id) if g.owner == "bob/"]

    ada = spawner(hub_id)
    ada.load_state({"pid": recorded.pid, "gpu_spawn": "start-a", "port": 12345,
                    "gpus": [{"host": "localhost", "index": 0, "uuid": "GPU-0", "name": "Tesla T4"}]})
    await ada.ensure_reconciled()

    held = ada.ledger.allocations()
    assert held["ada/"] == ("GPU-0",)
    assert held[f"bob//stopping-{'start-b'[:12]}"] == ("GPU-1", "GPU-2")  # until it is gone
    # the unrecorded start, its SIGTERM-deaf child included, is ended; then its GPUs are free
    for _ in range(150):
        if not alive(orphan.pids):
            break
        await asyncio.sleep(0.1)
    assert not alive(orphan.pids)
    unrecorded.wait(5)
    for _ in range(50):
        if set(ada.ledger.allocations()) == {"ada/"}:
            break
        await asyncio.sleep(0.1)
    assert ada.ledger.allocations() == {"ada/": ("GPU-0",)}
    assert alive([recorded.pid]) == [recorded.pid]


async def test_saved_gpus_without_a_live_process_are_freed(hub_id):
    ada = spawner(hub_id)
    ada.load_state({"gpu_spawn": "gone", "port": 1,
                    "gpus": [{"host": "localhost", "index": 3, "uuid": "GPU-3", "name": "Tesla T4"}]})
    assert ada.ledger.allocations() == {"ada/": ("GPU-3",)}
    await ada.ensure_reconciled()
    assert ada.ledger.allocations() == {}


async def test_end_processes_kills_what_ignores_sigterm(hub_id, start_server):
    start_server("ada/", "s", "")
    await wait_for_children(hub_id, 2)
    [group] = find_servers(hub_id)
    assert await end_processes(group.pids, grace=0.5) == []
    assert alive(group.pids) == []
