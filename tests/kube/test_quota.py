"""gpu-kube quotas: users' and groups' quotas count their pods' GPUs.

Real GPUKubeSpawners start and stop real KubeSpawner pods on the real control plane, the hub as its
ServiceAccount with the Helm chart's RBAC (``cluster``: the recorded pods in the test's namespace; the
real scheduler binds the new pods, the fake kubelet runs them). The hub's ledger counts each server's
GPUs (cluster tokens, per resource); after a restart it is rebuilt from the hub's single-user pods.
The pods' truth on recorded pods is tested pure.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
from tornado.web import HTTPError

from gpuspawner.backends.kube.holdings import server_holdings
from gpuspawner.ledger import cluster_holdings
from kubefixtures import HUB_CLUSTER_RULES, HUB_RULES, load_pods, without
from profiles import A100, PROFILES

GPU1 = {"profile": "gpu", "gpus": 1, "gpu_model": A100}
CPU = {"profile": "cpu"}
STUDENTS = "students"


async def start(spawner, options: dict) -> str:
    spawner.user_options = options
    await spawner._run_apply_user_options(options)
    return await asyncio.wait_for(spawner.start(), 60)


def counted(spawner) -> dict[str, dict[str, int]]:
    """owner -> resource -> GPUs, as the hub's ledger counts them."""
    return {owner: cluster_holdings(keys) for owner, keys in spawner.ledger.allocations().items()}


def refusals(spawner, reason: str) -> float:
    for metric in spawner.hub_state.metrics.collect():
        for sample in metric.samples:
            if sample.name == "gpuspawner_spawn_refusals_total" and sample.labels == {"reason": reason}:
                return sample.value
    return 0.0


def group(name: str, members: list[str]):
    from types import SimpleNamespace

    return SimpleNamespace(name=name, users=[SimpleNamespace(name=m) for m in members])


# ------------------------------------------------------------ the pods' truth (pure)


def test_the_hubs_pods_hold_their_gpu_requests(pod_items):
    found = server_holdings(pod_items)
    assert found.holdings == {
        "alice/": {"nvidia.com/gpu": 4},
        "bob/": {"nvidia.com/gpu": 6},  # two containers
        "carol/mig": {"nvidia.com/mig-1g.10gb": 2},  # a named server
        "dave/": {"nvidia.com/gpu.shared": 1},
        "erin/": {"nvidia.com/gpu.shared": 1},
        "frank/": {"nvidia.com/gpu.shared": 1},  # pending: asked for, so counted
    }
    assert found.unnamed == ()  # training jobs and system pods are not the hub's


def test_ended_deleting_other_hubs_and_unnamed_pods(pod_items):
    alice = next(p for p in pod_items if p["metadata"]["name"] == "jupyter-alice")

    def variant(name: str, **changes) -> dict:
        pod = copy.deepcopy(alice)
        pod["metadata"]["name"] = name
        for path, value in changes.items():
            where = pod
            *parents, last = path.split(".")
            for key in parents:
                where = where[key]
            where[last] = value
        return pod

    pods = [
        variant("done", **{"status.phase": "Succeeded"}),
        variant("failed", **{"status.phase": "Failed"}),
        variant("deleting", **{"metadata.deletionTimestamp": "2024-06-10T10:00:00Z"}),
        variant("other-hub", **{"metadata.labels": {"component": "singleuser-server-staging"}}),
        variant("no-annotation", **{"metadata.annotations": {}}),
        variant("cpu-only", **{"spec.containers": [{"name": "notebook", "resources": {"limits": {"cpu": "1"}}}]}),
    ]
    found = server_holdings(pods)
    assert found.holdings == {}
    assert found.unnamed == ("jhub/no-annotation",)
    assert server_holdings(pods, "singleuser-server-staging").holdings == {"alice/": {"nvidia.com/gpu": 4}}
    # two live pods of one server (a renamed pod template) both count
    assert server_holdings([alice, variant("jupyter-alice-old")]).holdings == {"alice/": {"nvidia.com/gpu": 8}}


# ------------------------------------------------------------ quotas through real spawns


async def test_a_second_gpu_server_over_the_quota_is_refused_while_the_first_pod_exists(
        cluster, make_spawner):
    first = make_spawner("zoe", gpu_profiles=PROFILES, gpu_quota_per_user=1)
    await start(first, GPU1)
    assert counted(first)["zoe/"] == {"nvidia.com/gpu": 1}
    second = make_spawner("zoe", "big")
    with pytest.raises(HTTPError) as e:
        await start(second, GPU1)
    assert e.value.status_code == 409
    assert e.value.jupyterhub_message == (
        "Your quota is 1 GPU and your servers hold 1 (servers: default); asking for 1 more would exceed it. "
        "Stop one of your servers or ask for fewer GPUs.")
    assert cluster.made_pods() == [first.pod_name]  # nothing was created for the refused server
    assert "zoe/big" not in counted(first)
    assert refusals(first, "quota_user") == 1
    # CPU-only servers are not limited
    notes = make_spawner("zoe", "notes")
    await start(notes, CPU)
    assert "zoe/notes" not in counted(first)
    await notes.stop(now=True)
    # stopping the first server gives its GPU back: the second now starts
    await first.stop(now=True)
    assert "zoe/" not in counted(first)
    await start(second, GPU1)
    assert counted(second)["zoe/big"] == {"nvidia.com/gpu": 1}
    assert cluster.made_pods() == [second.pod_name]
    await second.stop(now=True)
    assert [o for o in counted(second) if o.startswith("zoe/")] == []


async def test_concurrent_spawns_of_one_user_respect_the_quota(cluster, make_spawner):
    # gpu_inventory_ttl = 0: every spawn reads the cluster, so the spawns interleave at that read
    spawners = [make_spawner("zoe", name, gpu_profiles=PROFILES, gpu_quota_per_user=1, gpu_inventory_ttl=0)
                for name in ("", "a", "b")]
    results = await asyncio.gather(*(start(s, GPU1) for s in spawners), return_exceptions=True)
    refused = [r for r in results if isinstance(r, HTTPError)]
    assert len(refused) == 2, results
    assert all(r.status_code == 409 and r.jupyterhub_message.startswith("Your quota is 1 GPU and your servers hold 1")
               for r in refused)
    assert len(cluster.made_pods()) == 1
    assert sum(sum(c.values()) for o, c in counted(spawners[0]).items() if o.startswith("zoe/")) == 1
    for spawner, result in zip(spawners, results, strict=True):
        if not isinstance(result, Exception):
            await spawner.stop(now=True)


async def test_concurrent_spawns_of_a_group_respect_its_quota(cluster, make_spawner):
    members = ["ana", "ben", "cai", "dev"]
    students = group(STUDENTS, members)
    spawners = [make_spawner(m, groups=(students,), gpu_profiles=PROFILES, gpu_quota_per_group={STUDENTS: 2},
                             gpu_inventory_ttl=0) for m in members]
    results = await asyncio.gather(*(start(s, GPU1) for s in spawners), return_exceptions=True)
    refused = [r for r in results if isinstance(r, HTTPError)]
    assert len(refused) == 2, results
    assert all(r.status_code == 409 and r.jupyterhub_message.startswith(
        "The quota of group 'students' is 2 GPUs and its members' servers hold 2") for r in refused)
    assert len(cluster.made_pods()) == 2
    for spawner, result in zip(spawners, results, strict=True):
        if not isinstance(result, Exception):
            await spawner.stop(now=True)
    assert not [o for o in counted(spawners[0]) if o.split("/")[0] in members]


async def test_a_failed_start_gives_the_count_back(cluster, make_spawner, monkeypatch):
    cluster.hub(monkeypatch, without(HUB_RULES, "pods", "create"))  # the API server refuses the hub's pod
    spawner = make_spawner("zoe", gpu_profiles=PROFILES, gpu_quota_per_user=1)
    with pytest.raises(Exception, match="Forbidden"):
        await start(spawner, GPU1)
    assert "zoe/" not in counted(spawner)


async def test_a_leftover_pod_of_the_server_is_replaced_and_the_new_one_counted(cluster, make_spawner):
    """A hub that died mid-spawn left zoe's pod; her next start replaces it and still counts 1 GPU."""
    leftover = make_spawner("zoe", gpu_profiles=PROFILES, gpu_quota_per_user=1)
    leftover.user_options = GPU1
    await leftover._run_apply_user_options(GPU1)
    await leftover.reserve_gpus()
    pod = leftover.api.api_client.sanitize_for_serialization(await leftover.get_pod_manifest())
    pod.pop("status", None)
    left = cluster.api("POST", f"/api/v1/namespaces/{cluster.namespace}/pods", pod)
    make_spawner.restart()

    spawner = make_spawner("zoe")
    assert (await spawner._render_options_form())  # the form reconciles: the leftover pod counts
    assert counted(spawner)["zoe/"] == {"nvidia.com/gpu": 1}
    await start(spawner, GPU1)  # its own server's count does not block it
    # KubeSpawner met the leftover (409 Conflict), stopped it and created the pod again
    assert cluster.made_pods() == [spawner.pod_name]
    assert cluster.pod(spawner.pod_name)["metadata"]["uid"] != left["metadata"]["uid"]
    assert counted(spawner)["zoe/"] == {"nvidia.com/gpu": 1}  # KubeSpawner's replacement kept the count
    with pytest.raises(HTTPError, match="Your quota is 1 GPU"):
        await start(make_spawner("zoe", "big"), GPU1)
    await spawner.stop(now=True)
    assert "zoe/" not in counted(spawner)


# ------------------------------------------------------------ after a hub restart


async def test_after_a_restart_the_pods_are_counted_and_the_quota_refuses_first(cluster, make_spawner):
    alice = make_spawner("alice", gpu_profiles=PROFILES, gpu_quota_per_user=4)
    await alice.poll()  # JupyterHub polls every server it had when it starts: the first one reconciles
    assert counted(alice) == {
        "alice/": {"nvidia.com/gpu": 4}, "bob/": {"nvidia.com/gpu": 6},
        "carol/mig": {"nvidia.com/mig-1g.10gb": 2}, "dave/": {"nvidia.com/gpu.shared": 1},
        "erin/": {"nvidia.com/gpu.shared": 1}, "frank/": {"nvidia.com/gpu.shared": 1},
    }
    more = make_spawner("alice", "more")
    for options in (GPU1, {"profile": "gpu", "gpus": 4, "gpu_model": A100}):  # 4 A100s are not free either
        with pytest.raises(HTTPError) as e:
            await start(more, options)
        assert e.value.status_code == 409
        assert e.value.jupyterhub_message.startswith(
            "Your quota is 4 GPUs and your servers hold 4 (servers: default); asking for ")
    assert cluster.made_pods() == []
    # carol's named server holds 2 MIG slices: with a quota of 3 she gets one more GPU, not two
    carol = make_spawner("carol", "big", gpu_quota_per_user=3)
    with pytest.raises(HTTPError, match="your servers hold 2 \\(servers: mig\\); asking for 2 more"):
        await start(carol, {"profile": "gpu", "gpus": 2, "gpu_model": A100})
    await start(carol, GPU1)
    assert counted(carol)["carol/big"] == {"nvidia.com/gpu": 1}
    await carol.stop(now=True)


# ------------------------------------------------------------ while the hub runs


async def test_a_pod_deleted_behind_the_hubs_back_stops_counting_without_a_restart(
        cluster, make_spawner, caplog):
    zoe = make_spawner("zoe", gpu_profiles=PROFILES, gpu_quota_per_user=1, gpu_reconcile_interval=1)
    await start(zoe, GPU1)
    assert counted(zoe)["zoe/"] == {"nvidia.com/gpu": 1}
    cluster.delete_pod(zoe.pod_name)  # kubectl delete, a node drained, an eviction
    await until(lambda: "zoe/" not in counted(zoe))
    assert "gpu-kube: zoe/'s GPU charge (1) freed: no live pod of it" in caplog.text
    # her quota of 1 counts only what she holds: another server of hers starts
    await start(make_spawner("zoe", "again"), GPU1)
    assert counted(zoe)["zoe/again"] == {"nvidia.com/gpu": 1}


async def test_a_pod_of_the_hub_it_did_not_count_is_counted_without_a_restart(
        cluster, make_spawner, pod_items, caplog):
    zoe = make_spawner("zoe", gpu_profiles=PROFILES, gpu_reconcile_interval=1)
    await zoe.poll()  # the hub has reconciled (at start) and runs on
    assert "yuri/" not in counted(zoe)
    # a server pod of this hub made behind its back (another hub process on the same database, say)
    pod = copy.deepcopy(next(p for p in pod_items if p["metadata"]["name"] == "jupyter-alice"))
    pod["metadata"].update(name="jupyter-yuri", annotations={"hub.jupyter.org/username": "yuri"})
    load_pods(cluster.kube, cluster.namespace, [pod])
    await until(lambda: "yuri/" in counted(zoe))
    assert counted(zoe)["yuri/"] == {"nvidia.com/gpu": 4}
    assert (f"gpu-kube: pod {cluster.namespace}/jupyter-yuri of yuri/ counted: it holds 4 GPU(s) the hub did not "
            "count") in caplog.text


async def test_no_pod_list_no_gpu_spawn_but_cpu_only_works(cluster, make_spawner, monkeypatch):
    # a hub whose account may not list pods (its Role's and ClusterRole's "list" on pods taken away)
    cluster.hub(monkeypatch, without(HUB_RULES, "pods", "list"), without(HUB_CLUSTER_RULES, "pods", "list"))
    spawner = make_spawner("zoe", gpu_profiles=PROFILES, gpu_quota_per_user=1)
    any_gpu = {"profile": "gpu", "gpus": 1}  # the models in use are unknown without the pods: any model
    spawner.user_options = any_gpu
    await spawner._run_apply_user_options(any_gpu)
    with pytest.raises(HTTPError) as e:
        await spawner.reserve_gpus()
    assert e.value.status_code == 503
    assert e.value.jupyterhub_message == (
        "The hub could not read its servers' pods from Kubernetes (Kubernetes API answered 403 Forbidden), "
        "so it cannot count your GPUs against the quotas. Nothing was started; try again in a minute.")
    assert spawner.extra_resource_limits == {}  # no GPU asked for
    spawner.user_options = CPU
    await spawner._run_apply_user_options(CPU)
    assert await spawner.reserve_gpus() == ()
    assert counted(spawner) == {}


# ------------------------------------------------------------ queue: true waits for room in the cluster


WAIT = {"slug": "wait", "display_name": "Four A100s, waits its turn", "gpu_models": ["a100"], "gpu_counts": [4],
        "queue": True}
FOUR_WAITING = {"profile": "wait", "gpus": 4, "gpu_model": A100}


def messages(spawner) -> list[str]:
    return [e["message"] for e in getattr(spawner, "_gpu_events", [])]


async def until(condition, timeout: float = 30):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


async def test_a_queue_profile_waits_until_the_cluster_has_room_then_gets_its_pod(cluster, make_spawner):
    # 3 A100s are free, at most 2 on one node: 4 fit on a node (8 each) but not now
    zoe = make_spawner("zoe", gpu_profiles=[*PROFILES, WAIT], gpu_inventory_ttl=0, gpu_queue_recheck=0.2)
    waiting = asyncio.create_task(start(zoe, FOUR_WAITING))
    await until(lambda: any(m.startswith("Waiting for a free GPU: number 1 in the queue") for m in messages(zoe)))
    assert cluster.made_pods() == [] and "zoe/" not in counted(zoe)  # no pod, no count while waiting
    # what the wait rests on: the cluster's A100s in use (the hub's and others'), its estimate: no end known
    said = ("No start time can be given yet. No session has ended on this hub yet, so nothing tells how long "
            "sessions last; no holder of these GPUs has a time limit.")
    assert ("Waiting for a free GPU: number 1 in the queue (1 of 1 waiting for these GPUs); 13 of 16 "
            f"NVIDIA-A100-SXM4-80GB held. {said}") in messages(zoe)
    [waiter] = zoe.hub_state.queue.waiters()  # /hub/api/gpus lists its queue entry with this estimate
    assert waiter.estimate.as_json()["likely"] is None and waiter.estimate.as_json()["text"] == said
    # the form's card of the queued profile says the same for whoever would queue now, behind her
    form = await make_spawner("eve").options_form_context()
    card = next(p for p in form["profiles"] if p["profile"].slug == "wait")
    assert card["queue_estimate"].startswith("If you queue now: no start time can be given yet.")

    # a profile without queue does not go ahead of her
    eve = make_spawner("eve")
    with pytest.raises(HTTPError) as e:
        await start(eve, {"profile": "gpu", "gpus": 1, "gpu_model": A100})
    assert e.value.status_code == 409
    assert e.value.jupyterhub_message == (
        "1 queued request(s) from 1 user(s) are waiting for these GPUs; choose a profile that queues, "
        "or try again later.")

    # a training job outside the hub ends: its node has room for 4, seen at the next look
    cluster.delete_pod("train-llm-7c9f8-x2kqz")
    await asyncio.wait_for(waiting, 60)
    assert cluster.made_pods() == [zoe.pod_name]
    pod = cluster.pod(zoe.pod_name)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    await until(lambda: cluster.pod(zoe.pod_name)["spec"].get("nodeName") == "gpu-a100-0")  # the scheduler's choice
    assert counted(zoe)["zoe/"] == {"nvidia.com/gpu": 4}
    steps = messages(zoe)
    asking = next(i for i, m in enumerate(steps) if m.startswith("Asking Kubernetes for 4 x"))
    assert asking > next(i for i, m in enumerate(steps) if m.startswith("Waiting for a free GPU"))
    await zoe.stop(now=True)
    assert "zoe/" not in counted(zoe)


async def test_a_queued_request_no_node_can_ever_take_is_refused_at_once(cluster, make_spawner):
    big = {**WAIT, "gpu_counts": [16]}
    zoe = make_spawner("zoe", gpu_profiles=[*PROFILES, big], gpu_inventory_ttl=0)
    with pytest.raises(HTTPError) as e:
        await start(zoe, {"profile": "wait", "gpus": 16, "gpu_model": A100})
    assert e.value.status_code == 409
    assert e.value.jupyterhub_message.startswith("No node has 16 x NVIDIA-A100-SXM4-80GB: at most 8 on one node.")
    assert len(zoe.hub_state.queue) == 0 and cluster.made_pods() == []
