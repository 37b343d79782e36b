"""A site's own Spawner hooks on a real hub: they compose with gpuspawner's, none is replaced.

The hub (gpu-local on 4 stand-in GPUs) is configured as a site that had its own form
(``c.Spawner.options_form``), reads it with its own ``options_from_form`` and applies the
result with its own ``apply_user_options``. With the GPU class, users see both forms, the
GPU fields give the GPUs and the site's fields reach the site's hooks, by the form and by
the REST API alike; the site's key wins where both give one (README, "A site's own hooks").
What the site's hook set is read from the server process's environment.
"""

from __future__ import annotations

import pytest

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import Hub, login, xsrf_token
from test_local_hub import gpu_set

pytestmark = pytest.mark.integration

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_counts": [1, 2], "default": True},
]

SITE_HOOKS = '''
c.Spawner.options_form = """
<label>Flavour <input name="flavor" value="vanilla"></label>
<label><input type="checkbox" name="bigger"> Twice the GPUs</label>
"""

def site_options_from_form(formdata):
    options = {"flavor": formdata.get("flavor", [""])[0], "seen": sorted(formdata)}
    if formdata.get("bigger"):
        options["gpus"] = 2
    return options

def site_apply_user_options(spawner, user_options):
    flavor = user_options.get("flavor", "none")
    if not isinstance(flavor, str):
        raise ValueError("flavor must be text")
    spawner.environment = {**spawner.environment, "SITE_FLAVOR": flavor,
                           "SITE_SAW": ",".join(user_options.get("seen", []))}

c.Spawner.options_from_form = site_options_from_form
c.Spawner.apply_user_options = site_apply_user_options
'''


@pytest.fixture(scope="module")
def site_hub(tmp_path_factory, fakenvml_libdir):
    tmp = tmp_path_factory.mktemp("site-hooks")
    config_path = tmp / "gpus.json"
    fakenvml.write_config(config_path, simulated_config(a100=2, t4=2))
    hub = Hub(tmp / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES, extra_config=SITE_HOOKS)
    hub.start()
    try:
        yield hub
    finally:
        hub.close()


def submit(hub: Hub, name: str, fields: dict[str, str]) -> dict[str, str]:
    """Post the spawn form as a browser does (the XSRF token in the form's action); the server's environment."""
    web = login(hub, name)
    page = web.get(hub.url + "/hub/spawn").text
    r = web.post(hub.url + "/hub/spawn?_xsrf=" + xsrf_token(page), data=fields)
    assert r.status_code == 200, r.text
    hub.wait_ready(name)
    return hub.server_env(name)


def test_the_sites_form_is_shown_below_the_gpu_choices(site_hub):
    html = login(site_hub, "ann").get(site_hub.url + "/hub/spawn").text
    assert 'name="gpus-gpu"' in html and 'name="profile"' in html  # gpuspawner's
    assert 'name="flavor"' in html and 'name="bigger"' in html  # the site's
    assert html.index('name="gpus-gpu"') < html.index('name="flavor"')


def test_the_form_gives_gpus_from_its_gpu_fields_and_the_site_its_own(site_hub):
    env = submit(site_hub, "bea", {"profile": "gpu", "gpus-gpu": "1", "gpu_model-gpu": "any", "flavor": "mint"})
    assert len(gpu_set(env)) == 1
    assert env["SITE_FLAVOR"] == "mint"
    assert env["SITE_SAW"] == "flavor"  # the site's function saw its own fields, not gpuspawner's


def test_the_sites_key_wins_where_both_give_one(site_hub):
    env = submit(site_hub, "cid", {"profile": "gpu", "gpus-gpu": "1", "flavor": "lime", "bigger": "on"})
    assert len(gpu_set(env)) == 2
    assert env["SITE_SAW"] == "bigger,flavor"


def test_the_rest_api_takes_the_sites_keys_beside_the_gpu_ones(site_hub):
    site_hub.add_users("dee", "eve")
    r = site_hub.spawn("dee", {"profile": "cpu", "flavor": "lemon"})
    assert r.status_code in (201, 202), r.text
    site_hub.wait_ready("dee")
    env = site_hub.server_env("dee")
    assert gpu_set(env) == set() and env["SITE_FLAVOR"] == "lemon"
    # the site's hook refuses its own bad value: JupyterHub's 400, nothing started
    r = site_hub.spawn("eve", {"profile": "cpu", "flavor": 7})
    assert r.status_code == 400, r.text
    assert site_hub.user("eve")["servers"] == {}
    # and gpuspawner still checks its own keys, naming the field
    r = site_hub.spawn("eve", {"profile": "gpu", "gpus": 3, "flavor": "x"})
    assert r.status_code == 400 and r.json()["message"].startswith("gpus: 3 is not allowed"), r.text
    assert site_hub.user("eve")["servers"] == {}
