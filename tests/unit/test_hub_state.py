"""One GPU state per hub, shared by its spawners and its handlers, found the way traitlets reads config."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY
from traitlets.config import Application, Config

from gpuspawner.backends.local.caches import LocalCaches
from gpuspawner.backends.local.spawner import GPUSimpleLocalProcessSpawner
from gpuspawner.state import HubState, hub_state, hub_state_of_app

STATIC = [{"uuid": "GPU-a", "name": "Tesla T4", "host": "gpu-host-1"},
          {"uuid": "GPU-b", "name": "Tesla T4", "host": "gpu-host-1"}]


pytestmark = pytest.mark.usefixtures("fresh_metrics")


def static_config(section: str = "GPUSimpleLocalProcessSpawner") -> Config:
    config = Config()
    config[section].gpu_inventory = "static"
    config[section].static_gpus = STATIC
    return config


async def test_spawners_and_handlers_of_one_hub_share_one_state():
    config = static_config()
    first = GPUSimpleLocalProcessSpawner(config=config)
    second = GPUSimpleLocalProcessSpawner(config=config)
    # a hub handler knows the config and the spawner class, not a spawner
    from_handler = hub_state(config, GPUSimpleLocalProcessSpawner)
    assert first.hub_state is second.hub_state is from_handler
    assert first.ledger is from_handler.ledger and first.inventory is from_handler.inventory
    reading = await from_handler.inventory.read()
    assert [g.uuid for g in reading.gpus] == ["GPU-a", "GPU-b"]


@pytest.mark.parametrize("section", ["GPUSpawnerMixin", "GPUHubSettings", "Spawner", "LocalProcessSpawner"])
async def test_settings_on_any_parent_section_reach_the_handler(section):
    config = static_config(section)
    state = hub_state(config, GPUSimpleLocalProcessSpawner)
    assert state is GPUSimpleLocalProcessSpawner(config=config).hub_state
    assert [g.uuid for g in (await state.inventory.read()).gpus] == ["GPU-a", "GPU-b"]


def test_the_hub_app_owns_the_state_and_two_hubs_on_one_config_share_nothing():
    config = static_config()
    apps = [Application(config=config), Application(config=config)]  # two hubs in one process
    handler_settings = [{"config": config, "spawner_class": GPUSimpleLocalProcessSpawner, "app": app} for app in apps]

    def spawner_of(settings: dict) -> GPUSimpleLocalProcessSpawner:  # JupyterHub's User carries the app's settings
        return GPUSimpleLocalProcessSpawner(config=config, user=SimpleNamespace(name="ada", settings=settings))

    first, second = (hub_state_of_app(settings) for settings in handler_settings)
    assert first is not second and first.ledger is not second.ledger
    assert spawner_of(handler_settings[0]).hub_state is first is hub_state_of_app(handler_settings[0])
    assert spawner_of(handler_settings[1]).hub_state is second
    assert hub_state(config, GPUSimpleLocalProcessSpawner) not in (first, second)  # outside a hub: the config's own
    first.cache(LocalCaches).local_starts["ada/"] = "s1"
    assert second.cache(LocalCaches).local_starts == {}
    assert first.cache(LocalCaches).local_starts == {"ada/": "s1"}  # one object per hub, found by its class


def test_each_layer_keeps_its_own_typed_object_on_the_hub_state_found_by_class():
    state = hub_state(static_config(), GPUSimpleLocalProcessSpawner)
    assert state.cached(LocalCaches) is None  # nothing is made before its first use
    caches = state.cache(LocalCaches)
    assert type(caches) is LocalCaches and caches.local_pids == {}
    assert state.cache(LocalCaches) is caches is state.cached(LocalCaches)

    class Made:  # another layer's thing that needs arguments: its maker runs once
        pass
    makes = []
    first = state.cache(Made, lambda: makes.append(1) or Made())
    assert state.cache(Made, lambda: makes.append(2) or Made()) is first and makes == [1]


def test_the_job_metrics_count_what_the_hub_layer_says():
    def jobs() -> dict:
        return {s.labels["state"]: s.value for m in REGISTRY.collect() if m.name == "gpuspawner_jobs"
                for s in m.samples}

    state = hub_state(static_config(), GPUSimpleLocalProcessSpawner)
    assert jobs() == {}  # no job manager yet: no job states
    state.job_counts = lambda: {"queued": 2, "running": 1}  # as the hub's job manager sets it
    assert jobs() == {"queued": 2, "running": 1}


def test_the_hub_state_imports_no_layer_above_it():
    code = ("import sys, gpuspawner.state\n"
            "above = sorted(m for m in sys.modules if m.split('.')[:2] in "
            "(['gpuspawner', 'backends'], ['gpuspawner', 'jobs'], ['gpuspawner', 'hub'], ['gpuspawner', 'spawners']))\n"
            "assert not above, above\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_another_hub_config_gets_another_state():
    assert hub_state(static_config(), GPUSimpleLocalProcessSpawner) is not hub_state(
        static_config(), GPUSimpleLocalProcessSpawner)


def test_created_once_under_concurrency():
    config = static_config()
    seen: list[HubState] = []
    barrier = threading.Barrier(20)

    def look():
        barrier.wait()
        seen.append(hub_state(config, GPUSimpleLocalProcessSpawner))

    threads = [threading.Thread(target=look) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(s) for s in seen}) == 1


def test_bad_static_inventory_is_refused_at_configuration():
    config = Config()
    config.GPUSpawnerMixin.gpu_inventory = "static"
    config.GPUSpawnerMixin.static_gpus = [{"uuid": "GPU-a"}]
    with pytest.raises(Exception, match="static_gpus: static GPU entry 0 needs a 'name' string"):
        GPUSimpleLocalProcessSpawner(config=config)


def test_static_gpus_are_checked_once_for_all_spawners_and_a_bad_list_is_still_refused(monkeypatch):
    """Every spawner loads the configured list; checking 10,000 entries took 0.25 s for each spawner."""
    import gpuspawner.state

    checked = []
    check = gpuspawner.state.gpus_from_config
    monkeypatch.setattr(gpuspawner.state, "gpus_from_config", lambda entries: checked.append(1) or check(entries))
    config = Config()
    config.GPUSimpleLocalProcessSpawner.gpu_inventory = "static"
    config.GPUSimpleLocalProcessSpawner.static_gpus = [{"uuid": "GPU-once", "name": "Tesla T4", "host": "h"}]
    spawners = [GPUSimpleLocalProcessSpawner(config=config) for _ in range(3)]
    assert len(checked) == 1 and spawners[2].static_gpus[0]["uuid"] == "GPU-once"
    config.GPUSimpleLocalProcessSpawner.static_gpus = [{"uuid": "GPU-once", "name": "Tesla T4", "host": "h"},
                                                       {"uuid": "GPU-once", "name": "Tesla T4", "host": "h"}]
    with pytest.raises(Exception, match="static_gpus: static GPU entry 1 repeats uuid GPU-once"):
        GPUSimpleLocalProcessSpawner(config=config)


def test_spawners_share_the_configured_static_gpus_and_none_can_change_them():
    """traitlets copies each configured value into each spawner (10,000 GPUs: a third of a second a spawner,
    once per user); the configured static_gpus are one read-only list for every spawner and settings object."""
    config = static_config()
    first, second = GPUSimpleLocalProcessSpawner(config=config), GPUSimpleLocalProcessSpawner(config=config)
    assert first.static_gpus is second.static_gpus and first.static_gpus == STATIC
    assert first.hub_state is second.hub_state is hub_state(config, GPUSimpleLocalProcessSpawner)
    with pytest.raises(TypeError, match="set static_gpus to a new list"):
        first.static_gpus.append({"uuid": "GPU-c", "name": "Tesla T4"})
    assert STATIC[-1]["uuid"] == "GPU-b" and len(second.static_gpus) == 2  # (nor the list configured)
    config.GPUSimpleLocalProcessSpawner.static_gpus = [*STATIC, {"uuid": "GPU-c", "name": "Tesla T4"}]
    third = GPUSimpleLocalProcessSpawner(config=config)  # a new list: a hub state of its own
    assert len(third.static_gpus) == 3 and third.hub_state is not first.hub_state


def test_a_hub_handler_finds_its_hub_state_once(monkeypatch):
    """Finding the state reads the GPU settings from the configuration (0.25 s with 10,000 static GPUs):
    once per hub, not once per request."""
    import gpuspawner.state

    config = static_config()
    settings = {"config": config, "spawner_class": GPUSimpleLocalProcessSpawner, "app": Application(config=config)}
    first = hub_state_of_app(settings)

    def read_again(*args, **kwargs):
        raise AssertionError("the GPU settings were read again")

    monkeypatch.setattr(gpuspawner.state, "settings_for", read_again)
    assert hub_state_of_app(settings) is first


@pytest.mark.parametrize("bad", ["", "two words", "a/b", "-x"])
def test_a_hub_id_that_cannot_name_labels_and_folders_is_refused_at_configuration(bad):
    config = static_config()
    config.GPUSpawnerMixin.gpu_hub_id = bad
    with pytest.raises(Exception, match="gpu_hub_id must be letters, digits, '.', '_' or '-'"):
        GPUSimpleLocalProcessSpawner(config=config)


def test_metrics_are_served_for_the_newest_state_only():
    def gpus_total() -> float:
        return sum(s.value for m in REGISTRY.collect() if m.name == "gpuspawner_gpus"
                   for s in m.samples if s.labels.get("state") == "total")

    state = hub_state(static_config(), GPUSimpleLocalProcessSpawner)
    state.inventory.read_now()
    assert gpus_total() == 2
    newer = hub_state(static_config(), GPUSimpleLocalProcessSpawner)  # a second hub in this process
    assert gpus_total() == 0  # the old one is no longer served, the new one has read nothing yet
    newer.inventory.read_now()
    assert gpus_total() == 2


def test_nothing_registers_on_import_and_hub_handlers_do_not_import_backends():
    code = (
        "import sys\n"
        "from prometheus_client import REGISTRY\n"
        "import gpuspawner.hub.handlers, gpuspawner.hub.setup, gpuspawner.metrics, gpuspawner.state\n"
        "names = {m.name for m in REGISTRY.collect()}\n"
        "assert not any(n.startswith('gpuspawner') for n in names), names\n"
        "assert not any(m.startswith('gpuspawner.spawners') for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith('gpuspawner.spawners'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_metrics_count_gpus_as_the_form_does():
    config = Config()
    config.GPUSpawnerMixin.gpu_inventory = "static"
    config.GPUSpawnerMixin.static_gpus = [
        {"uuid": "GPU-a", "name": "Tesla T4", "host": "h1"},
        {"uuid": "GPU-b", "name": "Tesla T4", "host": "h1"},
        {"uuid": "GPU-c", "name": "Tesla T4", "host": "h1", "healthy": False, "reason": "GPU is lost"},
    ]
    state = hub_state(config, GPUSimpleLocalProcessSpawner)
    state.inventory.read_now()
    state.ledger.adopt("ada/", ["GPU-a"])
    samples = {s.labels["state"]: s.value for m in REGISTRY.collect() if m.name == "gpuspawner_gpus"
               for s in m.samples if s.labels["model"] == "t4"}
    assert samples == {"total": 2, "allocated": 1, "free": 1, "unavailable": 1}
