"""GPU health on a real hub over the stand-in NVML: an injected XID takes a GPU out of placement, the user
on it is told in JupyterLab, the form, /hub/gpus and Prometheus say so; it comes back when its condition
has cleared and an administrator confirms; an ignored XID changes nothing; nobody else may confirm."""

from __future__ import annotations

import re

import pytest
import requests

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import login
from ops_hub import OpsHub
from test_local_hub import start
from test_ops_culler import notices
from test_ops_overview import user_token, wait_for

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1],
             "default_gpus": 1, "default": True}]
A100 = "NVIDIA A100-SXM4-80GB"
ONE_A100 = {"profile": "gpu", "gpus": 1, "gpu_model": "a100-sxm4-80gb"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory, fakenvml_libdir):
    devices = simulated_config(a100=2, t4=1)
    for device in devices["devices"]:
        if device["name"] == A100:  # an A100 counts its uncorrected ECC errors and remaps rows
            device["ecc_errors"] = {"corrected": 0, "uncorrected": 0}
            device["remapped_rows"] = {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    hub = OpsHub(tmp_path_factory.mktemp("health"), fakenvml_libdir, PROFILES, devices=devices,
                 mixin={"gpu_health_poll_interval": 1.0})
    hub.start()
    try:
        hub.add_users("ann", "bob", "boss")
        yield hub
    finally:
        hub.close()


def change(hub, uuid: str, **keys) -> None:
    """Rewrite one device of the stand-in's file (it reloads it live)."""
    for device in hub.gpus_config["devices"]:
        if device["uuid"] == uuid:
            device.update(keys)
    fakenvml.write_config(hub.gpus_path, hub.gpus_config)


def out_of_service(hub, token: str) -> dict[str, dict]:
    r = requests.get(hub.url + "/hub/api/gpus/health", headers={"Authorization": f"token {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return {o["uuid"]: o for o in r.json()["out_of_service"]}


def confirm(hub, uuid: str, token: str, body: object = None) -> requests.Response:
    return requests.post(f"{hub.url}/hub/api/gpus/health/{uuid}", headers={"Authorization": f"token {token}"},
                         json={"healthy": True} if body is None else body, timeout=30)


def healthy_metric(hub, uuid: str) -> str | None:
    text = requests.get(hub.url + "/hub/metrics", headers={"Authorization": f"token {hub.reader_token}"},
                        timeout=30).text
    found = re.search(rf'gpuspawner_gpu_healthy\{{gpu="{uuid}",host="[^"]+",model="a100-sxm4-80gb"\}} (\S+)', text)
    return found.group(1) if found else None


def test_a_critical_xid_takes_a_gpu_out_and_an_admin_brings_it_back(hub):
    boss = user_token(hub, login(hub, "boss"), "boss")
    ann_session = login(hub, "ann")
    ann = user_token(hub, ann_session, "ann")
    a100s = [d["uuid"] for d in hub.gpus_config["devices"] if d["name"] == A100]
    (mine,) = start(hub, "ann", ONE_A100)
    (other,) = set(a100s) - {mine}

    # an XID NVIDIA's device plugin ignores (13: one application's error) changes nothing, a critical one does
    change(hub, mine, xid_events=[13])
    change(hub, other, xid_events=[79])
    assert wait_for(lambda: other in out_of_service(hub, boss), 30, 0.3), hub.log()
    assert mine not in out_of_service(hub, boss)
    outage = out_of_service(hub, boss)[other]
    assert outage["reason"] == "XID 79 (GPU has fallen off the bus)"

    # out of placement at once: bob's spawn asking for an A100 is refused with the reason
    r = hub.spawn("bob", ONE_A100)
    assert r.status_code == 409, r.text
    assert "1 more is unavailable: XID 79 (GPU has fallen off the bus)" in r.json()["message"]
    assert hub.user("bob")["servers"] == {}
    # the form's card says it, /hub/gpus says why and since when, Prometheus reads 0
    form = login(hub, "bob").get(hub.url + "/hub/spawn", timeout=30).text
    assert f"{A100}: 0 of 1 free, 1 {A100} out of service" in form
    page = login(hub, "boss").get(hub.url + "/hub/gpus", timeout=30).text
    row = re.search(rf'<tr data-uuid="{other}".*?</tr>', page, re.S).group(0)
    assert "XID 79 (GPU has fallen off the bus)" in row and "out of service since 20" in row
    assert f'data-gpu-health="{other}"' in row  # the button that brings it back
    assert healthy_metric(hub, other) == "0.0" and healthy_metric(hub, mine) == "1.0"

    # the GPU ann's server holds fails too: she is told in JupyterLab what happened and what to do
    change(hub, mine, xid_events=[13, 48])
    told = wait_for(lambda: [n for n in notices(hub, "ann", ann) if n["source"] == "gpu-health"], 30, 0.3)
    assert told, hub.log()
    assert told[0]["level"] == "error"
    assert told[0]["message"] == (
        f"The GPU this server uses ({A100}, {mine}) has failed: XID 48 (double-bit ECC error). Save your work "
        "now; what runs on it may fail or give wrong results. Stop this server and start it again to get a "
        "healthy GPU.")

    # only an administrator brings it back, and only once its condition has cleared
    assert confirm(hub, other, ann).status_code == 403
    assert confirm(hub, other, boss, {"healthy": "yes"}).status_code == 400
    assert other in out_of_service(hub, boss)
    assert wait_for(lambda: out_of_service(hub, boss)[other]["cleared"], 30, 0.3)  # it answers NVML again
    r = confirm(hub, other, boss)
    assert r.status_code == 200 and r.json()["healthy"] is True, r.text
    assert other not in out_of_service(hub, boss)
    assert healthy_metric(hub, other) == "1.0"
    (bobs,) = start(hub, "bob", ONE_A100)
    assert bobs == other
    hub.stop_server("bob")
    hub.stop_server("ann")
    wait_for(lambda: out_of_service(hub, boss)[mine]["cleared"], 30, 0.3)
    assert confirm(hub, mine, boss).status_code == 200


def test_pending_row_remaps_keep_a_gpu_out_until_they_clear(hub):
    boss = user_token(hub, login(hub, "boss"), "boss")
    gpu = next(d["uuid"] for d in hub.gpus_config["devices"] if d["name"] == A100)
    change(hub, gpu, remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False})
    assert wait_for(lambda: gpu in out_of_service(hub, boss), 30, 0.3), hub.log()
    assert out_of_service(hub, boss)[gpu]["reason"] == "row remapping pending: the GPU needs a reset"
    r = confirm(hub, gpu, boss)
    assert r.status_code == 409
    assert r.json()["message"] == (f"GPU {gpu} is still unhealthy: row remapping pending: the GPU needs a reset. "
                                   "It can come back once that has cleared.")
    change(hub, gpu, remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": False, "failure": False})
    assert wait_for(lambda: out_of_service(hub, boss)[gpu]["cleared"], 30, 0.3)
    assert confirm(hub, gpu, boss).status_code == 200
    assert gpu not in out_of_service(hub, boss)


def test_a_gpu_fallen_off_the_bus_stays_listed_out_of_service_until_it_answers_again(hub):
    boss = user_token(hub, login(hub, "boss"), "boss")
    t4 = next(d for d in hub.gpus_config["devices"] if d["name"] == "Tesla T4")
    change(hub, t4["uuid"], faults={"*": "GPU_IS_LOST"})
    assert wait_for(lambda: t4["uuid"] in out_of_service(hub, boss), 30, 0.3), hub.log()
    assert out_of_service(hub, boss)[t4["uuid"]]["reason"] == "GPU is lost (fell off the bus or stopped responding)"
    # NVML no longer names it, yet the admins' overview still lists it, out of service
    (listed,) = [g for g in hub.overview().json()["gpus"] if g["uuid"] == t4["uuid"]]
    assert listed["health"] == "GPU is lost (fell off the bus or stopped responding)"
    assert confirm(hub, t4["uuid"], boss).status_code == 409
    change(hub, t4["uuid"], faults={})
    assert wait_for(lambda: out_of_service(hub, boss)[t4["uuid"]]["cleared"], 30, 0.3)
    assert confirm(hub, t4["uuid"], boss).status_code == 200


def test_what_is_out_of_service_stays_out_when_the_hub_restarts(hub):
    boss = user_token(hub, login(hub, "boss"), "boss")
    t4 = next(d["uuid"] for d in hub.gpus_config["devices"] if d["name"] == "Tesla T4")
    r = confirm(hub, t4, boss, {"healthy": False, "reason": "fan noise"})
    assert r.status_code == 200 and r.json()["healthy"] is False, r.text
    before = out_of_service(hub, boss)[t4]
    hub.restart()
    after = out_of_service(hub, boss)[t4]
    assert (after["reason"], after["since"], after["manual"]) == (
        "taken out by an administrator: fan noise", before["since"], True)
    assert "1 Tesla T4 out of service" in login(hub, "boss").get(hub.url + "/hub/spawn", timeout=30).text
    assert confirm(hub, t4, boss).status_code == 200
    hub.restart()
    assert out_of_service(hub, boss) == {}


def test_a_gpu_coming_back_wakes_the_queue(tmp_path, fakenvml_libdir):
    """With re-checks 10 minutes apart, only the GPU's return can start the waiting spawn."""
    queued = [{**PROFILES[0], "queue": True}]
    hub = OpsHub(tmp_path, fakenvml_libdir, queued, devices=simulated_config(a100=1, t4=0),
                 mixin={"gpu_queue_timeout": 900, "gpu_queue_recheck": 600})
    hub.start()
    try:
        hub.add_users("ann", "boss")
        boss = user_token(hub, login(hub, "boss"), "boss")
        (gpu,) = [d["uuid"] for d in hub.gpus_config["devices"]]
        assert confirm(hub, gpu, boss, {"healthy": False, "reason": "fan noise"}).status_code == 200
        assert hub.spawn("ann", {"profile": "gpu", "gpus": 1, "gpu_model": "any"}).status_code == 202
        assert wait_for(lambda: hub.overview().json()["queue"], 30, 0.3), hub.log()
        assert confirm(hub, gpu, boss).status_code == 200
        hub.wait_ready("ann", timeout=60)
        assert hub.server_env("ann")["CUDA_VISIBLE_DEVICES"] == gpu
    finally:
        hub.close()
