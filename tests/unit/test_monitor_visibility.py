"""Which GPUs a server may show, from CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (pure)."""

import pytest

from gpuspawner.monitor.visibility import Device, Visibility, parse

G = [f"GPU-{i}aaaaaaa-0000-4000-8000-00000000000{i}" for i in range(4)]
M = [f"MIG-{i}bbbbbbb-0000-4000-8000-00000000000{i}" for i in range(3)]
DEVICES = [Device(0, G[0]), Device(1, G[1], (M[0], M[1], M[2])), Device(2, G[2]), Device(3, G[3])]


def shown(env, devices=DEVICES):
    decisions = Visibility.from_env(env).decide(devices)
    return [(d.index, dec.mig_uuids, dec.cuda_index) for d, dec in zip(devices, decisions, strict=True) if dec.visible]


def test_unset_and_all_show_everything():
    assert [i for i, _, _ in shown({})] == [0, 1, 2, 3]
    assert [i for i, _, _ in shown({"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "all"})] == [0, 1, 2, 3]


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
    assert shown({"CUDA_VISIBLE_DEVICES": "2,0"}) == [(0, None, 1), (2, None, 0)]


def test_cuda_stops_at_the_first_entry_it_cannot_read():
    assert [i for i, _, _ in shown({"CUDA_VISIBLE_DEVICES": "1,bogus,2"})] == [1]
    assert shown({"CUDA_VISIBLE_DEVICES": "bogus,2"}) == []
    assert parse("CUDA_VISIBLE_DEVICES", "0,x,1").entries == ("0",)
    assert parse("NVIDIA_VISIBLE_DEVICES", "0,x,1").entries == ("0", "1")


def test_mig_uuid_shows_its_gpu_with_only_that_instance():
    assert shown({"CUDA_VISIBLE_DEVICES": M[1]}) == [(1, (M[1],), 0)]
    assert shown({"NVIDIA_VISIBLE_DEVICES": f"{M[2]},{M[0]}"}) == [(1, (M[0], M[2]), 0)]


def test_mig_index_pair_on_a_host():
    assert shown({"NVIDIA_VISIBLE_DEVICES": "1:2"}) == [(1, (M[2],), 0)]


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
