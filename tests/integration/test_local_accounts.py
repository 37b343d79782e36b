"""Nobody's server runs as root, and a hub whose servers could not run says why at start.

Real hubs on loopback: the test hub's own gpu-local servers run as accounts the hub
makes (tests/integration/hub.py; test_default_config.py checks the runnable
default's from inside a notebook). Here: gpu-local-simple, which runs servers as the
hub's own user, refuses to start a hub that is root unless told otherwise; and a hub
whose servers' Python lies in a folder only root may enter (a virtualenv made from
pyenv's interpreter under /root) stops at start with a sentence saying what to do,
instead of failing every spawn with a bare 500, and refuses spawns with that
sentence where it was started without the check. No account, process or server is
left by either refusal.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import VENV_BIN, Hub, pid_alive

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]}]
CHECKED = "\nfrom gpuspawner.hub.setup import configure\nconfigure(c)\n"  # configure() checks the spawner
SIMPLE = """
c.JupyterHub.spawner_class = "gpu-local-simple"
c.SimpleLocalProcessSpawner.home_dir_template = settings["dir"] + "/simple/{username}"
"""


@pytest.fixture
def nvml(tmp_path, fakenvml_libdir):
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, simulated_config(a100=1, t4=0))
    return fakenvml.env(fakenvml_libdir, config_path)


def refused_at_start(hub: Hub) -> str:
    with pytest.raises(RuntimeError, match="hub exited") as exited:
        hub.start()
    return str(exited.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="the hub must be root for its servers to be root")
def test_gpu_local_simple_refuses_root_servers_unless_told(tmp_path, nvml):
    hub = Hub(tmp_path / "hub", nvml, PROFILES, extra_config=SIMPLE + CHECKED)
    try:
        log = refused_at_start(hub)
        assert "[gpuspawner] cannot start servers: gpu-local-simple runs every server as the hub's own user, " \
               "which is root here" in log
        assert "c.GPUSimpleLocalProcessSpawner.allow_root_servers = True" in log
    finally:
        hub.close()

    allowed = SIMPLE + "c.GPUSimpleLocalProcessSpawner.allow_root_servers = True\n" \
        "c.Spawner.args = ['--allow-root']\n" + CHECKED
    hub = Hub(tmp_path / "allowed", nvml, PROFILES, extra_config=allowed)
    hub.start()
    try:
        hub.add_users("ada")
        assert hub.spawn("ada", {"profile": "cpu"}).status_code in (201, 202)
        hub.wait_ready("ada")
        pid = hub.user("ada")["servers"][""]["state"]["pid"]
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        assert next(line.split()[1:] for line in status if line.startswith("Uid:")) == ["0"] * 4  # as allowed
    finally:
        hub.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the hub makes accounts for its servers")
def test_a_python_other_users_cannot_enter_is_named_at_start_and_at_spawn(tmp_path, nvml):
    private = tmp_path / "root-only"  # as /root, holding pyenv's interpreter
    (private / "bin").mkdir(parents=True)
    program = private / "bin" / "jupyterhub-singleuser"
    program.symlink_to(VENV_BIN / "jupyterhub-singleuser")
    private.chmod(0o700)
    venv = tmp_path / "venv" / "bin"  # and a virtualenv everyone may enter, whose python leads into it
    venv.mkdir(parents=True)
    (venv / "jupyterhub-singleuser").symlink_to(program)
    wrong = f"\nc.Spawner.cmd = [{str(venv / 'jupyterhub-singleuser')!r}]\n"

    hub = Hub(tmp_path / "checked", nvml, PROFILES, extra_config=wrong + CHECKED)
    try:
        log = refused_at_start(hub)
        assert f"cannot run {venv / 'jupyterhub-singleuser'}" in log
        assert f"{private} (mode 0700, owner root) may not be entered" in log
        assert "scripts/setup makes .venv from one every user may run" in log
        assert hub.accounts() == []
    finally:
        hub.close()

    hub = Hub(tmp_path / "unchecked", nvml, PROFILES, extra_config=wrong)  # no configure(): the spawn says it
    hub.start()
    try:
        hub.add_users("ada")
        r = hub.spawn("ada", {"profile": "cpu"})
        assert r.status_code == 503, r.text
        message = r.json()["message"]
        assert message.startswith("This hub cannot start your server: servers run as accounts the hub makes, "
                                  f"which cannot run {venv / 'jupyterhub-singleuser'}")
        assert f"{private} (mode 0700, owner root) may not be entered" in message
        assert hub.user("ada")["servers"] == {} and hub.accounts() == []
        assert not [p for p in hub.marked_pids() if pid_alive(p)]
    finally:
        hub.close()
