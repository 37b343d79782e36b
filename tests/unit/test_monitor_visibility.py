"""Which GPUs a server may show, from CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (pure)."""

import json

import pytest

import fakenvml
from gpuspawner.monitor.visibility import (
    CUDA_HIDDEN_BY_MIG,
    CUDA_INDEX_WITH_MIG,
    CUDA_MIG_BY_GPU,
    CUDA_MIG_PARENT,
    CUDA_ONE_MIG,
    CUDA_ORDER_UNKNOWN,
    Device,
    Visibility,
    parse,
)

G = [f"GPU-{i}aaaaaaa-0000-4000-8000-00000000000{i}" for i in range(4)]
M = [f"MIG-{i}bbbbbbb-0000-4000-8000-00000000000{i}" for i in range(3)]
DEVICES = [Device(0, G[0]), Device(1, G[1], (M[0], M[1], M[2])), Device(2, G[2]), Device(3, G[3])]
NO_MIG = [Device(i, G[i], name="NVIDIA A100-SXM4-80GB") for i in range(4)]


def shown(env, devices=DEVICES):
    decisions = Visibility.from_env(env).decide(devices)
    return [(d.index, dec.mig_uuids, dec.cuda_index) for d, dec in zip(devices, decisions, strict=True) if dec.visible]


def test_unset_and_all_show_everything():
    assert [i for i, _, _ in shown({})] == [0, 1, 2, 3]
    assert [i for i, _, _ in shown({"NVIDIA_VISIBLE_DEVICES": "all"})] == [0, 1, 2, 3]
    # "all" is the container runtime's word; CUDA cannot read it and enumerates nothing (recorded)
    assert shown({"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "all"}) == []


# Every CUDA_VISIBLE_DEVICES value tried on a real GPU host, with the GPUs libcuda then enumerated
# (benchmarks/real_gpu_probe.py, section cuda_visible_devices).
RECORDED_CUDA = [
    (recording.stem, case)
    for recording in sorted(fakenvml.RECORDED.glob("*.json"))
    for case in json.loads(recording.read_text()).get("cuda_visible_devices", [])
]


@pytest.mark.parametrize("host, case", RECORDED_CUDA, ids=[f"{h}:{c['value']!r}" for h, c in RECORDED_CUDA])
def test_the_gpus_shown_are_the_ones_cuda_enumerated_on_a_real_host(host, case):
    recording = json.loads((fakenvml.RECORDED / f"{host}.json").read_text())
    listed = recording["gpuspawner"]["devices"]["devices"]
    devices = [Device(d["index"], d["uuid"][0], (), False, d["name"][0]) for d in listed]
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if case["value"] is not None:
        env["CUDA_VISIBLE_DEVICES"] = case["value"]
    decisions = Visibility.from_env(env).decide(devices)
    shown_by_monitor = {d.uuid: dec.cuda_index for d, dec in zip(devices, decisions, strict=True) if dec.visible}
    enumerated = case["cuda"]["uuids"]
    assert shown_by_monitor == {uuid: n for n, uuid in enumerate(enumerated)}


def test_cuda_counts_entries_up_to_the_first_that_names_no_gpu():
    assert shown({"CUDA_VISIBLE_DEVICES": "2,7,1"}, NO_MIG) == [(2, None, 0)]  # no GPU 7: 1 does not count
    assert shown({"CUDA_VISIBLE_DEVICES": f"{G[1]},GPU-ffffffff,{G[2]}"}, NO_MIG) == [(1, None, 0)]
    assert shown({"CUDA_VISIBLE_DEVICES": "-1,0"}, NO_MIG) == []


def test_a_gpu_named_twice_the_same_way_stops_cuda():
    assert shown({"CUDA_VISIBLE_DEVICES": "1,1"}, NO_MIG) == []
    assert shown({"CUDA_VISIBLE_DEVICES": f"{G[1]},2,{G[1][:12]}"}, NO_MIG) == []
    assert shown({"CUDA_VISIBLE_DEVICES": f"{G[1]},1,2"}, NO_MIG) == [(1, None, 0), (2, None, 1)]  # UUID, then index


def test_an_entry_starting_with_digits_is_that_index():
    assert shown({"CUDA_VISIBLE_DEVICES": "3:1, 0"}, NO_MIG) == [(0, None, 1), (3, None, 0)]


@pytest.mark.parametrize("value", ["", "none", "void", "NONE", " "])
@pytest.mark.parametrize("variable", ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"])
def test_nothing(variable, value):
    assert shown({variable: value}) == []


def test_uuids_in_nvml_order_with_cuda_numbers_in_listed_order():
    env = {"CUDA_VISIBLE_DEVICES": f"{G[3]},{G[0]}", "NVIDIA_VISIBLE_DEVICES": f"{G[3]},{G[0]}"}
    assert shown(env) == [(0, None, 1), (3, None, 0)]


def test_uuid_prefix_as_cuda_accepts():
    assert [i for i, _, _ in shown({"CUDA_VISIBLE_DEVICES": G[2][:12]})] == [2]


def test_indexes():
    assert shown({"CUDA_VISIBLE_DEVICES": "2,0"}, NO_MIG) == [(0, None, 1), (2, None, 0)]


def test_cuda_indexes_count_the_gpus_this_process_may_open():
    # Under a device cgroup (Slurm's ConstrainDevices) the job may open only host GPUs 1 and 3, and
    # Slurm sets CUDA_VISIBLE_DEVICES=0,1 relative to them, as CUDA enumerates only those.
    openable = [Device(1, G[1], ordinal=0), Device(3, G[3], ordinal=1)]
    assert shown({"CUDA_VISIBLE_DEVICES": "1"}, openable) == [(3, None, 0)]
    assert shown({"CUDA_VISIBLE_DEVICES": "0,1"}, openable) == [(1, None, 0), (3, None, 1)]
    # NVIDIA_VISIBLE_DEVICES indexes stay host indexes
    assert shown({"NVIDIA_VISIBLE_DEVICES": "3"}, openable) == [(3, None, 0)]


def test_indexes_with_a_gpu_in_mig_mode_leave_cuda_numbers_unknown():
    # CUDA lists GPUs in MIG mode after the others, so its indexes are not NVML's
    decisions = Visibility.from_env({"CUDA_VISIBLE_DEVICES": "2,0"}).decide(DEVICES)
    assert [(d.cuda_index, d.cuda_reason) for d in decisions if d.visible] == [(None, CUDA_INDEX_WITH_MIG)] * 2


def test_cuda_stops_at_the_first_entry_it_cannot_read():
    assert [i for i, _, _ in shown({"CUDA_VISIBLE_DEVICES": "1,bogus,2"})] == [1]
    assert shown({"CUDA_VISIBLE_DEVICES": "bogus,2"}) == []
    assert parse("CUDA_VISIBLE_DEVICES", "0,x,1").entries == ("0",)
    assert parse("NVIDIA_VISIBLE_DEVICES", "0,x,1").entries == ("0", "1")


def test_mig_uuid_shows_its_gpu_with_only_that_instance():
    assert shown({"CUDA_VISIBLE_DEVICES": M[1]}) == [(1, (M[1],), None)]
    assert shown({"NVIDIA_VISIBLE_DEVICES": f"{M[2]},{M[0]}", "CUDA_VISIBLE_DEVICES": f"{M[2]},{M[0]}"}) == [
        (1, (M[0], M[2]), None)]


def test_one_mig_device_is_cuda_0_and_hides_every_other_device():
    """A GPU not in MIG mode and one in MIG mode, both visible: CUDA has one device, a MIG device."""
    h100 = Device(0, G[0], name="NVIDIA H100 80GB HBM3")
    a100 = Device(1, G[1], (M[0], M[1]), mig_mode=True, name="NVIDIA A100-SXM4-80GB")
    for env in ({}, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, {"CUDA_VISIBLE_DEVICES": f"{G[0]},{M[1]},{M[0]}"}):
        gpu, mig = Visibility.from_env(env).decide([h100, a100])
        assert (gpu.cuda_index, gpu.cuda_reason) == (None, CUDA_HIDDEN_BY_MIG), env
        assert (mig.cuda_index, mig.cuda_reason) == (None, CUDA_MIG_PARENT)
        first = M[1] if "CUDA_VISIBLE_DEVICES" in env else M[0]  # listed first, else NVML's first
        other = M[0] if first == M[1] else M[1]
        assert mig.mig_cuda == {M[0]: 0 if first == M[0] else None, M[1]: 0 if first == M[1] else None}
        assert mig.mig_cuda_reasons == {other: CUDA_ONE_MIG}


def test_a_gpu_in_mig_mode_without_mig_devices_is_not_a_cuda_device():
    devices = [Device(0, G[0], mig_mode=True), Device(1, G[1])]
    gpu0, gpu1 = Visibility.from_env({}).decide(devices)
    assert (gpu0.cuda_index, gpu0.cuda_reason) == (None, CUDA_MIG_PARENT)
    assert (gpu1.cuda_index, gpu1.cuda_reason) == (0, None)


def test_a_mig_mode_gpu_named_by_its_gpu_uuid_leaves_cuda_numbers_unknown():
    devices = [Device(0, G[0]), Device(1, G[1], (M[0],), mig_mode=True)]
    gpu0, gpu1 = Visibility.from_env({"CUDA_VISIBLE_DEVICES": f"{G[1]},{G[0]}"}).decide(devices)
    assert (gpu0.cuda_index, gpu0.cuda_reason) == (None, CUDA_MIG_BY_GPU)
    assert gpu1.mig_cuda == {M[0]: None} and gpu1.mig_cuda_reasons == {M[0]: CUDA_MIG_BY_GPU}


def test_unset_order_is_known_for_identical_gpus_or_pci_bus_order():
    mixed = [Device(0, G[0], name="NVIDIA H100 80GB HBM3"), Device(1, G[1], name="Tesla T4")]
    assert [(d.cuda_index, d.cuda_reason) for d in Visibility.from_env({}).decide(mixed)] == [
        (None, CUDA_ORDER_UNKNOWN)] * 2
    assert [d.cuda_index for d in Visibility.from_env({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).decide(mixed)] == [0, 1]
    assert [d.cuda_index for d in Visibility.from_env({}).decide(NO_MIG)] == [0, 1, 2, 3]


def test_mig_index_pair_on_a_host():
    assert shown({"NVIDIA_VISIBLE_DEVICES": "1:2"}) == [(1, (M[2],), None)]


def test_both_variables_must_allow_a_gpu():
    env = {"NVIDIA_VISIBLE_DEVICES": f"{G[0]},{G[1]}", "CUDA_VISIBLE_DEVICES": f"{G[1]},{G[2]}"}
    assert [i for i, _, _ in shown(env)] == [1]
    env = {"NVIDIA_VISIBLE_DEVICES": M[0], "CUDA_VISIBLE_DEVICES": M[1]}
    assert shown(env) == []


def test_nvidia_host_indexes_are_not_reapplied_inside_a_container():
    # the runtime mounted host GPUs 5 and 7; NVML in the container numbers them 0 and 1
    container = [Device(0, G[0]), Device(1, G[1])]
    assert [i for i, _, _ in shown({"NVIDIA_VISIBLE_DEVICES": "5,7"}, container)] == [0, 1]
    # on a host with 4 GPUs, "1,3" selects host GPUs 1 and 3
    assert [i for i, _, _ in shown({"NVIDIA_VISIBLE_DEVICES": "1,3"})] == [1, 3]


def test_a_gpu_without_uuid_is_hidden_under_a_uuid_restriction():
    devices = [Device(0, None), Device(1, G[1])]
    assert [i for i, _, _ in shown({"CUDA_VISIBLE_DEVICES": G[1]}, devices)] == [1]
    assert [i for i, _, _ in shown({}, devices)] == [0, 1]


def test_describe_names_the_values():
    text = Visibility.from_env({"CUDA_VISIBLE_DEVICES": ""}).describe()
    assert text == "CUDA_VISIBLE_DEVICES='', NVIDIA_VISIBLE_DEVICES unset"
