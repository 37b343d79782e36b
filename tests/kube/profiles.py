"""Profiles and helpers shared by the gpu-kube tests."""

from __future__ import annotations

import kubernetes_validate

K8S_VERSION = "1.33.0"  # a Kubernetes version kubernetes-validate ships schemas for

TORCH = "ghcr.io/example/torch:2.3"
NOTEBOOK = "quay.io/jupyter/pytorch-notebook:cuda12-2024-05-27"

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0], "cpu_limit": 2, "mem_limit": "4G"},
    {
        "slug": "gpu",
        "display_name": "Whole GPUs",
        "gpu_models": ["a100", "h100"],
        "gpu_counts": [1, 2, 4, 8, 16],
        "default_gpus": 1,
        "default": True,
        "images": [NOTEBOOK, TORCH],
        "cpu_limit": 16,
        "mem_limit": "128G",
    },
    {"slug": "hopper", "display_name": "H100 only", "gpu_models": ["h100"], "gpu_counts": [1]},
    {"slug": "mig", "display_name": "MIG slice", "gpu_models": ["mig"], "gpu_counts": [1, 2]},
    {"slug": "shared", "display_name": "Shared T4", "gpu_models": ["shared"], "gpu_counts": [1]},
]

A100 = "a100-sxm4-80gb"
MIG_1G = "mig-1g-10gb-a100-sxm4-80gb"
SHARED_T4 = "shared-t4"


def validate_pod(spawner, manifest) -> dict:
    """The manifest as JSON, checked against the Kubernetes OpenAPI schema (strict: no unknown fields)."""
    data = spawner.api.api_client.sanitize_for_serialization(manifest)
    data.setdefault("apiVersion", "v1")
    data.setdefault("kind", "Pod")
    kubernetes_validate.validate(data, K8S_VERSION, strict=True)
    return data


def gpu_limits(pod: dict) -> dict:
    limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    return {k: v for k, v in limits.items() if k.startswith("nvidia.com/")}


def env(pod: dict) -> dict:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
