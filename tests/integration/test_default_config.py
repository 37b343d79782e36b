"""The README's run command: the repository's jupyterhub_config.py on a machine without GPUs.

It must fall back to 2 x A100 + 2 x T4 simulated through the stand-in NVML,
say so in the form, and start a JupyterLab server on the GPUs chosen there.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from hub import Hub
from test_local_hub import login, xsrf_token

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def default_hub(tmp_path, fakenvml_libdir):
    state = tmp_path / "state"
    hub = Hub(tmp_path / "hub", {}, config_file=REPO / "jupyterhub_config.py")
    hub.env.update({
        "GPUSPAWNER_STATE_DIR": str(state),
        "GPUSPAWNER_FAKENVML_DIR": str(fakenvml_libdir),
        "GPUSPAWNER_BIND_URL": hub.url,
        "GPUSPAWNER_HUB_BIND_URL": hub.settings["hub_bind_url"],
        "GPUSPAWNER_PROXY_API_URL": hub.settings["proxy_api_url"],
        "GPUSPAWNER_PASSWORD": "test-password",
    })
    for name in ("LD_LIBRARY_PATH", "FAKENVML_CONFIG"):  # as on a fresh machine
        hub.env.pop(name, None)
    hub.start()
    try:
        yield hub, state
    finally:
        hub.close()


def test_default_config_simulates_gpus_and_starts_jupyterlab_on_them(default_hub):
    hub, state = default_hub
    devices = json.loads((state / "simulated-gpus.json").read_text())["devices"]
    assert [d["name"] for d in devices] == ["NVIDIA A100-SXM4-80GB"] * 2 + ["Tesla T4"] * 2
    # the hub's database commits without waiting for the disk (answers stay prompt under a spawn storm)
    with sqlite3.connect(state / "jupyterhub.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    web = login(hub, "ada")
    html = web.get(hub.url + "/hub/spawn").text
    assert "Simulated GPUs" in html
    assert "NVIDIA A100-SXM4-80GB - 2 of 2 free" in html and "Tesla T4 - 2 of 2 free" in html

    r = web.post(hub.url + "/hub/spawn", data={
        "_xsrf": xsrf_token(html), "profile": "gpu", "gpus-gpu": "1", "gpu_model-gpu": "t4",
    })
    assert r.ok, r.text
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        lab = web.get(hub.url + "/user/ada/lab")
        if lab.status_code == 200 and "JupyterLab" in lab.text:
            break
        time.sleep(1)
    else:
        pytest.fail(f"JupyterLab did not open:\n{hub.log()}")
    pids = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    envs = []
    for p in pids:
        try:
            raw = (p / "environ").read_bytes()
        except OSError:
            continue
        if b"JUPYTERHUB_USER=ada\0" in raw and b"JUPYTERHUB_API_TOKEN" in raw:
            hub.server_pids.add(int(p.name))
            envs.append(dict(i.split("=", 1) for i in raw.decode().split("\0") if "=" in i))
    assert envs, "the server process was not found"
    t4_uuids = {d["uuid"] for d in devices if d["name"] == "Tesla T4"}
    assert envs[0]["CUDA_VISIBLE_DEVICES"] in t4_uuids
    assert envs[0]["FAKENVML_CONFIG"] == str(state / "simulated-gpus.json")
