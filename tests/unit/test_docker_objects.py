"""Docker backend's pure parts: labels <-> allocation, device requests, reconciliation."""

from hypothesis import given, strategies as st

from gpuspawner.backends.docker.objects import (
    allocation_from_labels,
    allocation_labels,
    device_request,
    other_gpu_access,
    reconcile,
    visible_devices_env,
)
from gpuspawner.backends.docker.spawner import add_gpus_to_create_kwargs
from gpuspawner.gpu import GPU

GPUS = tuple(GPU("host1", i, f"GPU-{i:04d}", "NVIDIA A100-SXM4-80GB") for i in range(8))


def container(owner, gpus, state="running", hub="hub1", created=0, name=None):
    return {
        "Id": f"id-{owner}-{created}", "Names": [f"/{name or owner}"], "State": state,
        "Created": created, "Labels": allocation_labels(hub, owner, gpus),
    }


def test_labels_round_trip():
    labels = allocation_labels("hub1", "alice/", GPUS[2:4])
    assert all(isinstance(v, str) for v in labels.values())
    allocation = allocation_from_labels(labels)
    assert allocation.owner == "alice/" and allocation.hub == "hub1"
    assert allocation.uuids == ("GPU-0002", "GPU-0003")
    assert [(g.host, g.index, g.name) for g in allocation.gpus] == [
        ("host1", 2, "NVIDIA A100-SXM4-80GB"), ("host1", 3, "NVIDIA A100-SXM4-80GB")]


def test_foreign_or_damaged_labels_are_not_ours():
    assert allocation_from_labels({}) is None
    assert allocation_from_labels({"org.gpuspawner.owner": "x/"}) is None
    damaged = allocation_labels("hub1", "bob/", GPUS[:2])
    damaged["org.gpuspawner.gpu-indexes"] = "0"
    assert allocation_from_labels(damaged).uuids == ("GPU-0000", "GPU-0001")


def test_device_request_names_uuids_never_a_count():
    request = device_request(["GPU-0003", "GPU-0001"], ("compute", "utility"))
    assert request == {"Driver": "nvidia", "DeviceIDs": ["GPU-0003", "GPU-0001"],
                       "Capabilities": [["compute", "utility"]]}
    assert "Count" not in request
    assert device_request([], ("compute",)) is None


def test_visible_devices_env():
    assert visible_devices_env(["GPU-a", "GPU-b"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert visible_devices_env([]) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_create_kwargs_drop_configured_gpu_requests():
    kwargs = {"image": "x", "labels": {"team": "a"},
              "host_config": {"DeviceRequests": [{"Driver": "nvidia", "Count": -1}, {"Driver": "other"}]}}
    request = device_request(["GPU-0001"], ("compute",))
    new, dropped = add_gpus_to_create_kwargs(kwargs, {"org.gpuspawner.owner": "a/"}, request)
    assert new["labels"] == {"team": "a", "org.gpuspawner.owner": "a/"}
    assert new["host_config"]["DeviceRequests"] == [{"Driver": "other"}, request]
    assert dropped == [{"Driver": "nvidia", "Count": -1}]
    assert kwargs["host_config"]["DeviceRequests"][0]["Count"] == -1  # input untouched
    cpu, _ = add_gpus_to_create_kwargs({"host_config": {}}, {}, None)
    assert "DeviceRequests" not in cpu["host_config"]


def test_reconcile_running_containers_hold_exited_do_not():
    containers = [
        container("alice/", GPUS[0:2]),
        container("bob/", GPUS[2:4], state="exited"),
        container("carol/", GPUS[4:5], state="created"),
        container("dan/", GPUS[5:6], hub="other-hub"),
        {"Id": "x", "Names": ["/unrelated"], "State": "running", "Labels": {}},
        container("erin/", ()),  # CPU only
    ]
    ledger = {"bob/": ("GPU-0002", "GPU-0003"), "alice/": ("GPU-0000",)}
    plan = reconcile("hub1", containers, ledger)
    assert plan.holdings == {"alice/": ("GPU-0000", "GPU-0001")}
    assert plan.release == ("bob/",)
    assert plan.conflicts == ()


def test_reconcile_conflict_older_container_keeps_the_gpu():
    containers = [
        container("late/", GPUS[1:3], created=20),
        container("early/", GPUS[0:2], created=10),
    ]
    plan = reconcile("hub1", containers, {})
    assert plan.holdings == {"early/": ("GPU-0000", "GPU-0001"), "late/": ("GPU-0002",)}
    assert len(plan.conflicts) == 1 and "GPU-0001" in plan.conflicts[0]


@given(st.lists(st.tuples(st.sampled_from(["running", "exited", "created", "dead"]),
                          st.sets(st.integers(0, 7), max_size=3), st.integers(0, 5)), max_size=12))
def test_reconcile_never_gives_a_gpu_twice(specs):
    containers = [container(f"user{n}/", tuple(GPUS[i] for i in sorted(ids)), state=state, created=created)
                  for n, (state, ids, created) in enumerate(specs)]
    plan = reconcile("hub1", containers, {})
    held = [u for uuids in plan.holdings.values() for u in uuids]
    assert len(held) == len(set(held))
    running = {u for (state, ids, _), in zip(specs) if state == "running" for u in (f"GPU-{i:04d}" for i in ids)}
    assert set(held) == running


def test_other_gpu_access_names_every_way_to_more_gpus():
    """What DockerSpawner's configuration may hold that would reach GPUs besides the placed ones."""
    assert other_gpu_access(None) == []
    assert other_gpu_access({"mem_limit": "2G", "device_requests": [{"Driver": "other"}],
                             "devices": ["/dev/fuse:/dev/fuse"]}, {"LANG": "C"}) == []
    found = other_gpu_access({
        "device_requests": [{"Driver": "nvidia", "Count": -1}, {"Driver": "", "Count": 2, "Capabilities": [["gpu"]]}],
        "devices": ["/dev/nvidia0:/dev/nvidia0:rwm", {"PathOnHost": "/dev/nvidiactl"}],
    }, ["NVIDIA_VISIBLE_DEVICES=all", "LANG=C"])
    assert found == [
        "the GPU device request {'Driver': 'nvidia', 'Count': -1}",
        "the GPU device request {'Driver': '', 'Count': 2, 'Capabilities': [['gpu']]}",
        "the device /dev/nvidia0", "the device /dev/nvidiactl", "NVIDIA_VISIBLE_DEVICES=all",
    ]
    # the API's spelling, as DockerSpawner hands it to create_container
    assert other_gpu_access({"DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": ["GPU-1"]}]}) != []
    # gpu-docker's own value of NVIDIA_VISIBLE_DEVICES is no finding; any other is
    assert other_gpu_access(None, {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, ours="GPU-1") == []
    assert other_gpu_access(None, {"NVIDIA_VISIBLE_DEVICES": "all"}, ours="GPU-1") == ["NVIDIA_VISIBLE_DEVICES=all"]
