"""GPU health on gpu-slurm, on the session's real Slurm cluster: an administrator (or a health check program)
drains the node with a reason (``scontrol update nodename=... state=drain reason=...``); a real hub's form,
/hub/gpus, /hub/api/gpus/health and Prometheus say so with Slurm's reason and time, and the user whose job
runs there is told in JupyterLab; resumed, the node's GPUs are back."""

from __future__ import annotations

import json
import re

import pytest

from clusterhealth import HEALTH_CONFIG, cluster_outages, form_of, health_notice, healthy_metric, outage_row
from hub import login
from slurmhub import OVERVIEW_CONFIG, add_user, running_hub
from test_ops_overview import user_token, wait_for
from test_slurm_hub import start

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

REASON = "XID 79 seen by the health check"
A100 = "A100 (gpu:a100)"


def test_a_drained_node_leaves_the_form_with_slurms_reason_and_its_users_are_told(
        slurm_cluster, slurm_gpus, tmp_path):
    node = slurm_cluster.host
    with running_hub(tmp_path / "hub", slurm_cluster, slurm_gpus, OVERVIEW_CONFIG + HEALTH_CONFIG) as hub:
        add_user(hub, "ann")
        add_user(hub, "boss")
        boss_session = login(hub, "boss")
        boss = user_token(hub, boss_session, "boss")
        start(hub, "ann")
        assert wait_for(lambda: healthy_metric(hub, node, "a100") == "1.0", 30, 0.3), hub.log()
        assert cluster_outages(hub, boss) == []
        try:
            slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={REASON}")
            assert health_notice(hub, "ann") == (
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
            assert wait_for(lambda: f"{A100}: none usable, 2 {A100} out of service" in form_of(boss_session, hub),
                            30, 0.3)
            page = boss_session.get(hub.url + "/hub/gpus", timeout=30).text
            row = outage_row(page, node, "a100")
            assert REASON in row and "2 of 2" in row and "ann/" in row and re.search(r"20\d\d-\d\d-\d\d", row)
            assert healthy_metric(hub, node, "a100", 0) == "0.0" and healthy_metric(hub, node, "a100", 1) == "0.0"
        finally:
            slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
        # resumed by an administrator: back in service
        assert wait_for(lambda: cluster_outages(hub, boss) == [], 30, 0.3), hub.log()
        assert healthy_metric(hub, node, "a100") == "1.0"
        assert wait_for(lambda: f"{A100}: 1 of 2 free" in form_of(boss_session, hub), 30, 0.3)
        hub.stop_server("ann", timeout=60)
