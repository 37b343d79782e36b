"""Tests for the static inventory: GPUs declared in configuration."""

from __future__ import annotations

import dataclasses

import pytest

from gpuspawner.backends.base import GPUSpawnerMixin
from gpuspawner.gpu import GPU
from gpuspawner.inventory import InventoryReading, StaticInventory, gpus_from_config

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"


def refusal(entries) -> str:
    with pytest.raises(ValueError) as info:
        gpus_from_config(entries)
    return str(info.value)


# ==========================================================================
# gpus_from_config: accepted entries
# ==========================================================================


def test_minimal_entries_get_localhost_and_their_position():
    gpus = gpus_from_config([{"uuid": "GPU-a", "name": A100}, {"uuid": "GPU-b", "name": A100}])
    assert gpus == [GPU("localhost", 0, "GPU-a", A100), GPU("localhost", 1, "GPU-b", A100)]
    assert all(g.healthy and g.reason is None for g in gpus)
    assert gpus[0].model == "a100-sxm4-80gb"


def test_index_counts_per_host():
    gpus = gpus_from_config([
        {"uuid": "a0", "name": A100, "host": "node-a"},
        {"uuid": "b0", "name": T4, "host": "node-b"},
        {"uuid": "a1", "name": A100, "host": "node-a"},
        {"uuid": "b1", "name": T4, "host": "node-b"},
        {"uuid": "l0", "name": T4},
    ])
    assert [(g.host, g.index, g.uuid) for g in gpus] == [
        ("node-a", 0, "a0"), ("node-b", 0, "b0"), ("node-a", 1, "a1"), ("node-b", 1, "b1"), ("localhost", 0, "l0"),
    ]


def test_explicit_index_is_kept():
    gpus = gpus_from_config([{"uuid": "x", "name": T4, "index": 3}, {"uuid": "y", "name": T4, "index": 0}])
    assert [g.index for g in gpus] == [3, 0]


def test_all_fields():
    (g,) = gpus_from_config([
        {
            "host": "gpu-node-1",
            "index": 2,
            "uuid": "GPU-1234",
            "name": A100,
            "memory_total": 80 * 2**30,
            "compute_capability": [8, 0],
            "driver_version": "550.54.15",
            "cuda_driver_version": 12040,
            "mig_mode": False,
            "healthy": False,
            "reason": "XID 79: GPU has fallen off the bus",
        }
    ])
    assert g == GPU(
        "gpu-node-1", 2, "GPU-1234", A100, 80 * 2**30, (8, 0), "550.54.15", 12040, False, False,
        "XID 79: GPU has fallen off the bus",
    )
    assert g.compute_capability == (8, 0)  # a JSON list becomes a tuple
    assert g.reason == "XID 79: GPU has fallen off the bus"
    assert g.memory_gib == 80.0
    assert g.to_dict()["compute_capability"] == [8, 0]
    assert g.to_dict()["model"] == "a100-sxm4-80gb"


def test_compute_capability_none_is_kept():
    (g,) = gpus_from_config([{"uuid": "u", "name": T4, "compute_capability": None}])
    assert g.compute_capability is None


def test_empty_and_generator_configs():
    assert gpus_from_config([]) == []
    assert gpus_from_config(()) == []
    gen = ({"uuid": f"u{i}", "name": T4} for i in range(3))
    assert [g.index for g in gpus_from_config(gen)] == [0, 1, 2]


def test_entries_are_not_modified():
    entry = {"uuid": "u", "name": T4, "compute_capability": [7, 5]}
    gpus_from_config([entry])
    assert entry == {"uuid": "u", "name": T4, "compute_capability": [7, 5]}


# ==========================================================================
# gpus_from_config: errors name the entry
# ==========================================================================


@pytest.mark.parametrize("entry, type_name", [
    ("GPU-1", "str"), (["GPU-1", A100], "list"), (None, "NoneType"), (3, "int"),
])
def test_entry_must_be_a_dict(entry, type_name):
    message = refusal([{"uuid": "ok", "name": T4}, entry])
    assert message == f"static GPU entry 1 must be a dict, not {type_name}"


def test_unknown_keys_are_listed():
    message = refusal([{"uuid": "u", "name": T4, "vendor": "nvidia", "model": "t4"}])
    assert message == "static GPU entry 0 has unknown keys: model, vendor"


@pytest.mark.parametrize("key", ["uuid", "name"])
@pytest.mark.parametrize("value", [None, "", 5, ["x"]], ids=repr)
def test_uuid_and_name_must_be_non_empty_strings(key, value):
    entry = {"uuid": "u2", "name": T4, key: value}
    message = refusal([{"uuid": "u1", "name": T4}, entry])
    assert message == f"static GPU entry 1 needs a '{key}' string"


@pytest.mark.parametrize("key", ["uuid", "name"])
def test_uuid_and_name_are_required(key):
    entry = {"uuid": "u", "name": T4}
    del entry[key]
    assert refusal([entry]) == f"static GPU entry 0 needs a '{key}' string"


def test_repeated_uuid_is_refused():
    message = refusal([
        {"uuid": "GPU-1", "name": T4, "host": "a"},
        {"uuid": "GPU-2", "name": T4, "host": "a"},
        {"uuid": "GPU-1", "name": T4, "host": "b"},
    ])
    assert message == "static GPU entry 2 repeats uuid GPU-1"


@pytest.mark.parametrize("index", ["1", None, 1.5], ids=repr)
def test_bad_index_is_a_value_error_naming_the_entry(index):
    message = refusal([{"uuid": "u", "name": T4, "index": index}])
    assert message.startswith("static GPU entry 0")


# ==========================================================================
# StaticInventory.read
# ==========================================================================


def test_read_gives_a_reading_of_the_configured_gpus():
    inventory = StaticInventory([
        {"uuid": "GPU-1", "name": A100, "host": "n1"},
        {"uuid": "GPU-2", "name": A100, "host": "n1", "healthy": False, "reason": "lost"},
        {"uuid": "GPU-3", "name": T4, "host": "n2"},
    ])
    reading = inventory.read()
    assert isinstance(reading, InventoryReading)
    assert reading.gpus == (
        GPU("n1", 0, "GPU-1", A100),
        GPU("n1", 1, "GPU-2", A100, healthy=False, reason="lost"),
        GPU("n2", 0, "GPU-3", T4),
    )
    assert isinstance(reading.gpus, tuple)
    assert reading.problems == ()
    assert reading.simulated is False
    assert [g.uuid for g in reading.healthy] == ["GPU-1", "GPU-3"]


def test_read_is_repeatable():
    inventory = StaticInventory([{"uuid": "GPU-1", "name": T4}])
    assert inventory.read() == inventory.read()


def test_the_configured_list_is_checked_once_then_read_as_the_same_reading(monkeypatch):
    """The hub reads its inventory every few seconds; 10,000 entries took 0.15 s to check and build each time."""
    inventory = StaticInventory([{"uuid": "GPU-1", "name": T4}])
    first = inventory.read()

    def again(entries):
        raise AssertionError("the configured GPUs were checked again")

    monkeypatch.setattr("gpuspawner.inventory.gpus_from_config", again)
    assert inventory.read() is first


def test_read_of_an_empty_inventory():
    reading = StaticInventory().read()
    assert reading == InventoryReading()
    assert reading.gpus == () and reading.healthy == ()


def test_read_reports_bad_configuration():
    with pytest.raises(ValueError, match="static GPU entry 0 needs a 'uuid' string"):
        StaticInventory([{"name": T4}]).read()


def test_static_gpus_help_names_every_key_an_entry_accepts():
    help_text = GPUSpawnerMixin.class_traits()["static_gpus"].help
    assert [f.name for f in dataclasses.fields(GPU) if f"``{f.name}``" not in help_text] == []
