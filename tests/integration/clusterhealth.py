"""What the GPU health tests of the cluster backends (tests/kube/test_kube_health.py,
tests/slurm/test_slurm_health.py) read from a real hub: the API's cluster outages, the notice a user got,
the row of /hub/gpus, the metric."""

from __future__ import annotations

import html
import re

import requests

from test_ops_culler import notices
from test_ops_overview import wait_for

#: with ``configure(c)`` (the overview and the health watch): an administrator "boss", the metrics open,
#: the cluster's health read every second
HEALTH_CONFIG = """
c.Authenticator.admin_users = {"boss"}
c.JupyterHub.authenticate_prometheus = False
c.GPUSpawnerMixin.gpu_health_poll_interval = 1.0
"""


def cluster_outages(hub, token: str) -> list[dict]:
    """``GET /hub/api/gpus/health``'s ``cluster`` (an administrator's ``token``)."""
    r = requests.get(hub.url + "/hub/api/gpus/health", headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["cluster"]


def form_of(session: requests.Session, hub) -> str:
    """The spawn form as ``session``'s user sees it (its capacity reading may lag ``gpu_inventory_ttl`` behind the
    health reading: wait on it)."""
    return session.get(hub.url + "/hub/spawn", timeout=30).text


def health_notice(hub, name: str) -> str:
    """The GPU health notice ``name``'s server shows in JupyterLab (waited for): its message."""
    told = wait_for(lambda: [n for n in notices(hub, name, hub.token) if n["source"] == "gpu-health"], 30, 0.3)
    assert told, hub.log()
    assert told[0]["level"] == "error"
    return told[0]["message"]


def outage_row(page: str, node: str, model: str) -> str:
    """The text of the row of ``/hub/gpus``'s "Cluster GPUs out of service" for ``node`` and ``model``."""
    found = re.search(rf'<tr data-node="{node}" data-model="{model}">.*?</tr>', page, re.S)
    assert found, page
    return html.unescape(found.group(0))


def healthy_metric(hub, node: str, model: str, n: int = 0) -> str | None:
    """``gpuspawner_gpu_healthy`` of GPU ``n`` of ``model`` on cluster node ``node`` (None: not served)."""
    text = requests.get(hub.url + "/hub/metrics", timeout=30).text
    found = re.search(rf'gpuspawner_gpu_healthy\{{gpu="{node}/{model}/{n}",host="{node}",model="{model}"\}} (\S+)',
                      text)
    return found.group(1) if found else None
