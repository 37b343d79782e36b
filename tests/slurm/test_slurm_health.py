"""GPU health on gpu-slurm, on the session's real Slurm cluster: an administrator (or a health check program)
drains the node with a reason (``scontrol update nodename=... state=drain reason=...``); a real hub's form,
/hub/gpus, /hub/api/gpus/health and Prometheus say so with Slurm's reason and time, and the user whose job
runs there is told in JupyterLab; resumed, the node's GPUs are back."""

from __future__ import annotations

import html
import json
import re

import pytest
import requests

from hub import login
from slurmhub import OVERVIEW_CONFIG, add_user, running_hub
from test_ops_culler import notices
from test_ops_overview import user_token, wait_for
from test_slurm_hub import start

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

HEALTH_CONFIG = OVERVIEW_CONFIG + """
c.Authenticator.admin_users = {"boss"}
c.JupyterHub.authenticate_prometheus = False
c.GPUSpawnerMixin.gpu_health_poll_interval = 1.0
"""
REASON = "XID 79 seen by the health check"
A100 = "A100 (gpu:a100)"


def cluster_outages(hub, token: str) -> list[dict]:
    r = requests.get(hub.url + "/hub/api/gpus/health", headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["cluster"]


def healthy_metric(hub, node: str, n: int = 0) -> str | None:
    text = requests.get(hub.url + "/hub/metrics", timeout=30).text
    found = re.search(rf'gpuspawner_gpu_healthy\{{gpu="{node}/a100/{n}",host="{node}",model="a100"\}} (\S+)', text)
    return found.group(1) if found else None


def test_a_drained_node_leaves_the_form_with_slurms_reason_and_its_users_are_told(
        slurm_cluster, slurm_gpus, tmp_path):
    node = slurm_cluster.host
    with running_hub(tmp_path / "hub", slurm_cluster, slurm_gpus, HEALTH_CONFIG) as hub:
        add_user(hub, "ann")
        add_user(hub, "boss")
        boss_session = login(hub, "boss")
        boss = user_token(hub, boss_session, "boss")
        start(hub, "ann")
        assert wait_for(lambda: healthy_metric(hub, node) == "1.0", 30, 0.3), hub.log()
        assert cluster_outages(hub, boss) == []
        try:
            slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={REASON}")
            told = wait_for(lambda: [n for n in notices(hub, "ann", hub.token) if n["source"] == "gpu-health"],
                            30, 0.3)
            assert told, hub.log()
            assert told[0]["level"] == "error"
            assert told[0]["message"] == (
                f"Node {node}, where this server runs, has 2 of its 2 {A100} GPUs out of service: {REASON}. "
                "Your server uses one of them: save your work now; what runs on it may fail or give wrong results. "
                "Stop this server and start it again to get a healthy GPU.")
            # since when: Slurm's own time of the reason
            listed = json.loads(slurm_cluster.run("sinfo", "--json").stdout)["nodes"][0]
            outages = {o["model"]: o for o in cluster_outages(hub, boss)}
            assert sorted(outages) == ["a100", "t4"]
            assert (outages["a100"]["node"], outages["a100"]["out"], outages["a100"]["reason"],
                    outages["a100"]["since"], outages["a100"]["affected"]) == (
                node, 2, REASON, listed["reason_changed_at"], ["ann/"])
            # out of what the form offers; /hub/gpus and Prometheus say so
            form = boss_session.get(hub.url + "/hub/spawn", timeout=30).text
            assert f"{A100}: none usable, 2 {A100} out of service" in form
            page = boss_session.get(hub.url + "/hub/gpus", timeout=30).text
            row = html.unescape(re.search(rf'<tr data-node="{node}" data-model="a100">.*?</tr>', page, re.S).group(0))
            assert REASON in row and "2 of 2" in row and "ann/" in row and re.search(r"20\d\d-\d\d-\d\d", row)
            assert healthy_metric(hub, node, 0) == "0.0" and healthy_metric(hub, node, 1) == "0.0"
        finally:
            slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
        # resumed by an administrator: back in service
        assert wait_for(lambda: cluster_outages(hub, boss) == [], 30, 0.3), hub.log()
        assert healthy_metric(hub, node) == "1.0"
        assert f"{A100}: 1 of 2 free" in boss_session.get(hub.url + "/hub/spawn", timeout=30).text
        hub.stop_server("ann", timeout=60)
