"""Scheduling and kubelet events in plain words, and through KubeSpawner's progress()."""

from __future__ import annotations

import asyncio
import json

from gpuspawner.kube.events import EventContext, explain_event, explain_scheduling
from kubefixtures import EVENTS, FIXTURES
from profiles import A100, PROFILES, TORCH

A100_CTX = EventContext("NVIDIA-A100-SXM4-80GB", 1)


def test_insufficient_gpus_becomes_waiting_for_a_free_model():
    message = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."
    assert explain_scheduling(message, A100_CTX) == (
        "Waiting for a free NVIDIA-A100-SXM4-80GB: of 8 nodes, 8 have too few free right now. "
        "Your server starts as soon as one is free.")


def test_mixed_reasons_with_cuda_and_preemption_tail():
    ctx = EventContext("NVIDIA-A100-SXM4-80GB", 2, cuda=(12, 4))
    message = ("0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
               "{node-role.kubernetes.io/control-plane: }, 3 node(s) didn't match Pod's node affinity/selector. "
               "preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling.")
    assert explain_scheduling(message, ctx) == (
        "Waiting for 2 free NVIDIA-A100-SXM4-80GB GPUs on one node: of 5 nodes, 1 has too few free right now; "
        "1 is reserved for other work; 3 have another GPU model or a driver older than CUDA 12.4. "
        "Your server starts as soon as one is free.")


def test_mig_and_shared_resources():
    ctx = EventContext("MIG 1g.10gb slice of NVIDIA-A100-SXM4-80GB", 1, "nvidia.com/mig-1g.10gb")
    assert explain_scheduling("0/3 nodes are available: 3 Insufficient nvidia.com/mig-1g.10gb.", ctx).startswith(
        "Waiting for a free MIG 1g.10gb slice of NVIDIA-A100-SXM4-80GB: of 3 nodes, 3 have too few")


def test_no_matching_node_is_not_called_waiting():
    message = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    assert explain_scheduling(message, A100_CTX) == (
        "No node can take a NVIDIA-A100-SXM4-80GB yet: of 3 nodes, 3 have another GPU model.")


def test_other_events():
    assert explain_event({"reason": "Scheduled", "message": "Successfully assigned jhub/jupyter-a to gpu-a100-1"},
                         A100_CTX) == (
        "Placed on gpu-a100-1; the NVIDIA device plugin gives your server 1 x NVIDIA-A100-SXM4-80GB.")
    assert explain_event({"reason": "Pulling", "message": 'Pulling image "x/y:1"'}, A100_CTX) == (
        "Downloading x/y:1 (the first time on a node can take minutes).")
    assert explain_event({"reason": "Created", "message": "Created container notebook"}, A100_CTX) is None
    assert explain_event({"reason": "Started", "message": "Started container notebook"}, A100_CTX) == (
        "Server process started (Started container notebook); waiting for it to answer.")
    assert explain_event({"reason": "Started", "message": "Container started"}, A100_CTX) == (
        "Server process started (Container started); waiting for it to answer.")


def test_kueues_events_on_the_pod():
    """As Kueue 0.15.2 records them on a pod of its pod integration: its "Started" is an admission."""
    assert explain_event({"reason": "CreatedWorkload", "message": "Created Workload: jhub/pod-jupyter-zoe-4f1c2"},
                         A100_CTX) == "Kueue took your server into its queue."
    assert explain_event({"reason": "Started", "message": "Admitted by clusterQueue team-a"}, A100_CTX) == (
        "Kueue admitted your server (ClusterQueue team-a); the scheduler places it next.")
    assert explain_scheduling("pod has unbound immediate PersistentVolumeClaims", A100_CTX) is None


async def test_progress_translates_the_pods_events(cluster, make_spawner):
    """KubeSpawner's own event reflector reads the events from the API; gpu-kube rewords them."""
    spawner = make_spawner(gpu_profiles=PROFILES, events_enabled=True)
    events = json.loads((FIXTURES / "events.json").read_text())["items"]
    for event in events:
        text = json.dumps(event).replace('"POD', '"' + spawner.pod_name).replace("/POD", "/" + spawner.pod_name)
        event = json.loads(text)
        cluster.handler.objects[EVENTS, "jhub", event["metadata"]["name"]] = event
    spawner.user_options = {"profile": "gpu", "gpus": 1, "gpu_model": A100, "image": TORCH}
    await spawner._run_apply_user_options(spawner.user_options)
    await spawner.reserve_gpus()
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    spawner._start_future = done
    messages = []

    async def collect():
        async for event in spawner.progress():
            messages.append(event["message"])

    try:
        await asyncio.wait_for(collect(), 60)
    finally:
        await type(spawner)._stop_all_reflectors()  # KubeSpawner's reflectors are per class
    assert messages[0] == "Checking the cluster for 1 GPU(s), a100-sxm4-80gb"
    assert messages[1] == "Asking Kubernetes for 1 x NVIDIA-A100-SXM4-80GB (nvidia.com/gpu)"
    assert messages[2].startswith(
        "Waiting for a free NVIDIA-A100-SXM4-80GB: of 5 nodes, 2 have too few free right now;")
    assert messages[3] == "Placed on gpu-a100-1; the NVIDIA device plugin gives your server 1 x NVIDIA-A100-SXM4-80GB."
    assert messages[4].startswith("Downloading ghcr.io/example/torch:2.3")
    assert messages[5].endswith("[Normal] Created container notebook")  # KubeSpawner's own wording kept
