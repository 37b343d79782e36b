"""GPUs the cluster places (gpu-kube) in the admin overview and the metrics: counted, never shown as hub GPUs."""

from __future__ import annotations

import json

import pytest
from jinja2 import Environment, FileSystemLoader, select_autoescape
from prometheus_client import REGISTRY
from traitlets.config import Config

from gpuspawner.gpu import GPU
from gpuspawner.hub.handlers import _ago, _gib, _when
from gpuspawner.hub.overview import Holder, build, held_by_owner, own_view
from gpuspawner.hub.setup import TEMPLATES
from gpuspawner.inventory import InventoryReading
from gpuspawner.ledger import cluster_tokens
from gpuspawner.placement import GPURequest
from gpuspawner.state import hub_state

T4 = "Tesla T4"
INVENTORY = (GPU("gpu-host-1", 0, "GPU-a", T4), GPU("gpu-host-1", 1, "GPU-b", T4))
ALLOCATIONS = {
    "ann/": ("GPU-a",),
    "zoe/": cluster_tokens("zoe/", {"nvidia.com/gpu": 2}),
    "carol/mig": cluster_tokens("carol/mig", {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": 1}),
}


pytestmark = pytest.mark.usefixtures("fresh_metrics")


def test_overview_lists_cluster_holdings_apart_from_the_hubs_gpus():
    holders = {"zoe/": Holder("zoe/", "zoe", "", 1_700_000_000.0, "running", "/user/zoe/")}
    data = build(InventoryReading(INVENTORY), ALLOCATIONS, holders, {}, {}, [], 1_700_000_100.0)
    json.dumps(data)  # what /hub/api/gpus answers
    # the per-GPU table has the hub's GPUs only, and only ann holds one of them
    assert [(g["uuid"], g["holder"] and g["holder"]["owner"]) for g in data["gpus"]] == [("GPU-a", "ann/"),
                                                                                        ("GPU-b", None)]
    assert [(m["model"], m["free"], m["allocated"], m["total"]) for m in data["models"]] == [("t4", 1, 1, 2)]
    assert [(c["owner"], c["user"], c["server"], c["state"], c["gpus"], c["resources"]) for c in data["cluster"]] == [
        ("carol/mig", "carol", "mig", "unknown", 2, {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}),
        ("zoe/", "zoe", "", "running", 2, {"nvidia.com/gpu": 2}),
    ]
    assert data["cluster"][1]["since"] == 1_700_000_000.0


def test_overview_page_shows_cluster_holdings_in_their_own_table():
    templates = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    tables = templates.get_template("gpuspawner_gpus_tables.html")
    data = build(InventoryReading(INVENTORY), ALLOCATIONS, {}, {}, {}, [], 1_700_000_100.0)
    html = tables.render(gpus=data, ago=_ago, when=_when, gib=_gib, now=data["time"])
    cluster_table = html.split('id="gpuspawner-cluster"', 1)[1].split("</table>", 1)[0]
    assert "zoe" in cluster_table and "2 x nvidia.com/gpu" in cluster_table
    assert "carol / mig" in cluster_table and "1 x nvidia.com/gpu, 1 x nvidia.com/mig-1g.10gb" in cluster_table
    gpu_table = html.split('id="gpuspawner-gpu-table"', 1)[1].split("</table>", 1)[0]
    assert "cluster:" not in gpu_table and "zoe" not in gpu_table
    # a hub without cluster holdings shows no such table
    plain = build(InventoryReading(INVENTORY), {"ann/": ("GPU-a",)}, {}, {}, {}, [], 1_700_000_100.0)
    assert 'id="gpuspawner-cluster"' not in tables.render(gpus=plain, ago=_ago, when=_when, gib=_gib, now=0)


def test_metrics_count_cluster_holdings_per_resource_and_not_as_hub_gpus():
    config = Config()
    config.GPUHubSettings.gpu_inventory = "static"
    config.GPUHubSettings.static_gpus = [{"uuid": g.uuid, "name": g.name, "host": g.host} for g in INVENTORY]
    state = hub_state(config)
    state.inventory.read_now()
    state.ledger.reserve(INVENTORY, GPURequest("ann/", 1))
    state.ledger.claim("zoe/", {"nvidia.com/gpu": 2})
    state.ledger.claim("carol/mig", {"nvidia.com/mig-1g.10gb": 1})

    def samples(name: str) -> dict:
        return {tuple(sorted(s.labels.items())): s.value for m in REGISTRY.collect() if m.name == name
                for s in m.samples}

    hub_gpus = samples("gpuspawner_gpus")
    assert hub_gpus[(("host", "gpu-host-1"), ("model", "t4"), ("state", "allocated"))] == 1
    assert hub_gpus[(("host", "gpu-host-1"), ("model", "t4"), ("state", "free"))] == 1
    assert samples("gpuspawner_cluster_gpus_held") == {
        (("resource", "nvidia.com/gpu"),): 2, (("resource", "nvidia.com/mig-1g.10gb"),): 1}


def test_admin_section_and_own_view_count_cluster_holdings_per_resource():
    data = build(InventoryReading(INVENTORY), ALLOCATIONS, {}, {}, {}, [], 1_700_000_100.0)
    held = {h["owner"]: (h["user"], h["gpus"], h["held"]) for h in held_by_owner(data)}
    assert held == {"ann/": ("ann", 1, "1 x Tesla T4"), "zoe/": ("zoe", 2, "2 x nvidia.com/gpu"),
                    "carol/mig": ("carol", 2, "1 x nvidia.com/gpu, 1 x nvidia.com/mig-1g.10gb")}
    zoe = own_view(data, "zoe")
    assert zoe["gpus"] == [] and [c["owner"] for c in zoe["cluster"]] == ["zoe/"] and zoe["models"] == data["models"]
    assert [h["owner"] for h in held_by_owner(own_view(data, "ann"))] == ["ann/"]
