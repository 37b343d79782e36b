"""gpu-kube against a real Kubernetes API server: the private control plane of this test run
(``kube_cluster``), and a site's cluster when KUBECONFIG is set.

Read only, apart from server-side dry-run pod creation (nothing is created):
the cluster's GPU capacity is read, the form renders, and the pod of a
CPU-only choice (and, when the cluster has GPUs, of a one-GPU choice) is
accepted by the API server's own validation.
"""

from __future__ import annotations

import os

import pytest

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU", "gpu_models": ["any"], "gpu_counts": [1], "default_gpus": 1},
]


async def check_capacity_form_and_dry_run_pods(namespace: str) -> list[dict]:
    """The checks, against the cluster KUBECONFIG names; the choices whose pods were accepted."""
    from traitlets.config import Config

    from gpuspawner.backends.kube.capacity import pools
    from gpuspawner.backends.kube.spawner import GPUKubeSpawner

    config = Config()
    config.KubeSpawner.namespace = namespace
    config.GPUKubeSpawner.gpu_profiles = PROFILES
    spawner = GPUKubeSpawner(_mock=True, config=config)
    reading = await spawner.cluster_capacity().read()
    assert reading.unknown is None, reading.unknown
    for pool in pools(reading.nodes):
        assert 0 <= pool.free <= pool.total and pool.largest <= pool.max_per_node
    html = await spawner._render_options_form()
    assert "CPU only" in html
    choices = [{"profile": "cpu"}]
    if any(p.kind == "gpu" and p.largest >= 1 for p in pools(reading.nodes)):
        choices.append({"profile": "gpu", "gpus": 1})
    for options in choices:
        spawner.user_options = options
        await spawner._run_apply_user_options(options)
        await spawner.reserve_gpus()
        manifest = await spawner.get_pod_manifest()
        created = await spawner.api.create_namespaced_pod(spawner.namespace, manifest, dry_run="All")
        assert created.metadata.name == spawner.pod_name
    return choices


@pytest.mark.skipif(not os.environ.get("KUBECONFIG"),
                    reason="a site's Kubernetes cluster: set KUBECONFIG (and optionally GPUSPAWNER_TEST_NAMESPACE)")
async def test_capacity_form_and_dry_run_pods_on_a_site_cluster():
    await check_capacity_form_and_dry_run_pods(os.environ.get("GPUSPAWNER_TEST_NAMESPACE", "default"))


async def test_capacity_form_and_dry_run_pods(kube_admin, kube_namespace):
    choices = await check_capacity_form_and_dry_run_pods(kube_namespace)
    assert {"profile": "gpu", "gpus": 1} in choices  # the recorded A100 nodes have whole GPUs free


async def test_start_begins_when_called_as_kubespawners(kube_admin, kube_namespace):
    """gpu-kube's start(), as KubeSpawner's, begins when called and returns a Future: the pod is made while
    the caller reads the progress, before it awaits the start (kubespawner's own test_spawn_progress does).
    Its user here is a ``unittest.mock.Mock``, as in kubespawner's own tests: no list of groups, no group."""
    import asyncio
    from unittest.mock import Mock

    from traitlets.config import Config

    from gpuspawner.backends.kube.spawner import GPUKubeSpawner

    config = Config()
    config.KubeSpawner.namespace = kube_namespace
    config.GPUKubeSpawner.gpu_profiles = [PROFILES[0]]
    user = Mock(url="/user/mocky/", escaped_name="mocky", groups=Mock())
    user.name = "mocky"
    spawner = GPUKubeSpawner(_mock=True, config=config, user=user)
    started = spawner.start()
    assert isinstance(started, asyncio.Future)
    path = f"/api/v1/namespaces/{kube_namespace}/pods/{spawner.pod_name}"
    while kube_admin.api("GET", path, ok=(404,)) is None and not started.done():
        await asyncio.sleep(0.1)  # (the start's own timeout bounds this)
    assert kube_admin.api("GET", path, ok=(404,)) is not None
    await started
    await spawner.stop()
