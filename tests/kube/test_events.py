"""Scheduling and kubelet events in plain words, and through KubeSpawner's progress()."""

from __future__ import annotations

import json

from gpuspawner.backends.kube.events import EventContext, explain_event, explain_scheduling
from kubefixtures import FIXTURES, progress_until, start_task
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


def test_recorded_events_in_words():
    """A pod's events as a cluster recorded them (tests/kube/fixtures/events.json), and the older releases'
    wording of the same (v1.20's "node affinity", "had taint ... the pod didn't tolerate"; "Container started")."""
    events = json.loads((FIXTURES / "events.json").read_text())["items"]
    words = [explain_event(event, A100_CTX) for event in events]
    assert words[0].startswith("Waiting for a free NVIDIA-A100-SXM4-80GB: of 5 nodes, 2 have too few free right now;")
    assert words[1:] == ["Placed on gpu-a100-1; the NVIDIA device plugin gives your server 1 x NVIDIA-A100-SXM4-80GB.",
                         "Downloading ghcr.io/example/torch:2.3 (the first time on a node can take minutes).",
                         None]  # "Created container notebook": KubeSpawner's own wording kept
    old = ("0/5 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) had taint "
           "{node-role.kubernetes.io/master: }, that the pod didn't tolerate, 2 node(s) didn't match node selector.")
    assert explain_scheduling(old, A100_CTX) == (
        "Waiting for a free NVIDIA-A100-SXM4-80GB: of 5 nodes, 2 have too few free right now; 1 is reserved for "
        "other work; 2 have another GPU model. Your server starts as soon as one is free.")


async def test_progress_says_the_real_schedulers_words(cluster, make_spawner):
    """KubeSpawner's own event reflector reads the real scheduler's events from the API as the hub's
    ServiceAccount; gpu-kube rewords them: waiting while the A100s are held, placed once they are free."""
    spawner = make_spawner(gpu_profiles=PROFILES, events_enabled=True, gpu_inventory_ttl=600)
    await spawner._render_options_form()  # the hub read the cluster: gpu-a100-1 has 2 A100s free
    # a training job takes them before the user presses start (the hub's reading is a minute old)
    cluster.api("POST", f"/api/v1/namespaces/{cluster.namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "training"}, "spec": {
            "nodeName": "gpu-a100-1", "containers": [{"name": "train", "image": TORCH,
                                                      "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
    task = await start_task(spawner, {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": TORCH})
    try:
        messages = await progress_until(spawner, "Your server starts as soon as one is free")
        assert messages[0] == "Checking the cluster for 2 GPU(s), a100-sxm4-80gb"
        assert messages[1] == "Asking Kubernetes for 2 x NVIDIA-A100-SXM4-80GB (nvidia.com/gpu)"
        assert messages[-1] == ("Waiting for 2 free NVIDIA-A100-SXM4-80GB GPUs on one node: of 5 nodes, 2 have another "
                                "GPU model; 3 have too few free right now. Your server starts as soon as one is free.")
        cluster.delete_pod("training")  # the job ends: the scheduler binds the server's pod where it was
        messages = await progress_until(spawner, "Placed on")
        assert messages[-1] == ("Placed on gpu-a100-1; the NVIDIA device plugin gives your server 2 x "
                                "NVIDIA-A100-SXM4-80GB.")
        await task
        assert cluster.pod(spawner.pod_name)["spec"]["nodeName"] == "gpu-a100-1"
    finally:
        task.cancel()
        await spawner.stop(now=True)
