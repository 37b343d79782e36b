"""gpu-swarm's pure pieces: node GPUs, the service's reservation, a task's GPUs, waiting words."""

from __future__ import annotations

from gpuspawner.backends.swarm.objects import (
    MODEL_LABEL,
    add_gpu_reservation,
    gpu_reservations,
    missing_image,
    node_gpus,
    start_failure,
    task_gpus,
    template_gpu_reservations,
    waiting_words,
)


def node(state="ready", availability="active", model="NVIDIA A100-SXM4-80GB", uuids=("GPU-a", "GPU-b")):
    return {
        "ID": "n1",
        "Status": {"State": state},
        "Spec": {"Availability": availability, "Labels": {MODEL_LABEL: model}},
        "Description": {"Hostname": "gpu1", "Resources": {"GenericResources": [
            *({"NamedResourceSpec": {"Kind": "NVIDIA-GPU", "Value": u}} for u in uuids),
            {"DiscreteResourceSpec": {"Kind": "SSD", "Value": 1}},
        ]}},
    }


def test_node_gpus_come_from_ready_active_nodes_named_by_their_label():
    gpus = node_gpus([node(), node(state="down", uuids=("GPU-x",)), node(availability="drain", uuids=("GPU-y",))])
    assert [(g.uuid, g.name, g.host, g.index, g.model) for g in gpus] == [
        ("GPU-a", "NVIDIA A100-SXM4-80GB", "gpu1", 0, "a100-sxm4-80gb"),
        ("GPU-b", "NVIDIA A100-SXM4-80GB", "gpu1", 1, "a100-sxm4-80gb"),
    ]


def test_reservation_and_constraint_replace_configured_ones():
    template = {"ContainerSpec": {"Image": "x"},
                "Resources": {"Reservations": {"GenericResources": [
                    {"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 8}},
                    {"DiscreteResourceSpec": {"Kind": "SSD", "Value": 1}}]}},
                "Placement": {"Constraints": ["node.role==worker", f"node.labels.{MODEL_LABEL}==Tesla T4"]}}
    out = add_gpu_reservation(template, 2, "NVIDIA A100-SXM4-80GB")
    assert out["Resources"]["Reservations"]["GenericResources"] == [
        {"DiscreteResourceSpec": {"Kind": "SSD", "Value": 1}},
        {"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 2}},
    ]
    assert out["Placement"]["Constraints"] == ["node.role==worker", f"node.labels.{MODEL_LABEL}==NVIDIA A100-SXM4-80GB"]
    cpu = add_gpu_reservation(template, 0, None)
    ssd = {"DiscreteResourceSpec": {"Kind": "SSD", "Value": 1}}
    assert cpu["Resources"]["Reservations"]["GenericResources"] == [ssd]


def test_task_gpus_and_waiting_words():
    task = {"Status": {"State": "running"}, "GenericResources": [
        {"NamedResourceSpec": {"Kind": "NVIDIA-GPU", "Value": "GPU-a"}},
        {"NamedResourceSpec": {"Kind": "OTHER", "Value": "z"}}]}
    assert task_gpus(task) == ("GPU-a",)
    assert task_gpus({"Status": {"State": "pending"}}) == ()
    assert waiting_words(task, 1, "A100") is None
    pending = {"Status": {"State": "pending", "Err": "no suitable node (insufficient resources on 1 node)"}}
    assert waiting_words(pending, 2, "NVIDIA A100-SXM4-80GB") == (
        "Waiting for a node with 2 free NVIDIA A100-SXM4-80GB GPU(s): every such GPU is in use "
        "(Swarm: no suitable node (insufficient resources on 1 node))"
    )
    err = "no suitable node (scheduling constraints not satisfied on 1 node)"
    unplaced = {"Status": {"State": "pending", "Err": err}}
    assert waiting_words(unplaced, 1, "Tesla T4").startswith("Waiting: no Swarm node offers Tesla T4 GPUs right now")


def test_start_failure_is_swarms_reason_for_a_rejected_or_failed_task():
    hook = ("starting container failed: error running hook #0: exit status 1, stderr: "
            "nvidia-container-cli: device error: GPU-1: unknown device")
    assert start_failure({"Status": {"State": "rejected", "Err": hook}}) == hook
    assert start_failure({"Status": {"State": "failed", "Message": "started"}}) == "started"
    for state in ("pending", "running", "shutdown", "complete"):
        assert start_failure({"Status": {"State": state, "Err": "no suitable node"}}) is None


def test_gpu_reservations_in_either_spelling():
    from docker.types import Resources

    assert gpu_reservations({"NVIDIA-GPU": 2, "FPGA": 1}) == ["NVIDIA-GPU=2"]
    assert gpu_reservations([{"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 1}},
                             {"NamedResourceSpec": {"Kind": "SSD", "Value": "a"}}]) == ["NVIDIA-GPU=1"]
    assert gpu_reservations(None) == [] and gpu_reservations({"FPGA": 1}) == []
    template = {"Resources": dict(Resources(generic_resources={"NVIDIA-GPU": 3}))}
    assert template_gpu_reservations(template) == ["NVIDIA-GPU=3"]
    assert template_gpu_reservations({"ContainerSpec": {}}) == []


def test_missing_image_words():
    assert missing_image("No such image: team/nb:1")
    assert missing_image("pull access denied for team/nb, repository does not exist or may require 'docker login'")
    assert not missing_image("starting container failed: unknown device GPU-1")
