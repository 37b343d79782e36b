"""The budget gate on every backend: each one's options step (servers, and notebook GPU jobs through
``apply_job_options``) refuses a GPU choice of a spent budget with the 422 and lets CPU-only through.

The real hub shows the whole path on gpu-local (tests/integration/test_budgets_hub.py); here each
backend's own options step is driven with its inventory read stubbed (no Docker engine, cluster
or Slurm needed), so a backend whose options step forgot the gate fails.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException
from traitlets.config import Config

from gpuspawner.budgets import BudgetPolicy, BudgetSpec
from gpuspawner.profiles import Choice, load_profiles
from gpuspawner.state import GPUHubSettings, HubState

STATIC = [{"uuid": "GPU-0", "name": "NVIDIA A100-SXM4-80GB", "host": "h1", "index": 0}]
PROFILES = [{"display_name": "GPU", "slug": "gpu", "gpu_counts": [0, 1], "default_gpus": 1}]
BACKENDS = ["local", "docker", "swarm", "kube", "slurm"]


@pytest.fixture
def no_cluster(tmp_path, monkeypatch):
    """A kubeconfig whose cluster never answers (gpu-kube's spawner reads one when it is made)."""
    from kubespawner.clients import load_config

    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: none\n"
                    "clusters: [{name: none, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                    "contexts: [{name: none, context: {cluster: none, user: none}}]\n"
                    "users: [{name: none, user: {token: none}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setattr("kubernetes_asyncio.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    load_config.cache_clear()
    yield
    load_config.cache_clear()


def make(backend: str):
    config = Config({"GPUSpawnerMixin": {"gpu_profiles": PROFILES, "gpu_budget_per_user": 2}})
    user = SimpleNamespace(name="alice", groups=[], url="/", id=1)
    if backend == "kube":
        from gpuspawner.spawners.kube import GPUKubeSpawner

        spawner = GPUKubeSpawner(_mock=True, config=config, user=user)
        profile = load_profiles(PROFILES)[0]

        async def check_options(options):
            return {"slug": "gpu"}, Choice(profile, options.get("gpus", 1), "any")

        spawner.check_options = check_options
    else:
        import importlib

        module = importlib.import_module(f"gpuspawner.spawners.{backend}")
        cls = next(getattr(module, n) for n in dir(module) if n.startswith("GPU") and n.endswith("Spawner")
                   and getattr(module, n).__module__.startswith("gpuspawner.backends"))
        spawner = cls(config=config, user=user)

        async def offered_models():
            return {"a100-sxm4-80gb"}

        async def gpus_found():
            return True

        spawner.offered_models, spawner.gpus_found = offered_models, gpus_found
    spawner.hub_state = HubState(GPUHubSettings(gpu_inventory="static", static_gpus=STATIC))
    now = 1_800_000_000.0
    spent = BudgetPolicy(per_user=BudgetSpec(2, "week")).standing(
        "alice", [], [SimpleNamespace(user="alice", started=now - 7200, ended=now, gpu_count=1,
                                      model="a100", groups="[]", busy_seconds=0, idle_seconds=0)], now)
    spawner.gpu_budget_standing = lambda: spent
    return spawner


@pytest.mark.parametrize("backend", BACKENDS)
async def test_every_backend_refuses_a_spent_budgets_gpu_choice_and_starts_cpu_only(backend, no_cluster):
    spawner = make(backend)
    for step in (spawner._apply_gpu_options, spawner.apply_job_options):
        with pytest.raises(SpawnException) as refused:
            await step({"profile": "gpu", "gpus": 1})
        assert refused.value.status_code == 422 and refused.value.reason == "compute-quota-exceeded"
        assert refused.value.json_fields["error"] == "compute-quota-exceeded"
        assert "you have used 2 of 2 GPU-hours this week" in refused.value.jupyterhub_message
    await spawner._apply_gpu_options({"profile": "gpu", "gpus": 0})  # CPU only: no refusal
    assert spawner.gpu_choice.gpus == 0


@pytest.mark.parametrize("backend", ["local", "kube"])
async def test_queue_last_marks_the_spawn_instead_of_refusing(backend, no_cluster):
    spawner = make(backend)
    spawner.gpu_budget_exhausted = "queue-last"
    await spawner._apply_gpu_options({"profile": "gpu", "gpus": 1})
    assert spawner.gpu_budget_last is True
    await spawner._apply_gpu_options({"profile": "gpu", "gpus": 0})
    assert spawner.gpu_budget_last is False


@pytest.mark.parametrize(("setting", "value", "words"), [
    ("gpu_budget_per_user", -3, "gpu_budget_per_user: -3 is not a number of GPU-hours"),
    ("gpu_budget_per_group", {"students": {"hours": 5, "period": "year"}},
     "gpu_budget_per_group['students']: period 'year'"),
    ("gpu_budget_overrides", {"alice": "lots"}, "gpu_budget_overrides['alice']: 'lots' is not a number"),
    ("gpu_budget_weights", {"a100*": -1}, "gpu_budget_weights['a100*']: -1"),
    ("gpu_budget_period", "fortnight", "gpu_budget_period must be one of day, week, month"),
    ("gpu_budget_exhausted", "stop", "gpu_budget_exhausted must be 'refuse' or 'queue-last'"),
    ("gpu_budget_low", 1.5, "gpu_budget_low must be a share from 0 to 1"),
    ("gpu_budget_check_interval", 0, "gpu_budget_check_interval must be a finite number"),
])
def test_a_bad_budget_setting_stops_the_hub_at_start_naming_it(setting, value, words):
    from gpuspawner.backends.startup import refusal_at_start
    from gpuspawner.spawners.local import GPULocalProcessSpawner

    refusal = refusal_at_start(GPULocalProcessSpawner, Config({"GPUSpawnerMixin": {setting: value}}))
    assert refusal is not None and words in refusal, refusal


def test_the_keeper_tells_its_listeners_once_when_a_budget_runs_low():
    from gpuspawner.backends.budgets import BudgetKeeper

    keeper, told = BudgetKeeper(), []
    keeper.on_low(lambda user, standing: told.append((user, round(standing.left, 2))))
    keeper.on_low(lambda user, standing: 1 / 0)  # a failing listener is logged, the others still hear
    policy = BudgetPolicy(per_user=BudgetSpec(10, "week"))
    now = 1_800_000_000.0

    def look(hours_used: float) -> None:
        rows = [SimpleNamespace(user="alice", started=now - hours_used * 3600, ended=now, gpu_count=1, model="t4",
                                groups="[]", busy_seconds=0, idle_seconds=0)]
        keeper.note(policy.standing("alice", [], rows, now), policy.low)

    for used in (5, 9.5, 9.8, 3, 9.2):
        look(used)
    assert told == [("alice", 0.5), ("alice", 0.8)]  # crossed at 9.5 used, again after it had recovered
    assert keeper.left_by_user() == {"alice": pytest.approx(0.8)}


async def test_the_queue_serves_a_spent_users_request_after_every_other_and_says_why():
    import asyncio

    from gpuspawner.queue import GPUQueue

    queue = GPUQueue()
    spent = queue.join("alice/", "alice", 1, ("a100",), "gpu", last=True)
    later = [queue.join(f"{u}/", u, 1, ("a100",), "gpu") for u in ("bob", "carol")]
    assert [w.user for w in queue.waiters()] == ["bob", "carol", "alice"]
    told = []
    free: list[str] = []

    from gpuspawner.gpu import GPU

    async def read():
        return (GPU("h1", 0, "GPU-0", "NVIDIA A100-SXM4-80GB"),)

    def place(room):
        if not free:
            from gpuspawner.refusals import refuse

            raise refuse("none_free", {"subject": "GPU", "total": 1, "broken": "", "alternatives": "",
                                       "next_step": ""})
        return free.pop()

    task = asyncio.ensure_future(queue.serve(spent, read, place, 5, lambda n, text: told.append(text), recheck=0.05))
    await asyncio.sleep(0.1)
    assert any("3rd in the queue: your GPU budget is spent" in t for t in told), told
    for w in later:
        queue.leave(w)
    free.append("GPU-0")
    assert await asyncio.wait_for(task, 5) == "GPU-0"
