"""gpu-local's process table as the truth: finding server starts, adopting or stopping them; and, where
the kernel fences starts, their cgroups (a process that cleared its environment is still in its start's)."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time

import pytest
from traitlets.config import Config

import devcgroup
from gpuspawner import quota
from gpuspawner.backends.local.fence import DeviceFence
from gpuspawner.backends.local.fence_starts import StartRecord
from gpuspawner.backends.local.processes import alive, end_processes, find_servers
from gpuspawner.backends.local.spawner import GPUSimpleLocalProcessSpawner

STATIC = [{"uuid": f"GPU-{i}", "name": "Tesla T4", "index": i} for i in range(4)]
# a "server" that starts a "kernel" child, both sleeping; the child ignores SIGTERM like a stuck kernel
SERVER = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'], start_new_session=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def hub_id(fresh_metrics):
    return "unit-" + secrets.token_hex(4)


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
    assert held["bob/~stopping-start-b"] == ("GPU-1", "GPU-2")  # until it is gone
    # and they count against bob: his quota sees them (a spawn meanwhile was a 500 before)
    assert quota.held_by(held, {"bob"}) == {"bob/~stopping-start-b": 2}
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


@pytest.fixture
def kernel_fence(hub_id):
    """This hub's real cgroup v1 fence (as the spawner makes it); every start in it is ended afterwards."""
    devcgroup.require()
    fence = DeviceFence(hub_id)
    yield fence
    for spawn in fence.starts():
        for pid in fence.pids(spawn):
            os.kill(pid, 9)
        for _ in range(100):
            if fence.remove(spawn):
                break
            time.sleep(0.05)


def hide_in(groups) -> int:
    """A process in ``groups`` that left its session and environment (tests/devcgroup.ESCAPER): its pid."""
    out = subprocess.run([sys.executable, "-c", devcgroup.ESCAPER], capture_output=True, text=True, timeout=30,
                         preexec_fn=lambda: DeviceFence.join(groups), check=True)
    return int(out.stdout)


async def test_a_restarted_hub_finds_an_unmarked_process_by_its_fence_and_frees_its_gpus_only_after(
        hub_id, kernel_fence):
    """The hub died; bob's server is gone but a process it hid lives on in the start's cgroups."""
    hidden = hide_in(kernel_fence.create("start-b", [1], StartRecord("bob/", ("GPU-1",))))
    stuck = hide_in(kernel_fence.create("start-c", [2], StartRecord("cyd/", ("GPU-2",))))
    assert find_servers(hub_id) == []  # nothing carries the marks
    with devcgroup.frozen(stuck) as frozen:  # cyd's will not die (as inside a driver call)
        ada = spawner(hub_id)
        ada.fence_end_timeout, ada.fence_retry_interval = 1.0, 0.2
        released = []  # (GPUs released, whether bob's hidden process was alive at that moment)
        ada.ledger.observe(lambda kind, owner, uuids, since: kind == "release" and released.append(
            (uuids, bool(alive([hidden])))))
        await ada.ensure_reconciled()
        for _ in range(100):  # bob's is ended, then its GPU freed; cyd's goes out of service
            if not alive([hidden]) and "GPU-1" not in ada.ledger.held() and ada.hub_state.out_of_service.of("cyd/"):
                break
            await asyncio.sleep(0.05)
        assert not alive([hidden]) and "GPU-1" not in ada.ledger.held()
        assert [(("GPU-1",), False)] == [r for r in released if "GPU-1" in r[0]]  # freed once it was gone
        [withheld] = ada.hub_state.out_of_service.of("cyd/")
        assert withheld.uuids == ("GPU-2",) and ada.ledger.holder("GPU-2") == withheld.owner
        assert f"pid {stuck} " in withheld.reason and "uninterruptible sleep" in withheld.reason
        devcgroup.thaw(frozen)
        assert await ada.hub_state.out_of_service.given_back(withheld.owner, timeout=10)
    assert not alive([stuck]) and ada.ledger.allocations() == {}
    assert kernel_fence.starts() == []  # their cgroups and records are gone too
