"""The README's run command: the repository's jupyterhub_config.py on a machine without GPUs.

It must fall back to 2 x A100 + 2 x T4 simulated through the stand-in NVML,
say so in the form, and start a JupyterLab server on the GPUs chosen there; a
notebook GPU job must see through NVML exactly what that server's processes see.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from hub import Hub
from jobnotebooks import outputs_text, write
from test_local_hub import login, xsrf_token
from test_ops_overview import user_token

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


#: what a process sees through NVML (pynvml over nvidia-ml-py): each GPU's name and UUID
NVML_VIEW = (
    "import json, pynvml\n"
    "pynvml.nvmlInit()\n"
    "gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]\n"
    "print('NVML=' + json.dumps([[pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)] for h in gpus]))\n"
)


@pytest.fixture(scope="module")
def default_hub(tmp_path_factory, fakenvml_libdir):
    tmp_path = tmp_path_factory.mktemp("default-config")
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


def server_envs(hub: Hub, user: str) -> list[dict[str, str]]:
    """The environments of ``user``'s server processes (found by their hub variables)."""
    envs = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            raw = (p / "environ").read_bytes()
        except OSError:
            continue
        if f"JUPYTERHUB_USER={user}\0".encode() in raw and b"JUPYTERHUB_API_TOKEN" in raw:
            hub.server_pids.add(int(p.name))
            envs.append(dict(i.split("=", 1) for i in raw.decode().split("\0") if "=" in i))
    return envs


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
    envs = server_envs(hub, "ada")
    assert envs, "the server process was not found"
    t4_uuids = {d["uuid"] for d in devices if d["name"] == "Tesla T4"}
    assert envs[0]["CUDA_VISIBLE_DEVICES"] in t4_uuids
    assert envs[0]["FAKENVML_CONFIG"] == str(state / "simulated-gpus.json")


def test_a_job_sees_through_nvml_what_a_server_sees(default_hub):
    """A notebook job calling NVML gets the simulated GPUs as a server does: same count, names, UUIDs."""
    hub, state = default_hub
    devices = json.loads((state / "simulated-gpus.json").read_text())["devices"]
    web = login(hub, "grace")
    auth = {"Authorization": f"token {user_token(hub, web, 'grace')}"}
    api = hub.url + "/hub/api/users/grace"
    one_a100 = {"profile": "gpu", "gpus": 1, "gpu_model": "a100-sxm4-80gb"}  # ada holds a T4
    r = requests.post(api + "/server", json=one_a100, headers=auth, timeout=60)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 90
    while not (envs := server_envs(hub, "grace")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert envs, f"grace's server process was not found:\n{hub.log()}"
    # what the server's processes (its kernels inherit its environment) see through NVML
    seen = subprocess.run([sys.executable, "-c", NVML_VIEW], env=envs[0], capture_output=True, text=True, timeout=60)
    assert seen.returncode == 0, seen.stderr
    server_view = json.loads(seen.stdout.split("NVML=", 1)[1])
    assert server_view == [[d["name"], d["uuid"]] for d in devices]

    write(state / "users" / "grace" / "nvml.ipynb", NVML_VIEW)
    r = requests.post(api + "/gpu-jobs", json={**one_a100, "notebook": "nvml.ipynb"}, headers=auth, timeout=60)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    deadline = time.monotonic() + 120
    while (job := requests.get(f"{api}/gpu-jobs/{job_id}", headers=auth, timeout=30).json())["state"] not in (
            "completed", "failed", "cancelled", "timed_out"):
        assert time.monotonic() < deadline, hub.log()
        time.sleep(0.3)
    assert job["state"] == "completed", job["reason"]
    job_view = json.loads(outputs_text(state / "users" / "grace" / "nvml-output.ipynb").split("NVML=", 1)[1])
    assert job_view == server_view
    requests.delete(api + "/server", headers=auth, timeout=60)
