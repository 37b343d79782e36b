"""GPU health where the cluster places the GPUs: what gpu-kube reads from a node's capacity and allocatable,
what gpu-slurm reads from a drained node, what the hub keeps of it and how Prometheus sees it. Pure: the
same node and job objects the real cluster answers (recorded), no cluster; tests/kube and tests/slurm show
it on the real ones."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.backends.kube.capacity import CapacityError, cluster_inventory, place, pools
from gpuspawner.backends.kube.dev.kubelet import gpu_node
from gpuspawner.backends.kube.health import node_health as kube_health
from gpuspawner.backends.slurm.capacity import GresTypes, gpu_availability, read_nodes
from gpuspawner.backends.slurm.health import hosts, node_health as slurm_health
from gpuspawner.backends.slurm.queue import SlurmJob, job_comment
from gpuspawner.health_cluster import ClusterHealth, NodeHealth
from gpuspawner.hub.health import read_cluster
from gpuspawner.hub.overview import own_view
from gpuspawner.state import GPUHubSettings, HubState

A100 = "a100-sxm4-80gb"
SLURM_FIXTURES = Path(__file__).resolve().parents[1] / "slurm" / "fixtures"


def node(name: str, gpus: int, unhealthy: int) -> dict:
    """A node whose device plugin left ``unhealthy`` of its ``gpus`` out of its allocatable."""
    made = gpu_node(name, gpus=gpus)
    made["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    made["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus - unhealthy)
    return made


def pod(name: str, node_name: str, gpus: int, user: str) -> dict:
    return {"metadata": {"name": name, "namespace": "hub", "labels": {"component": "singleuser-server"},
                         "annotations": {"hub.jupyter.org/username": user}},
            "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}


def test_a_device_the_plugin_drops_from_allocatable_is_out_of_service_on_the_form():
    nodes = [node("a", 2, 1), node("b", 1, 0)]
    [a100] = pools(cluster_inventory(nodes, [pod("p", "b", 1, "ann")]))
    assert (a100.free, a100.total, a100.unavailable) == (1, 2, 1)
    assert a100.availability().card == ("NVIDIA-A100-SXM4-80GB: 1 of 2 free, 1 NVIDIA-A100-SXM4-80GB "
                                        "out of service")
    # a node whose every device is unhealthy (allocatable 0) still shows what it has
    [gone] = pools(cluster_inventory([node("c", 2, 2)], []))
    assert (gone.free, gone.total, gone.unavailable, gone.max_per_node) == (0, 0, 2, 2)


def test_kube_health_names_the_node_why_and_only_the_pods_that_must_hold_a_failed_gpu():
    nodes = [node("one", 1, 1), node("two", 2, 1), node("fine", 2, 0)]
    pods = [pod("jupyter-ann", "one", 1, "ann"), pod("jupyter-bob", "two", 1, "bob"),
            pod("jupyter-cy", "two", 1, "cy"), pod("jupyter-dan", "fine", 2, "dan")]
    found = {n.node: n for n in kube_health(nodes, pods)}
    assert found["one"].out == 1 and found["one"].affected == ("ann/",)  # its only GPU failed: it is ann's
    assert found["two"].out == 1 and found["two"].affected == ()  # bob's or cy's: the plugin does not say which
    assert found["two"].reason == ("the NVIDIA device plugin reports 1 of 2 nvidia.com/gpu unhealthy "
                                   "(left out of the node's allocatable)")
    assert (found["fine"].out, found["fine"].reason, found["fine"].total) == (0, "", 2)
    # one pod holding both GPUs of a node with one failed: certainly on it
    both = kube_health([node("two", 2, 1)], [pod("jupyter-eve", "two", 2, "eve")])
    assert both[0].affected == ("eve/",)


def slurm_nodes(name: str):
    return read_nodes((SLURM_FIXTURES / name).read_text())


def test_a_drained_slurm_node_is_out_with_slurms_reason_and_time_and_its_jobs_users():
    nodes = slurm_nodes("sinfo-drained.json")
    running = SlurmJob("7", "RUNNING", "None", "gpu", comment=job_comment("hub1", "ann", ""), nodes="vm",
                       gpus="gres:gpu:a100:1")
    untyped = SlurmJob("6", "RUNNING", "None", "gpu", comment=job_comment("hub1", "dee", ""), nodes="vm",
                       gpus="gres:gpu:1")
    elsewhere = SlurmJob("8", "RUNNING", "None", "gpu", comment=job_comment("other-hub", "bob", ""), nodes="vm",
                         gpus="gres:gpu:t4:1")
    waiting = SlurmJob("9", "PENDING", "Resources", "gpu", comment=job_comment("hub1", "cy", "x"), gpus="gres:gpu:1")
    found = slurm_health(nodes, [running, untyped, elsewhere, waiting], GresTypes(), "hub1")
    assert [(n.model, n.out, n.total, n.reason, n.since, n.affected) for n in found] == [
        ("a100", 2, 2, "maintenance", 1795423853.0, ("ann/", "dee/")),
        ("t4", 2, 2, "maintenance", 1795423853.0, ("dee/",))]
    assert {a.slug: a.card for a in gpu_availability(nodes, GresTypes())}["a100"] == \
        "A100 (gpu:a100): none usable, 2 A100 (gpu:a100) out of service"
    assert all(n.out == 0 and n.reason == "" for n in slurm_health(slurm_nodes("sinfo-idle.json"), [running],
                                                                  GresTypes(), "hub1"))


def test_a_node_down_without_a_reason_says_its_state_and_power_saving_is_no_outage():
    data = json.loads((SLURM_FIXTURES / "sinfo-idle.json").read_text())
    down, powered = copy.deepcopy(data), copy.deepcopy(data)
    down["nodes"][0].update(state="down", state_flags=["NOT_RESPONDING"], reason="", reason_changed_at=0)
    powered["nodes"][0].update(state="idle", state_flags=["POWERED_DOWN"])
    [a100, _] = slurm_health(read_nodes(down), [], GresTypes(), "hub1")
    assert (a100.out, a100.reason, a100.since) == (2, "Slurm lists the node as down not_responding (no reason given)",
                                                   None)
    assert all(n.out == 0 for n in slurm_health(read_nodes(powered), [], GresTypes(), "hub1"))


def test_slurm_hostlists_expand_to_node_names():
    assert hosts("gpu[01-03,7],login") == {"gpu01", "gpu02", "gpu03", "gpu7", "login"}
    assert hosts("vm") == {"vm"} and hosts("") == set()


def test_the_hub_keeps_since_when_it_first_saw_an_outage_the_cluster_gives_no_time_for():
    now = [1000.0]
    health = ClusterHealth(clock=lambda: now[0])
    out = NodeHealth("n", A100, "A100", 2, 1, "unhealthy", None, ("ann/",))
    drained = NodeHealth("s", "t4", "T4", 2, 2, "maintenance", 500.0)
    went, back = health.update([out, drained])
    assert {n.node for n in went} == {"n", "s"} and back == ()
    now[0] = 1060.0
    went, back = health.update([out, drained])
    assert went == () and {n.node: n.since for n in health.outages()} == {"n": 1000.0, "s": 500.0}
    went, back = health.update([NodeHealth("n", A100, "A100", 2), drained])
    assert [n.node for n in back] == ["n"] and [n.node for n in health.outages()] == ["s"]
    health.failed("sinfo did not answer")
    assert health.unknown == "sinfo did not answer" and [n.node for n in health.outages()] == ["s"]


def test_prometheus_counts_a_nodes_gpus_out_of_service_numbered_per_node_and_model():
    state = HubState(GPUHubSettings(config=Config({"GPUHubSettings": {"gpu_inventory": "static"}})))
    state.health.cluster.update([NodeHealth("n", A100, "A100", 3, 1, "unhealthy"), NodeHealth("m", "t4", "T4", 1)])
    [healthy] = [m for m in state.metrics.collect() if m.name == "gpuspawner_gpu_healthy"]
    assert {(s.labels["gpu"], s.labels["host"], s.labels["model"], s.value) for s in healthy.samples} == {
        (f"n/{A100}/0", "n", A100, 1), (f"n/{A100}/1", "n", A100, 1), (f"n/{A100}/2", "n", A100, 0),
        ("m/t4/0", "m", "t4", 1)}
    state.close()


def test_a_request_only_the_unhealthy_devices_would_fit_is_refused_saying_so():
    with pytest.raises(CapacityError) as refused:
        place(cluster_inventory([node("a", 2, 1)], []), (A100,), 2)
    assert refused.value.code == "none_free"
    assert str(refused.value) == (
        "No NVIDIA-A100-SXM4-80GB is free right now: 1 of 1 free, at most 1 on one node, and you asked for 2. "
        "1 more is unavailable: node not ready or cordoned, or GPU unhealthy. Pick another model or try again later.")


class Reader:
    """A cluster health reader answering what a test sets (a RuntimeError: the cluster does not answer)."""

    def __init__(self) -> None:
        self.answer: list[NodeHealth] | RuntimeError = []

    async def read(self) -> list[NodeHealth]:
        if isinstance(self.answer, RuntimeError):
            raise self.answer
        return self.answer


async def test_a_reading_that_fails_keeps_the_last_one_and_says_why_and_a_return_wakes_the_queue():
    state = HubState(GPUHubSettings(config=Config({"GPUHubSettings": {"gpu_inventory": "static"}})))
    woken = []
    state.queue.wake = lambda: woken.append(1)
    reader = Reader()
    reader.answer = [NodeHealth("n", A100, "A100", 2, 2, "drained", 7.0, ("ann/",))]
    await read_cluster(state, reader)
    assert [n.node for n in state.health.cluster.outages()] == ["n"] and state.health.cluster.unknown is None
    reader.answer = RuntimeError("sinfo did not answer within 10s")
    await read_cluster(state, reader)
    assert state.health.cluster.unknown == "sinfo did not answer within 10s"
    assert [n.node for n in state.health.cluster.outages()] == ["n"] and woken == []
    reader.answer = [NodeHealth("n", A100, "A100", 2)]
    await read_cluster(state, reader)
    assert state.health.cluster.outages() == () and woken == [1] and state.health.cluster.unknown is None
    state.close()


def test_a_user_sees_only_the_cluster_outages_under_their_own_servers():
    data = {"gpus": [], "cluster": [], "queue": [], "cluster_outages": [
        NodeHealth("n", A100, "A100", 1, 1, "bad", 1.0, ("ann/",)).to_dict(),
        NodeHealth("m", A100, "A100", 2, 1, "bad", 1.0, ()).to_dict()]}
    assert [n["node"] for n in own_view(data, "ann")["cluster_outages"]] == ["n"]
    assert own_view(data, "bob")["cluster_outages"] == []


def test_a_node_with_a_health_taint_has_all_its_gpus_out_and_every_user_on_it_told():
    tainted = node("t", 2, 0)
    tainted["spec"]["taints"] = [{"key": "example.com/gpu-unhealthy", "value": "XID79", "effect": "NoExecute",
                                  "timeAdded": "2026-11-26T10:00:00Z"}]
    pods = [pod("jupyter-ann", "t", 1, "ann"), pod("jupyter-bob", "t", 1, "bob")]
    [a100] = pools(cluster_inventory([tainted, node("b", 1, 0)], [], ["example.com/gpu-unhealthy"]))
    assert (a100.free, a100.total, a100.unavailable) == (1, 1, 2)
    [found] = kube_health([tainted], pods, unhealthy_taints=["example.com/gpu-unhealthy"])
    assert (found.out, found.total, found.affected, found.since) == (2, 2, ("ann/", "bob/"), 1795687200.0)
    assert found.reason == ("the node is tainted example.com/gpu-unhealthy=XID79 (NoExecute): its GPUs are out of "
                            "service")
    # a taint that is not named changes nothing
    assert kube_health([tainted], pods)[0].out == 0


@pytest.mark.parametrize("key", ["has space", "/name", "a/b/c", "", "x" * 64])
def test_a_health_taint_that_is_no_taint_key_is_refused_naming_the_setting(key):
    from gpuspawner.backends.kube.health import KubeHealthMixin

    with pytest.raises(TraitError, match="kube_gpu_health_taints"):
        KubeHealthMixin(kube_gpu_health_taints=[key])
    assert KubeHealthMixin(kube_gpu_health_taints=["example.com/gpu-unhealthy", "gpu-bad"]).kube_gpu_health_taints
