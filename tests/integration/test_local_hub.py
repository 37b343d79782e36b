"""A real JupyterHub with gpu-local servers on the stand-in NVML's 4 simulated GPUs.

Each test starts its own hub process (loopback ports, private database) and
reads the GPUs a server got from the server process's own environment.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import Hub, login, xsrf_token

pytestmark = pytest.mark.integration

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpu_counts": [0]},
    {"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"],
     "gpu_counts": [0, 1, 2, 4], "default_gpus": 1, "default": True},
    {"slug": "t4", "display_name": "One T4", "gpu_models": ["t4"], "gpu_counts": [1], "default_gpus": 1},
]
TWO_GPUS = {"profile": "gpu", "gpus": 2, "gpu_model": "any"}


@pytest.fixture
def gpus_config():
    return simulated_config(a100=2, t4=2)


@pytest.fixture
def hub(tmp_path, fakenvml_libdir, gpus_config):
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, gpus_config)
    hub = Hub(tmp_path / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES)
    hub.start()
    try:
        yield hub
    finally:
        hub.close()


def gpu_set(env: dict[str, str]) -> set[str]:
    """The GPUs a server may use, checking that both variables agree."""
    cuda = env["CUDA_VISIBLE_DEVICES"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == (cuda or "void")
    return set(cuda.split(",")) if cuda else set()


def start(hub: Hub, name: str, options=TWO_GPUS) -> set[str]:
    r = hub.spawn(name, options)
    assert r.status_code in (201, 202), f"{r.status_code} {r.text}\n{hub.log()}"
    hub.wait_ready(name)
    return gpu_set(hub.server_env(name))


def test_two_users_get_disjoint_gpus_third_is_refused_and_stopping_frees(hub, gpus_config):
    uuids = {d["uuid"]: d["name"] for d in gpus_config["devices"]}
    hub.add_users("alice", "bob", "carol")

    alice = start(hub, "alice")
    bob = start(hub, "bob")
    assert len(alice) == len(bob) == 2
    assert alice.isdisjoint(bob)
    assert alice | bob == set(uuids)
    # all GPUs of one request are of one model
    assert len({uuids[u] for u in alice}) == 1 and len({uuids[u] for u in bob}) == 1

    r = hub.spawn("carol", TWO_GPUS)
    assert r.status_code == 409
    message = r.json()["message"]
    assert "No GPU is free right now: 0 of 4 free" in message, message
    assert hub.user("carol")["servers"] == {}

    hub.stop_server("alice")
    carol = start(hub, "carol")
    assert carol == alice
    assert carol.isdisjoint(bob)


def test_specific_model_and_cpu_only(hub, gpus_config):
    t4s = {d["uuid"] for d in gpus_config["devices"] if d["name"] == "Tesla T4"}
    hub.add_users("dana", "erin", "finn")
    assert start(hub, "dana", {"profile": "gpu", "gpus": 2, "gpu_model": "t4"}) == t4s
    assert start(hub, "erin", {"profile": "cpu"}) == set()
    # the server runs as erin's own account (never root), in its home
    pid = hub.user("erin")["servers"][""]["state"]["pid"]
    assert Path(f"/proc/{pid}/cwd").resolve() == hub.home("erin").resolve()
    uids = next(line.split()[1:] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("Uid:"))
    assert set(uids) == {str(hub.home("erin").stat().st_uid)} and uids[0] != "0"
    r = hub.spawn("finn", {"profile": "t4"})
    assert r.status_code == 409
    assert "T4" in r.json()["message"] and "0 of 2" in r.json()["message"]


def test_hub_restart_keeps_allocations(hub):
    hub.add_users("alice", "bob", "carol")
    alice = start(hub, "alice")
    bob = start(hub, "bob")
    pids = {n: hub.user(n)["servers"][""]["state"]["pid"] for n in ("alice", "bob")}

    hub.restart()

    for name, gpus in (("alice", alice), ("bob", bob)):
        server = hub.user(name)["servers"][""]
        assert server["ready"] and server["state"]["pid"] == pids[name]
        assert gpu_set(hub.server_env(name)) == gpus
    r = hub.spawn("carol", TWO_GPUS)
    assert r.status_code == 409, r.text

    hub.stop_server("bob")
    assert start(hub, "carol") == bob


MALFORMED = [
    # wrong container types (an empty body, [] and null mean "defaults" to JupyterHub itself)
    '"gpu"', "42", "[1, 2]", "true", '{"gpus": 2, "gpus": "2"}', '"{}"',
    # unknown keys
    {"gpu": 2}, {"GPUS": 2}, {"profile": "gpu", "gpus": 2, "extra": 1}, {"cpu_limit": 64},
    {"image_pull_policy": "Always"}, {"__proto__": {}}, {"": 1}, {"gpus ": 2},
    # gpus: wrong type, range, size
    {"gpus": "2"}, {"gpus": 2.0}, {"gpus": True}, {"gpus": None}, {"gpus": [2]},
    {"gpus": {"$gt": 0}}, {"gpus": -1}, {"gpus": 3}, {"gpus": 8}, {"gpus": 10**30},
    {"gpus": -(10**30)}, {"gpus": 1e308}, {"gpus": "NaN"}, {"gpus": "0x2"},
    # profile: unknown, wrong type, odd characters
    {"profile": "nope"}, {"profile": 1}, {"profile": None}, {"profile": ["gpu"]},
    {"profile": "GPU"}, {"profile": "gpu;rm -rf /"}, {"profile": "../gpu"}, {"profile": "g" * 500},
    {"profile": "gpu\u0000"}, {"profile": "gp\u00fc"},
    # gpu_model: unknown, not allowed by the profile, wrong type
    {"gpu_model": "h100", "gpus": 1}, {"gpu_model": "A100", "gpus": 1}, {"gpu_model": 100, "gpus": 1},
    {"gpu_model": "a100-sxm4-80gb", "profile": "t4"}, {"gpu_model": "<script>", "gpus": 1},
    {"gpu_model": ["t4"], "gpus": 1},
    # image: none offered, wrong type
    {"image": "evil/image:latest"}, {"image": 5}, {"image": "x" * 1000}, {"image": ""},
    # a profile's count not allowed
    {"profile": "t4", "gpus": 2}, {"profile": "cpu", "gpus": 1},
    # not JSON at all
    "{not json",
]


def test_malformed_bodies_are_refused_and_nothing_is_held(hub):
    assert len(MALFORMED) >= 50
    hub.add_users("mallory", "alice", "bob", "carol")
    for body in MALFORMED:
        data = body if isinstance(body, str) else json.dumps(body)
        r = hub.spawn("mallory", data)
        assert r.status_code == 400, f"{body!r}: {r.status_code} {r.text}"
        assert r.json()["message"], body
        assert hub.user("mallory")["servers"] == {}, body
    # nothing was held: all four GPUs are still free for two 2-GPU servers
    alice = start(hub, "alice")
    bob = start(hub, "bob")
    assert len(alice | bob) == 4
    assert hub.spawn("carol", TWO_GPUS).status_code == 409


def test_a_server_that_dies_at_start_gives_its_gpus_back(hub):
    hub.add_users("crash", "alice", "bob")
    # JupyterHub answers 201/202 or, when the process dies while it waits, an error of its own
    hub.spawn("crash", TWO_GPUS)
    deadline = time.monotonic() + 60
    while hub.user("crash")["servers"] and time.monotonic() < deadline:
        time.sleep(0.3)
    assert hub.user("crash")["servers"] == {}, hub.log()
    assert "crashing on purpose" in hub.log_path.read_text()
    assert len(start(hub, "alice") | start(hub, "bob")) == 4


def test_without_nvml_cpu_profiles_still_work(tmp_path, fakenvml_libdir):
    config = simulated_config()
    config["faults"] = {"nvmlInitWithFlags": "DRIVER_NOT_LOADED"}
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, config)
    hub = Hub(tmp_path / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES)
    hub.start()
    try:
        hub.add_users("ivy", "jon")
        assert start(hub, "ivy", {"profile": "cpu"}) == set()
        r = hub.spawn("jon", {"profile": "gpu", "gpus": 1})
        assert r.status_code == 409
        assert "no GPU" in r.json()["message"] or "No GPU" in r.json()["message"], r.json()
        html = login(hub, "kim").get(hub.url + "/hub/spawn").text
        assert "No GPUs were found on this hub" in html and "NVIDIA driver is not loaded" in html
        assert "only servers without a GPU are offered" in html
    finally:
        hub.close()


def test_refusal_names_the_field(hub):
    hub.add_users("mallory")
    r = hub.spawn("mallory", {"profile": "gpu", "gpus": 3})
    assert r.status_code == 400
    assert r.json()["message"].startswith("gpus:")
    assert "0, 1, 2, 4" in r.json()["message"]


def test_spawn_form_shows_simulated_gpus_and_starts_the_choice(hub, gpus_config):
    a100s = {d["uuid"] for d in gpus_config["devices"] if d["name"].startswith("NVIDIA A100")}
    web = login(hub, "gina")
    page = web.get(hub.url + "/hub/spawn")
    assert page.status_code == 200
    html = page.text
    assert "Simulated GPUs" in html
    assert "NVIDIA A100-SXM4-80GB - 2 of 2 free" in html
    assert "Tesla T4 - 2 of 2 free" in html
    assert 'name="gpus-gpu"' in html and 'name="gpu_model-gpu"' in html
    xsrf = xsrf_token(html)

    r = web.post(hub.url + "/hub/spawn", data={
        "_xsrf": xsrf, "profile": "gpu", "gpus-gpu": "2", "gpu_model-gpu": "a100-sxm4-80gb",
    })
    assert r.status_code == 200, r.text
    hub.wait_ready("gina")
    assert gpu_set(hub.server_env("gina")) == a100s

    # another user's form now shows the A100s as taken
    html = login(hub, "hank").get(hub.url + "/hub/spawn").text
    assert "NVIDIA A100-SXM4-80GB - 0 of 2 free" in html
    assert "Tesla T4 - 2 of 2 free" in html
    assert re.search(r'value="4"[^>]*disabled', html), "4 GPUs cannot be free: the option must be disabled"
