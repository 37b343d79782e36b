"""A hub that finds no GPUs, with gpuspawner's default profiles: CPU servers, and the form says why.

Two ways to find none: NVML answers with no GPU (the stand-in with an empty device
list), and a static inventory with no entry. Either way the form offers only the
profiles that run without a GPU and says that no GPUs were found, a spawn that names
no profile gets a server without a GPU (before: 409 for every such spawn), and one that
asks for GPUs is refused with the hub's sentence, holding nothing.
"""

from __future__ import annotations

import pytest

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import Hub, login
from test_local_hub import gpu_set

pytestmark = pytest.mark.integration

INVENTORIES = {
    "nvml-finds-none": "",
    "static-empty": 'c.GPUSpawnerMixin.gpu_inventory = "static"\nc.GPUSpawnerMixin.static_gpus = []\n',
}


@pytest.mark.parametrize("inventory", sorted(INVENTORIES))
def test_a_hub_without_gpus_offers_cpu_servers_and_says_so(inventory, tmp_path, fakenvml_libdir):
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, simulated_config(a100=0, t4=0))
    hub = Hub(tmp_path / "hub", fakenvml.env(fakenvml_libdir, config_path), [], extra_config=INVENTORIES[inventory])
    hub.start()
    try:
        html = " ".join(login(hub, "ivy").get(hub.url + "/hub/spawn").text.split())
        assert "No GPUs were found on this hub" in html and "so only servers without a GPU are offered." in html
        assert 'value="cpu"' in html and 'value="gpu"' not in html  # the default GPU profile is not offered

        hub.add_users("ivy", "jon")
        r = hub.spawn("ivy", {})  # the default profiles' default
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("ivy")
        assert gpu_set(hub.server_env("ivy")) == set()
        assert hub.user("ivy")["servers"][""]["user_options"] == {}

        r = hub.spawn("jon", {"profile": "gpu"})
        assert r.status_code == 409, r.text
        assert r.json()["message"] == "This hub has no GPUs to give out. Please contact your administrators."
        assert hub.user("jon")["servers"] == {}
    finally:
        hub.close()
