"""GPU health's configuration (which XIDs count), the REST body, and what is out of service when."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.gpu import GPU
from gpuspawner.health import (
    DEFAULT_IGNORED_XIDS,
    GPUHealthSettings,
    HealthInventory,
    HealthTracker,
    health_settings,
    parse_health_body,
    xid_reason,
)
from gpuspawner.inventory import InventoryReading
from gpuspawner.state import GPUHubSettings

A100 = "NVIDIA A100-SXM4-80GB"
XIDS = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=100, deadline=None)
@given(xid=XIDS)
def test_by_default_only_the_device_plugins_xids_are_ignored(xid):
    tracker = HealthTracker()
    assert tracker.counts(xid) is (xid not in (13, 31, 43, 45, 68, 109))
    assert (tracker.xid("GPU-a", xid) is None) is (xid in DEFAULT_IGNORED_XIDS)
    assert ("GPU-a" in tracker.outages()) is (xid not in DEFAULT_IGNORED_XIDS)


@settings(max_examples=100, deadline=None)
@given(xids=st.lists(XIDS, max_size=8))
def test_any_list_of_xids_may_be_ignored(xids):
    found = GPUHealthSettings(config=Config({"GPUHealthSettings": {"gpu_health_ignored_xids": xids}}))
    assert found.gpu_health_ignored_xids == sorted(set(xids))


@settings(max_examples=60, deadline=None)
@given(good=st.lists(XIDS, max_size=3),
       bad=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32), st.text(max_size=3), st.none()))
def test_a_list_with_anything_but_an_xid_is_refused_naming_the_setting(good, bad):
    with pytest.raises(TraitError, match="gpu_health_ignored_xids"):
        GPUHealthSettings(config=Config({"GPUHealthSettings": {"gpu_health_ignored_xids": [*good, bad]}}))


@pytest.mark.parametrize("name, value", [("gpu_health_poll_interval", 0), ("gpu_health_poll_interval", float("nan")),
                                         ("gpu_health_auto_return", -1), ("gpu_health_auto_return", float("inf"))])
def test_seconds_out_of_range_are_refused_naming_the_setting(name, value):
    with pytest.raises(TraitError, match=name):
        GPUHealthSettings(config=Config({"GPUHealthSettings": {name: value}}))


@pytest.mark.filterwarnings("ignore:Config option")  # the hub settings' own class knows no health setting
def test_the_hub_reads_the_health_settings_where_the_spawners_do():
    config = Config({"GPUSpawnerMixin": {"gpu_health_ignored_xids": [79], "gpu_health_poll_interval": 2.0}})

    class Hub(GPUHubSettings):
        @classmethod
        def section_names(cls):
            return ["GPUSpawnerMixin", "GPUHubSettings"]

    found = health_settings(Hub(config=config))
    assert found.gpu_health_ignored_xids == [79] and found.gpu_health_poll_interval == 2.0


# ------------------------------------------------------------------ the REST body

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(body=st.one_of(JSON, st.dictionaries(st.sampled_from(["healthy", "reason", "x"]), JSON, max_size=3)))
def test_any_body_is_either_understood_or_refused_with_a_sentence(body):
    try:
        healthy, reason = parse_health_body(json.dumps(body).encode())
    except ValueError as e:
        assert str(e).endswith(".") and '"' in str(e)
        return
    assert body["healthy"] is healthy and set(body) <= {"healthy", "reason"}
    assert reason is None if healthy else reason == body["reason"].strip() and reason


@pytest.mark.parametrize("body, message", [
    (b"", '"healthy" must be true'),
    (b"\xff", "The body must be JSON"),
    (b"[true]", "a JSON object"),
    (b'{"healthy": 1}', '"healthy" must be true'),
    (b'{"healthy": true, "reason": "x"}', '"reason" goes with'),
    (b'{"healthy": false}', 'needs a "reason"'),
    (b'{"healthy": false, "reason": "' + b"x" * 201 + b'"}', "1 to 200"),
    (b'{"healthy": true, "force": true}', "Unknown field 'force'"),
])
def test_bad_bodies_say_what_is_wrong(body, message):
    with pytest.raises(ValueError, match=message):
        parse_health_body(body)


def test_good_bodies():
    assert parse_health_body(b'{"healthy": true}') == (True, None)
    assert parse_health_body(b'{"healthy": false, "reason": " fan noise "}') == (False, "fan noise")


# ------------------------------------------------------------------ out of service, and back


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def test_a_gpu_comes_back_when_its_condition_has_cleared_and_an_admin_confirms():
    clock, changes = Clock(), []
    tracker = HealthTracker(clock=clock)
    tracker.listeners.append(lambda out, back: changes.append(([o.uuid for o in out], list(back))))
    tracker.observe("GPU-a", ("row remapping pending: the GPU needs a reset",))
    clock.now += 5
    tracker.xid("GPU-a", 79)  # already out: keeps its first reason and time
    outage = tracker.get("GPU-a")
    assert (outage.reason, outage.since, outage.cleared) == ("row remapping pending: the GPU needs a reset", 1000, None)
    with pytest.raises(ValueError, match="still unhealthy: row remapping pending"):
        tracker.bring_back("GPU-a")
    tracker.observe("GPU-a", ())
    assert tracker.get("GPU-a").cleared == 1005
    assert tracker.return_cleared() == ()  # no auto return by default
    tracker.bring_back("GPU-a")
    assert tracker.outages() == {}
    with pytest.raises(KeyError):
        tracker.bring_back("GPU-a")
    assert changes == [(["GPU-a"], []), ([], ["GPU-a"])]


def test_auto_return_brings_back_a_cleared_gpu_but_never_one_an_admin_took_out():
    clock = Clock()
    tracker = HealthTracker(auto_return=60, clock=clock)
    tracker.xid("GPU-a", 48)
    tracker.failed("GPU-b", "taken out by an administrator: fan noise", manual=True)
    tracker.observe("GPU-a", ())
    tracker.observe("GPU-b", ())
    clock.now += 59
    assert tracker.return_cleared() == ()
    clock.now += 1
    assert tracker.return_cleared() == ("GPU-a",)
    assert list(tracker.outages()) == ["GPU-b"]
    tracker.bring_back("GPU-b")  # an administrator's own outage needs no clearing


def test_readings_mark_gpus_out_of_service_and_keep_one_that_vanished():
    a, b = GPU("h", 0, "GPU-a", A100), GPU("h", 1, "GPU-b", A100)

    class Source:
        gpus = (a, b)

        def read(self):
            return InventoryReading(self.gpus)

    source, tracker = Source(), HealthTracker()
    inventory = HealthInventory(source, tracker)
    assert inventory.read().gpus == (a, b)
    tracker.xid("GPU-b", 79)
    source.gpus = (a,)  # fallen off the bus: NVML no longer names it
    marked = inventory.read().gpus
    assert [(g.uuid, g.healthy, g.reason) for g in marked] == [
        ("GPU-a", True, None), ("GPU-b", False, xid_reason(79))]
    assert xid_reason(79) == "XID 79 (GPU has fallen off the bus)" and xid_reason(1) == "XID 1"
