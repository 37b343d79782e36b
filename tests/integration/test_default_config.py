"""The README's run command: the repository's jupyterhub_config.py on a machine without GPUs.

It must fall back to 2 x A100 + 2 x T4 simulated through the stand-in NVML,
say so in the form, and start a JupyterLab server on the GPUs chosen there; a
notebook GPU job must see through NVML exactly what that server's processes see.
That server runs as the user's own account, which the hub made (never root): from
a notebook in it, the hub's database cannot be read and another GPU's device
file cannot be opened (nor used through NVML), while its own GPU's can.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import signal
import sqlite3
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from hub import Hub, login, uid_pids, xsrf_token
from jobnotebooks import outputs_text, write
from kernels import execute, start_kernel
from test_ops_overview import user_token

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


#: what a process sees through NVML (pynvml over nvidia-ml-py): each GPU's name and UUID, or the
#: error NVML answers for it (a GPU outside the process's device fence: NVMLError_NoPermission)
NVML_VIEW = (
    "import json, pynvml\n"
    "pynvml.nvmlInit()\n"
    "def gpu(i):\n"
    "    try:\n"
    "        h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
    "        return [pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)]\n"
    "    except pynvml.NVMLError as e:\n"
    "        return type(e).__name__\n"
    "print('NVML=' + json.dumps([gpu(i) for i in range(pynvml.nvmlDeviceGetCount())]))\n"
)


@contextmanager
def runnable_default(tmp_path: Path, fakenvml_libdir: Path, env: dict[str, str] | None = None,
                     config_file: Path = REPO / "jupyterhub_config.py"):
    """A hub of the repository's jupyterhub_config.py (or of ``config_file``, which may load it) on a fresh
    machine (no NVML variables), with ``env`` on top; yields (hub, state folder), and stops it and deletes
    its accounts after."""
    state = tmp_path / "state"
    hub = Hub(tmp_path / "hub", {}, config_file=config_file)
    hub.env.update({
        "GPUSPAWNER_STATE_DIR": str(state),
        "GPUSPAWNER_FAKENVML_DIR": str(fakenvml_libdir),
        "GPUSPAWNER_BIND_URL": hub.url,
        "GPUSPAWNER_HUB_BIND_URL": hub.settings["hub_bind_url"],
        "GPUSPAWNER_PROXY_API_URL": hub.settings["proxy_api_url"],
        "GPUSPAWNER_PASSWORD": "test-password",
        "GPUSPAWNER_ACCOUNT_PREFIX": "d" + secrets.token_hex(3) + "-",  # this test's accounts alone
        "GPUSPAWNER_HUB_ID": hub.settings["hub_id"],  # this hub stops no other runnable default's servers
        **(env or {}),
    })
    for name in ("LD_LIBRARY_PATH", "FAKENVML_CONFIG"):  # as on a fresh machine
        hub.env.pop(name, None)
    hub.start()
    try:
        yield hub, state
    finally:
        hub.close()
        for entry in pwd.getpwall():
            if entry.pw_name.startswith(hub.env["GPUSPAWNER_ACCOUNT_PREFIX"]):
                for pid in uid_pids(entry.pw_uid):
                    os.kill(pid, signal.SIGKILL)
                subprocess.run(["userdel", "--remove", entry.pw_name], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def default_hub(tmp_path_factory, fakenvml_libdir):
    with runnable_default(tmp_path_factory.mktemp("default-config"), fakenvml_libdir) as hub_and_state:
        yield hub_and_state


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
        if (f"JUPYTERHUB_USER={user}\0".encode() in raw and b"JUPYTERHUB_API_TOKEN" in raw
                and f"JUPYTERHUB_API_URL={hub.settings['hub_bind_url']}/".encode() in raw):  # this hub's
            hub.server_pids.add(int(p.name))
            envs.append(dict(i.split("=", 1) for i in raw.decode().split("\0") if "=" in i))
    return envs


# From a notebook: what the server's account may read and open.
PROBE = """
import errno, json, os, pynvml
def attempt(path, flags):
    try:
        os.close(os.open(path, flags))
        return "opened"
    except OSError as e:
        return errno.errorcode[e.errno]
pynvml.nvmlInit()
def handle(uuid):
    try:
        pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return "handle"
    except pynvml.NVMLError as e:
        return type(e).__name__
print(json.dumps({{
    "uid": os.getuid(), "database": attempt({database!r}, os.O_RDONLY),
    "nodes": {{d["uuid"]: attempt(d["device_node"], os.O_RDWR) for d in {devices!r}}},
    "nvml": {{d["uuid"]: handle(d["uuid"]) for d in {devices!r}}},
}}))
"""


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
    mine = envs[0]["CUDA_VISIBLE_DEVICES"]
    assert mine in t4_uuids
    assert envs[0]["FAKENVML_CONFIG"] == str(state / "simulated-gpus.json")

    # it runs as ada's own account, made by the hub: not root
    account = pwd.getpwnam(hub.env["GPUSPAWNER_ACCOUNT_PREFIX"] + "ada")
    assert account.pw_uid != 0 and Path(account.pw_dir).parent == state / "users"
    for pid in hub.server_pids:  # real, effective, saved and filesystem uid: all the account's
        status = Path(f"/proc/{pid}/status").read_text()
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        assert uids == [str(account.pw_uid)] * 4, status
    # from a notebook: no hub database, no other GPU; its own GPU's device file as far as the fence goes
    devices = json.loads((state / "simulated-gpus.json").read_text())["devices"]
    assert all(d.get("device_node") for d in devices)  # the simulated GPUs are on device files
    xsrf = web.cookies.get("_xsrf", path="/hub/")
    token = web.post(f"{hub.url}/hub/api/users/ada/tokens", json={"note": "test"},
                     headers={"X-XSRFToken": xsrf, "Referer": hub.url + "/hub/token"}).json()["token"]
    server_url = hub.url + "/user/ada/"
    kernel = start_kernel(server_url, token)
    seen = json.loads(execute(server_url, token, kernel, PROBE.format(
        database=str(state / "jupyterhub.sqlite"), devices=[{k: d[k] for k in ("uuid", "device_node")}
                                                          for d in devices])))
    assert seen["uid"] == account.pw_uid
    assert seen["database"] == "EACCES"
    assert seen["nodes"] == {d["uuid"]: "ENXIO" if d["uuid"] == mine else "EPERM" for d in devices}, seen
    assert seen["nvml"] == {d["uuid"]: "handle" if d["uuid"] == mine else "NVMLError_NoPermission"
                            for d in devices}, seen


def test_a_job_sees_through_nvml_what_a_server_sees(default_hub):
    """A notebook job calling NVML gets the simulated GPUs as a server's kernel does: same count, names, UUIDs."""
    hub, state = default_hub
    web = login(hub, "grace")
    token = user_token(hub, web, "grace")
    auth = {"Authorization": f"token {token}"}
    api = hub.url + "/hub/api/users/grace"
    one_a100 = {"profile": "gpu", "gpus": 1, "gpu_model": "a100-sxm4-80gb"}  # ada holds a T4
    r = requests.post(api + "/server", json=one_a100, headers=auth, timeout=60)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 90
    while not requests.get(api, headers=auth, timeout=30).json()["servers"].get("", {}).get("ready"):
        assert time.monotonic() < deadline, f"grace's server did not start:\n{hub.log()}"
        time.sleep(0.5)
    server_envs(hub, "grace")  # its pids, for the hub's close
    # what the server's kernels see through NVML, from inside its fence and account
    server_url = hub.url + "/user/grace/"
    kernel = start_kernel(server_url, token)
    server_view = json.loads(execute(server_url, token, kernel, NVML_VIEW).split("NVML=", 1)[1])
    mine = [gpu for gpu in server_view if isinstance(gpu, list)]
    assert len(mine) == 1 and mine[0][0] == "NVIDIA A100-SXM4-80GB", server_view  # its own GPU, the others fenced

    home = Path(pwd.getpwnam(hub.env["GPUSPAWNER_ACCOUNT_PREFIX"] + "grace").pw_dir)
    write(home / "nvml.ipynb", NVML_VIEW)
    r = requests.post(api + "/gpu-jobs", json={**one_a100, "notebook": "nvml.ipynb"}, headers=auth, timeout=60)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    deadline = time.monotonic() + 120
    while (job := requests.get(f"{api}/gpu-jobs/{job_id}", headers=auth, timeout=30).json())["state"] not in (
            "completed", "failed", "cancelled", "timed_out"):
        assert time.monotonic() < deadline, hub.log()
        time.sleep(0.3)
    assert job["state"] == "completed", job["reason"]
    job_view = json.loads(outputs_text(home / "nvml-output.ipynb").split("NVML=", 1)[1])
    # the same sight on its own GPU (another A100: the server holds the first): that one GPU by name
    # and UUID, every other GPU refused as for the server
    assert [gpu[1] for gpu in job_view if isinstance(gpu, list)] == [g["uuid"] for g in job["gpus"]]

    def shape(view):
        return [gpu[0] if isinstance(gpu, list) else gpu for gpu in view]

    assert sorted(shape(job_view)) == sorted(shape(server_view)), (job_view, server_view)
    requests.delete(api + "/server", headers=auth, timeout=60)


def test_the_hub_log_has_no_deprecation_warning_nor_a_bare_prefix(default_hub):
    """A start and a stop on the GPU spawner leave no ``Spawner.db`` deprecation warning (JupyterHub 6's
    ``[W ... JupyterHub spawner:251]``, whose first line is the prefix alone) in the hub's log, and no
    warning line that says nothing after its prefix."""
    hub, _ = default_hub
    web = login(hub, "ida")
    auth = {"Authorization": f"token {user_token(hub, web, 'ida')}"}
    api = hub.url + "/hub/api/users/ida"
    r = requests.post(api + "/server", json={"profile": "gpu", "gpus": 1}, headers=auth, timeout=60)
    assert r.status_code in (201, 202), f"{r.text}\n{hub.log()}"
    deadline = time.monotonic() + 90
    while not requests.get(api, headers=auth, timeout=30).json()["servers"].get("", {}).get("ready"):
        assert time.monotonic() < deadline, f"ida's server did not start:\n{hub.log()}"
        time.sleep(0.5)
    server_envs(hub, "ida")  # its pids, for the hub's close
    requests.delete(api + "/server", headers=auth, timeout=60)
    while requests.get(api, headers=auth, timeout=30).json()["servers"]:
        assert time.monotonic() < deadline + 60, f"ida's server did not stop:\n{hub.log()}"
        time.sleep(0.5)
    log = hub.log_path.read_text(errors="replace")
    assert "Spawner.db is deprecated" not in log, log[-6000:]
    bare = [line for line in log.splitlines() if re.fullmatch(r"\[[WE] [^\]]*\]\s*", line)]
    assert bare == [], bare
