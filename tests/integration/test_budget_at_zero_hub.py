"""A running server (and job) whose user's GPU budget runs out, on a real hub with real servers and their
monitors: warned in its JupyterLab notice board, then stopped with the usage end reason ``budget`` (its
job cancelled), or, with ``gpu_budget_at_zero = "finish"``, left running while a new GPU server is refused;
a hub restart in between tells nothing twice.

The budgets are tiny (hundredths of a GPU-hour: seconds) so that a test takes about a minute."""

from __future__ import annotations

import time

import pytest
import requests

from hub import login
from jobnotebooks import write
from ops_hub import OpsHub
from test_ops_culler import notices
from test_ops_overview import user_token, wait_for
from test_usage_accounting import allocations

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
            {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1, 2],
             "default": True}]
T4 = {"profile": "gpu", "gpus": 1, "gpu_model": "t4"}
WARN_BEFORE = 40
SLEEPING_NOTEBOOK = "import time\ntime.sleep(600)"


def budget_hub(tmp_path, libdir, at_zero: str, hours: float, group: bool = False) -> OpsHub:
    """A hub where ann's budget (her own, or her group ml's) is ``hours`` a day."""
    budget = {"hours": hours, "period": "day"}
    mixin = {"gpu_budget_per_group": {"ml": budget}} if group else {"gpu_budget_per_user": budget}
    return OpsHub(tmp_path, libdir, PROFILES, groups={"ml": ["ann"]},
                  mixin={**mixin, "gpu_budget_at_zero": at_zero, "gpu_budget_warn_before": WARN_BEFORE})


def budget_notice(hub, name: str, token: str, level: str | None = None) -> dict | None:
    found = [n for n in notices(hub, name, token) if n["id"] == "gpu-budget"]
    return found[0] if found and (level is None or found[0]["level"] == level) else None


def board_until(hub, name: str, token: str, level: str, timeout: float = 120) -> tuple[dict | None, set]:
    """Read ``name``'s notice board every half second until its budget notice has ``level``: that notice
    (None after ``timeout``), and the (level, time) of every budget notice seen on the way (a notice posted
    again gets a new time; the watcher posts at most once per 5 s round)."""
    seen, deadline = set(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = budget_notice(hub, name, token)
        if found is not None:
            seen.add((found["level"], found["time"]))
            if found["level"] == level:
                return found, seen
        time.sleep(0.5)
    return None, seen


def test_a_server_and_a_job_are_warned_then_stopped_when_the_budget_is_spent(tmp_path, fakenvml_libdir):
    hub = budget_hub(tmp_path, fakenvml_libdir, "stop", hours=0.025)  # 90 GPU-seconds
    hub.start()
    try:
        hub.add_users("ann", "bob")
        token = user_token(hub, login(hub, "ann"), "ann")
        assert hub.spawn("ann", T4).status_code in (201, 202)
        hub.wait_ready("ann")
        write(hub.home("ann") / "sleeps.ipynb", SLEEPING_NOTEBOOK)
        r = requests.post(f"{hub.url}/hub/api/users/ann/gpu-jobs", timeout=60,
                          headers={"Authorization": f"token {token}"},
                          json={"notebook": "sleeps.ipynb", "profile": "gpu", "gpus": 1, "gpu_model": "t4"})
        assert r.status_code == 201, r.text
        job = r.json()["id"]

        warned = wait_for(lambda: budget_notice(hub, "ann", token, "warning"), 90, 0.5)
        assert warned, hub.log()
        assert warned["source"] == "gpu-budgets"
        assert warned["message"].startswith("Your GPU budget runs out in ")
        assert "at the GPUs you hold now: " in warned["message"]
        assert warned["message"].endswith("This server will be stopped then; save your work before.")

        assert wait_for(lambda: not hub.user("ann")["servers"], 90, 0.5), hub.log()
        rows = {a["owner"]: a for a in allocations(hub, user="ann")}
        assert rows["ann/"]["end_reason"] == "budget"
        assert wait_for(lambda: rows.update({a["owner"]: a for a in allocations(hub, user="ann")})
                        or rows[f"ann/job/{job}"]["end_reason"], 60, 0.5) == "budget"
        r = requests.get(f"{hub.url}/hub/api/users/ann/gpu-jobs/{job}", timeout=30,
                         headers={"Authorization": f"token {token}"})
        assert r.json()["state"] == "cancelled"
        assert r.json()["reason"] == "cancelled: its user's GPU budget was spent"
    finally:
        hub.close()


def test_with_finish_the_server_runs_on_told_once_across_a_restart_and_new_gpus_are_refused(
        tmp_path, fakenvml_libdir):
    hub = budget_hub(tmp_path, fakenvml_libdir, "finish", hours=0.025, group=True)  # 90 GPU-seconds
    hub.start()
    try:
        hub.add_users("ann")
        token = user_token(hub, login(hub, "ann"), "ann")
        assert hub.spawn("ann", T4).status_code in (201, 202)
        hub.wait_ready("ann")
        warned = wait_for(lambda: budget_notice(hub, "ann", token, "warning"), 90, 0.5)
        assert warned, hub.log()
        assert warned["message"].startswith("The GPU budget of group 'ml' runs out in ")
        assert "This server will be allowed to finish; new GPU servers will be refused until " in warned["message"]

        hub.restart()  # the server runs on; the new hub reads its board and tells it nothing again
        assert budget_notice(hub, "ann", token, "warning") == warned  # (the budget is not spent yet)

        spent, seen = board_until(hub, "ann", token, "error")
        assert spent, hub.log()
        assert spent["message"].startswith("The GPU budget of group 'ml' is spent: ")
        assert "This server is allowed to finish; new GPU servers will be refused until " in spent["message"]
        assert {n for n in seen if n[0] == "warning"} == {("warning", warned["time"])}  # not warned again
        assert hub.user("ann")["servers"][""]["ready"]
        (row,) = [a for a in allocations(hub, user="ann") if a["owner"] == "ann/"]
        assert row["ended"] is None

        r = requests.post(f"{hub.url}/hub/api/users/ann/servers/more", timeout=60, json=T4,
                          headers={"Authorization": f"token {token}"})
        assert r.status_code == 422, r.text
        assert hub.user("ann")["servers"][""]["ready"]  # still up after its budget was spent
    finally:
        hub.close()
