"""GPU health on gpu-kube, on the test run's real control plane: the fake kubelet marks a device unhealthy the
way NVIDIA's device plugin does (it leaves the node's allocatable, its capacity keeps it), and a real hub's
form, /hub/gpus, /hub/api/gpus/health and Prometheus say so; the user whose pod holds it is told in
JupyterLab; when the device is healthy again it is back. An administrator's taint (kube_gpu_health_taints)
does the same for the whole node."""

from __future__ import annotations

import re

import pytest

from clusterhealth import HEALTH_CONFIG, cluster_outages, form_of, health_notice, healthy_metric, outage_row
from gpuspawner.backends.kube.dev.kubelet import gpu_node
from hub import BASE_HUB_CONFIG, Hub, login
from test_ops_overview import user_token, wait_for
from test_pods_run import KUBE_HUB_CONFIG, SINGLEUSER, running_namespace  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

NODE = "sick-h100-0"
PRODUCT = "NVIDIA-H100-80GB-HBM3"
MODEL = "h100-80gb-hbm3"
CONFIGURED = """
from gpuspawner.hub.setup import configure
configure(c)
c.GPUSpawnerMixin.gpu_inventory_ttl = 0.5
c.GPUKubeSpawner.kube_gpu_health_taints = ["example.com/gpu-unhealthy"]
"""
TAINT = {"key": "example.com/gpu-unhealthy", "value": "XID79", "effect": "NoSchedule"}
PROFILES = [{"slug": "h100", "display_name": "One H100", "gpu_models": [MODEL], "gpu_counts": [1]}]


@pytest.fixture
def one_gpu_node(kube_cluster):
    """A node of its own with one H100 (no other test's pods land there); removed afterwards."""
    kube_cluster.kubelet.add_node(gpu_node(NODE, PRODUCT, 1))
    try:
        yield NODE
    finally:
        kube_cluster.kubelet.remove_node(NODE)


def test_a_gpu_the_device_plugin_finds_unhealthy_is_out_of_service_and_its_user_told(
        kube_cluster, running_namespace, one_gpu_node, tmp_path):  # noqa: F811
    folder = tmp_path / "hub"
    folder.mkdir()
    config = folder / "jupyterhub_config.py"
    config.write_text(BASE_HUB_CONFIG + KUBE_HUB_CONFIG.format(namespace=running_namespace, image=SINGLEUSER,
                                                                profiles=PROFILES) + CONFIGURED + HEALTH_CONFIG)
    hub = Hub(folder, {"KUBECONFIG": str(kube_cluster.admin_kubeconfig)}, config_file=config)
    hub.start()
    try:
        hub.add_users("ann", "boss")
        boss_session = login(hub, "boss")
        boss = user_token(hub, boss_session, "boss")
        r = hub.spawn("ann", {"profile": "h100", "gpus": 1})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("ann", timeout=120)
        assert wait_for(lambda: healthy_metric(hub, NODE, MODEL) == "1.0", 30, 0.3), hub.log()
        assert cluster_outages(hub, boss) == []

        kube_cluster.kubelet.set_unhealthy(NODE, 1)
        message = health_notice(hub, "ann")
        why = "the NVIDIA device plugin reports 1 of 1 nvidia.com/gpu unhealthy (left out of the node's allocatable)"
        assert message == (
            f"Node {NODE}, where this server runs, has 1 of its 1 {PRODUCT} GPUs out of service: {why}. Your "
            "server uses one of them: save your work now; what runs on it may fail or give wrong results. Stop "
            "this server and start it again to get a healthy GPU.")
        [outage] = cluster_outages(hub, boss)
        assert (outage["node"], outage["model"], outage["out"], outage["total"], outage["reason"],
                outage["affected"]) == (NODE, MODEL, 1, 1, why, ["ann/"])
        # the form's card, /hub/gpus (the node, why and since when) and Prometheus say so
        assert wait_for(lambda: f"{PRODUCT}: none usable, 1 {PRODUCT} out of service" in form_of(boss_session, hub),
                        30, 0.3)
        page = boss_session.get(hub.url + "/hub/gpus", timeout=30).text
        row = outage_row(page, NODE, MODEL)
        assert why in row and "1 of 1" in row and "ann/" in row and re.search(r"20\d\d-\d\d-\d\d", row)
        assert healthy_metric(hub, NODE, MODEL) == "0.0"

        # the device plugin finds it healthy again: back in service
        kube_cluster.kubelet.set_unhealthy(NODE, 0)
        assert wait_for(lambda: cluster_outages(hub, boss) == [], 30, 0.3), hub.log()
        assert healthy_metric(hub, NODE, MODEL) == "1.0"
        assert wait_for(lambda: f"{PRODUCT}: 0 of 1 free" in form_of(boss_session, hub), 30, 0.3)
        assert "out of service" not in form_of(boss_session, hub)

        # an administrator taints the node (kube_gpu_health_taints): all its GPUs out, the users on it told
        patch = "application/merge-patch+json"
        kube_cluster.api("PATCH", f"/api/v1/nodes/{NODE}", {"spec": {"taints": [TAINT]}}, patch)
        why = "the node is tainted example.com/gpu-unhealthy=XID79 (NoSchedule): its GPUs are out of service"
        assert wait_for(lambda: [o["reason"] for o in cluster_outages(hub, boss)] == [why], 30, 0.3), hub.log()
        assert wait_for(lambda: why in health_notice(hub, "ann"), 30, 0.3)
        assert wait_for(lambda: f"{PRODUCT}: none usable, 1 {PRODUCT} out of service" in form_of(boss_session, hub),
                        30, 0.3)
        kube_cluster.api("PATCH", f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}}, patch)
        assert wait_for(lambda: cluster_outages(hub, boss) == [], 30, 0.3), hub.log()
        hub.stop_server("ann", timeout=60)
    finally:
        hub.close()
