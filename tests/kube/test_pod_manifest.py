"""Pod manifests of gpu-kube through KubeSpawner's own get_pod_manifest(), schema-checked.

Each test configures a real GPUKubeSpawner the way a hub does, applies a
user's choice through JupyterHub's apply_user_options path and the spawner's
capacity check (against the recorded cluster on the API test double), then
asks KubeSpawner for the pod and validates it with kubernetes-validate.
"""

from __future__ import annotations

import pytest

from profiles import A100, MIG_1G, NOTEBOOK, PROFILES, SHARED_T4, TORCH, env, gpu_limits, validate_pod

PRODUCT = "nvidia.com/gpu.product"


async def manifest_for(spawner, options: dict) -> dict:
    spawner.user_options = options
    await spawner._run_apply_user_options(options)
    await spawner.reserve_gpus()
    return validate_pod(spawner, await spawner.get_pod_manifest())


async def test_cpu_only_asks_for_no_gpu(make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES)
    pod = await manifest_for(spawner, {"profile": "cpu"})
    assert gpu_limits(pod) == {}
    assert PRODUCT not in (pod["spec"].get("nodeSelector") or {})
    assert "runtimeClassName" not in pod["spec"]
    assert env(pod)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert float(pod["spec"]["containers"][0]["resources"]["limits"]["cpu"]) == 2


async def test_whole_gpus_of_a_model(make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES, gpu_runtime_class="nvidia")
    pod = await manifest_for(spawner, {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": TORCH})
    assert gpu_limits(pod) == {"nvidia.com/gpu": "2"}
    assert pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert pod["spec"]["nodeSelector"][PRODUCT] == "NVIDIA-A100-SXM4-80GB"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["spec"]["containers"][0]["image"] == TORCH
    assert "NVIDIA_VISIBLE_DEVICES" not in env(pod)  # the device plugin sets it to the allocated GPUs
    assert env(pod)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


async def test_any_model_lists_the_models_that_fit(make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES)
    pod = await manifest_for(spawner, {"profile": "gpu", "gpus": 1})
    assert gpu_limits(pod) == {"nvidia.com/gpu": "1"}
    assert pod["spec"]["nodeSelector"][PRODUCT] == "NVIDIA-A100-SXM4-80GB"
    assert pod["spec"]["containers"][0]["image"] == NOTEBOOK  # the profile's first image


async def test_mig_profile(make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES)
    pod = await manifest_for(spawner, {"profile": "mig", "gpus": 1, "gpu_model": MIG_1G})
    assert gpu_limits(pod) == {"nvidia.com/mig-1g.10gb": "1"}
    assert pod["spec"]["nodeSelector"][PRODUCT] == "NVIDIA-A100-SXM4-80GB"


async def test_shared_gpu(make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES)
    pod = await manifest_for(spawner, {"profile": "shared", "gpus": 1, "gpu_model": SHARED_T4})
    assert gpu_limits(pod) == {"nvidia.com/gpu.shared": "1"}
    assert pod["spec"]["nodeSelector"][PRODUCT] == "Tesla-T4"


def required_node_terms(pod: dict) -> list:
    node_affinity = pod["spec"]["affinity"]["nodeAffinity"]
    return node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


async def test_cuda_requirement_becomes_node_affinity(make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES,
                           image_cuda={"ghcr.io/example/torch": "cuda>=12.4 brand=tesla,driver>=470"})
    pod = await manifest_for(spawner, {"profile": "gpu", "gpus": 1, "gpu_model": A100, "image": TORCH})
    terms = required_node_terms(pod)
    assert [t["matchExpressions"] for t in terms] == [
        [{"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["12"]}],
        [{"key": "nvidia.com/cuda.driver.major", "operator": "In", "values": ["12"]},
         {"key": "nvidia.com/cuda.driver.minor", "operator": "Gt", "values": ["3"]}],
    ]
    # An image without a declared requirement gets no CUDA affinity.
    pod = await manifest_for(spawner, {"profile": "gpu", "gpus": 1, "gpu_model": A100, "image": NOTEBOOK})
    assert "affinity" not in pod["spec"]


async def test_admin_affinity_and_gpu_affinity_are_both_required(make_spawner):
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}
    admin_term = {"matchExpressions": [zone]}
    spawner = make_spawner(gpu_profiles=PROFILES, image_cuda={TORCH: "12.2"}, node_affinity_required=[admin_term])
    pod = await manifest_for(spawner, {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": TORCH})
    terms = required_node_terms(pod)
    assert len(terms) == 2
    assert all(t["matchExpressions"][0]["key"] == "topology.kubernetes.io/zone" for t in terms)


async def test_two_spawns_on_one_spawner_do_not_leak_gpu_settings(make_spawner):
    """kubespawner issue 546: one spawner object serves many spawns of a server."""
    spawner = make_spawner(
        gpu_profiles=PROFILES, gpu_runtime_class="nvidia", image_cuda={TORCH: "12.2"},
        node_selector={"pool": "notebooks"}, environment={"TEAM": "ml"},
    )
    gpu_pod = await manifest_for(spawner, {"profile": "gpu", "gpus": 2, "gpu_model": A100, "image": TORCH})
    assert gpu_limits(gpu_pod) == {"nvidia.com/gpu": "2"}
    assert gpu_pod["spec"]["runtimeClassName"] == "nvidia"

    cpu_pod = await manifest_for(spawner, {"profile": "cpu"})
    spec = cpu_pod["spec"]
    assert gpu_limits(cpu_pod) == {}
    assert "nvidia.com/gpu" not in (spec["containers"][0]["resources"].get("requests") or {})
    assert spec["nodeSelector"] == {"pool": "notebooks"}  # the admin's selector stays, the GPU one goes
    assert "runtimeClassName" not in spec
    assert "affinity" not in spec
    assert not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations") or [])
    assert spec["containers"][0]["image"] == "quay.io/jupyter/base-notebook:2024-05-27"
    assert env(cpu_pod)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env(cpu_pod)["TEAM"] == "ml"
    assert float(spec["containers"][0]["resources"]["limits"]["cpu"]) == 2  # not the GPU profile's 16

    # and back: a MIG spawn after the CPU one has only the MIG resource
    mig_pod = await manifest_for(spawner, {"profile": "mig", "gpus": 2, "gpu_model": MIG_1G})
    assert gpu_limits(mig_pod) == {"nvidia.com/mig-1g.10gb": "2"}
    assert "NVIDIA_VISIBLE_DEVICES" not in env(mig_pod)


async def test_bad_options_are_refused_before_anything(make_spawner):
    from tornado.web import HTTPError

    spawner = make_spawner(gpu_profiles=PROFILES)
    with pytest.raises(HTTPError) as e:
        await spawner._run_apply_user_options({"profile": "gpu", "gpus": 2, "gpu_model": "h100-sxm5-80gb"})
    assert e.value.status_code == 400
    assert "gpu_model" in e.value.log_message % e.value.args
