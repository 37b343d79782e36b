"""gpu-kube with Kueue: queue label, queue position, quota line, eviction and rejection.

Against real Kueue (the session fixture ``kueue``: Kueue's controller with its webhooks and
visibility API on the test run's real control plane, ``kube_cluster``). Each test has a
namespace of its own labelled for Kueue's pod integration, a LocalQueue ``team-a`` there, a
ClusterQueue of its own with an ``nvidia.com/gpu`` quota, and a hub whose ServiceAccount has the
rights the Helm chart gives it (tests/kube/test_helm.py checks the chart grants them). Real
GPUKubeSpawners create the pods; Kueue's own webhook gates them, Kueue admits, preempts and
rejects them, the real scheduler binds them to the fake GPU nodes, and the fake kubelet runs them.

The pure functions of gpuspawner.backends.kube.kueue are tested on recorded objects (tests/kube/fixtures/kueue).
"""

from __future__ import annotations

import asyncio
import datetime
import re
from types import SimpleNamespace

import pytest
import pytest_asyncio
from tornado.web import HTTPError
from traitlets import TraitError

from gpuspawner.backends.kube.kueue import (
    QUEUE_LABEL,
    cluster_queue_quota,
    events_problem,
    gated,
    pod_gone,
    pod_problem,
    queue_position,
    quota_lines,
    workload_problem,
)
from gpuspawner.ledger import cluster_holdings
from kubefixtures import (
    HUB_CLUSTER_RULES,
    HUB_RULES,
    KUEUE_CLUSTER_RULE,
    KUEUE_RULES,
    SpawnerMaker,
    as_hub,
    hub_account,
    load_object,
    progress_until,
    start_task,
    until as wait_until,
)
from profiles import A100, PROFILES, validate_pod

GPU1 = {"profile": "gpu", "gpus": 1, "gpu_model": A100}
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta1"
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"


def workload_with(pod_name: str, status_file: str | None = None) -> dict:
    workload = load_object("kueue/workload.json", pod_name)
    if status_file:
        workload["status"]["conditions"] = load_object(f"kueue/{status_file}")["conditions"]
    return workload


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def counted(spawner) -> dict[str, dict[str, int]]:
    return {owner: cluster_holdings(keys) for owner, keys in spawner.ledger.allocations().items()}


async def until(check, what: str, timeout: float = 60):
    """``check()``'s first true answer, polling without blocking the hub's event loop (a bound on
    waiting for the cluster, not a timing being tested)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s in vain: {what}")
        await asyncio.sleep(0.1)


# ------------------------------------------------------------ a queue and a hub on real Kueue


class Team(SimpleNamespace):
    """This test's namespace, its LocalQueue ``team-a`` and its ClusterQueue (``cluster_queue``)."""

    def api(self, method: str, path: str, body=None, **kwargs):
        return self.kueue.cluster.api(method, path, body, **kwargs)

    def apply(self, obj: dict) -> dict:
        """Create or update a cluster object (server-side apply), deleted after the test if cluster-scoped."""
        from gpuspawner.backends.kube.dev.kueue import object_path

        meta = obj["metadata"]
        if obj["kind"] in ("ResourceFlavor", "ClusterQueue", "WorkloadPriorityClass"):
            plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
                      "WorkloadPriorityClass": "workloadpriorityclasses"}[obj["kind"]]
            path = f"{KUEUE_API}/{plural}/{meta['name']}"
        elif obj["kind"] == "LocalQueue":
            path = f"{KUEUE_API}/namespaces/{meta['namespace']}/localqueues/{meta['name']}"
        else:
            path = object_path(obj)
        if not meta.get("namespace") and obj["kind"] != "ResourceFlavor":
            self.cluster_scoped.append(path)
        return self.api("PATCH", f"{path}?fieldManager=test&force=true", obj,
                        content_type="application/apply-patch+yaml")

    def cluster_queue_spec(self, gpus: int, **spec) -> dict:
        return {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
            "flavors": [{"name": "default-flavor", "resources": [
                {"name": "cpu", "nominalQuota": "1000"}, {"name": "memory", "nominalQuota": "10Ti"},
                {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}], **spec}

    def queue(self, name: str, cluster_queue: str) -> None:
        self.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                    "metadata": {"name": name, "namespace": self.namespace},
                    "spec": {"clusterQueue": cluster_queue}})

    def pod(self, name: str) -> dict | None:
        return self.api("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}", ok=(404,))

    def workload_of(self, pod: dict) -> dict | None:
        items = self.api("GET", f"{KUEUE_API}/namespaces/{self.namespace}/workloads"
                                f"?labelSelector=kueue.x-k8s.io/job-uid={pod['metadata']['uid']}")["items"]
        return items[0] if items else None


def condition(obj: dict | None, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in ((obj or {}).get("status") or {}).get("conditions")
               or [])


@pytest.fixture
def team(kueue, kube_namespace):
    """This test's namespace labelled for Kueue's pod integration, with LocalQueue ``team-a`` pointing at
    a ClusterQueue of its own (``team.cluster_queue``, named after the namespace) with 1 GPU of quota."""
    from gpuspawner.backends.kube.dev.kueue import MANAGED_LABEL

    team = Team(kueue=kueue, namespace=kube_namespace, cluster_queue=f"{kube_namespace}-gpus", cluster_scoped=[])
    team.api("PATCH", f"/api/v1/namespaces/{kube_namespace}", {"metadata": {"labels": {MANAGED_LABEL: "true"}}},
             content_type="application/merge-patch+json")
    team.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
                "metadata": {"name": "default-flavor"}})
    team.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
                "metadata": {"name": team.cluster_queue}, "spec": team.cluster_queue_spec(1)})
    team.queue("team-a", team.cluster_queue)
    # Kueue calls a Workload of a queue it has not seen yet inadmissible: wait until both are active
    wait_until(lambda: condition(team.api("GET", f"{KUEUE_API}/namespaces/{kube_namespace}/localqueues/team-a"),
                                 "Active"), "Kueue makes LocalQueue team-a and its ClusterQueue active")
    yield team
    team.api("DELETE", f"/api/v1/namespaces/{kube_namespace}", ok=(404,))  # its pods and Workloads first
    for path in reversed(team.cluster_scoped):
        team.api("DELETE", path, ok=(404,))


def hub_rights(read_cluster_queues: bool = True, read_positions: bool = True) -> tuple[list[dict], list[dict]]:
    """The Helm chart's hub rights with Kueue on (its Role: pods, events and the Kueue rules; its ClusterRole:
    nodes, pods and the ClusterQueues), less the ClusterQueues or the visibility API's pending workloads
    where told."""
    rules = [*HUB_RULES, *[r for r in KUEUE_RULES
                           if read_positions or "localqueues/pendingworkloads" not in r["resources"]]]
    return rules, [*HUB_CLUSTER_RULES, *([KUEUE_CLUSTER_RULE] if read_cluster_queues else [])]


@pytest_asyncio.fixture
async def make_hub(team, monkeypatch):
    """``make_hub(read_cluster_queues=True, read_positions=True, poll=0.1)``: a hub in the team's namespace, as its
    ServiceAccount (kubefixtures.hub_account, with :func:`hub_rights`), queueing GPU profiles' pods in ``team-a``
    and looking at them every ``poll`` seconds; returns its spawner maker (``maker(user)``, as ``make_spawner``)."""
    from kubespawner import KubeSpawner
    from kubespawner.clients import load_config

    from gpuspawner.state import stop_serving_hub_metrics

    def make(read_cluster_queues: bool = True, read_positions: bool = True, poll: float = 0.1) -> SpawnerMaker:
        as_hub(monkeypatch, hub_account(team.kueue.cluster, team.namespace,
                                        *hub_rights(read_cluster_queues, read_positions)))
        maker = SpawnerMaker(team.kueue.cluster.server)
        maker.settings.update(namespace=team.namespace, gpu_profiles=PROFILES, kueue_queue_name="team-a",
                              kueue_poll_interval=poll, gpu_tolerations=TOLERATE_GPU)
        maker.restart()
        return maker

    yield make
    await KubeSpawner._stop_all_reflectors()
    load_config.cache_clear()
    stop_serving_hub_metrics()


@pytest.fixture
def full_a100s(team):
    """Both A100 nodes' 8 GPUs held by pods outside Kueue (a training job's, say), bound by the real
    scheduler: a GPU request must wait until they go."""
    for index in range(2):
        team.api("POST", f"/api/v1/namespaces/{team.namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"training-{index}"},
            "spec": {"tolerations": TOLERATE_GPU, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                     "containers": [{"name": "train", "image": "ghcr.io/example/torch:2.3",
                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    return team


async def bound(team: Team, *names: str) -> None:
    await until(lambda: all((team.pod(n) or {}).get("spec", {}).get("nodeName") for n in names),
                f"the scheduler binds {', '.join(names)}")


# ------------------------------------------------------------ recorded objects in words


def test_recorded_objects_in_words():
    assert cluster_queue_quota(load_object("kueue/clusterqueue.json")).line == "team-a: 6 of 8 GPUs in use"
    assert queue_position(load_object("kueue/pendingworkloads.json", "jupyter-zoe"), "jupyter-zoe") == 3
    assert queue_position(load_object("kueue/pendingworkloads.json"), "jupyter-nobody") is None
    assert workload_problem(workload_with("jupyter-zoe"), "team-a") is None  # waiting for quota is no problem
    assert workload_problem(workload_with("jupyter-zoe", "workload-rejected.json"), "team-a") == (
        "Kueue rejected your server in queue team-a: ClusterQueue team-a is inactive. Ask an administrator about "
        "the queue.")
    # the cohort paths Kueue appends to a preemption's message are left out
    assert workload_problem(workload_with("jupyter-zoe", "workload-evicted.json"), "team-a") == PREEMPTED


PREEMPTED = (
    "Kueue evicted your server from queue team-a: a workload of higher priority (or of a queue reclaiming its "
    "quota) needed the GPUs (Preempted to accommodate a workload (UID: 1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9, "
    "JobUID: 0c1d2e3f-0000-4000-8000-000000000009) due to prioritization in the ClusterQueue). "
    "Start it again to queue anew.")


def test_quota_lines_name_a_missing_queue():
    local, cluster = load_object("kueue/localqueue.json"), load_object("kueue/clusterqueue.json")
    assert quota_lines([local], [cluster], ["team-a", "team-z"]) == {
        "team-a": "team-a: 6 of 8 GPUs in use", "team-z": "queue team-z: no such LocalQueue in this namespace"}
    assert quota_lines([local], [], ["team-a"]) == {"team-a": "queue team-a: its ClusterQueue team-a does not exist"}


def test_usage_is_read_where_kueue_reports_no_reservation():
    queue = load_object("kueue/clusterqueue.json")
    del queue["status"]["flavorsReservation"]
    queue["status"]["flavorsUsage"][1]["resources"][2]["total"] = "3"
    assert cluster_queue_quota(queue).line == "team-a: 7 of 8 GPUs in use"


def test_a_pod_kueue_stops_says_why_without_its_workload():
    """Kueue deletes a preempted pod, and its Workload with it: the pod's own condition says why."""
    pod = load_object("kueue/pod-preempted.json")
    assert pod_problem(pod, "team-a") == PREEMPTED
    pod["status"]["conditions"] = pod["status"]["conditions"][:1]
    assert pod_problem(pod, "team-a") is None


def test_a_deleted_pod_says_why_from_its_workloads_events():
    """Pod and Workload both gone: the latest eviction event Kueue recorded on the Workload says why."""
    message = load_object("kueue/pod-preempted.json")["status"]["conditions"][1]["message"]
    events = [{"reason": "Created", "message": "Created Workload", "lastTimestamp": "2026-11-25T18:11:50Z"},
              {"reason": "EvictedDueToPodsReadyTimeout", "message": "", "lastTimestamp": "2026-11-25T18:11:52Z"},
              {"reason": "EvictedDueToPreempted", "message": message, "lastTimestamp": "2026-11-25T18:11:59Z"}]
    assert events_problem(events, "team-a") == PREEMPTED
    assert events_problem(events[:1], "team-a") is None
    assert pod_gone("team-a").startswith("Your server's pod was deleted while it waited in Kueue queue team-a")


# ------------------------------------------------------------ configuration


def test_queue_true_with_kueue_is_refused_at_configuration(offline_hub):
    make_spawner = SpawnerMaker(offline_hub)
    queued = [*PROFILES, {"slug": "wait", "display_name": "Wait", "gpu_counts": [1], "queue": True}]
    with pytest.raises(TraitError, match="profile 'wait': sets 'queue': True and sends its pods to the Kueue "
                                         "queue 'team-a': Kueue is the queue, and the hub never runs"):
        make_spawner(kueue_queue_name="team-a", gpu_profiles=queued)


def test_queue_true_with_a_profiles_own_kueue_is_refused(offline_hub):
    make_spawner = SpawnerMaker(offline_hub)
    queued = [*PROFILES, {"slug": "wait", "display_name": "Wait", "gpu_counts": [1], "queue": True,
                          "kueue": "team-b"}]
    with pytest.raises(TraitError, match="Kueue queue 'team-b': Kueue is the queue"):
        make_spawner(gpu_profiles=queued)
    entry = {"display_name": "Wait", "slug": "wait", "gpu_counts": [1], "queue": True,
             "kubespawner_override": {}}
    with pytest.raises(TraitError, match="Kueue queue 'team-a': Kueue is the queue"):
        make_spawner(gpu_profiles=PROFILES, kueue_queue_name="team-a", profile_list=[entry])


def test_a_bad_queue_name_is_refused(offline_hub):
    with pytest.raises(TraitError, match="kueue_queue_name 'Team A' must be a LocalQueue name"):
        SpawnerMaker(offline_hub)(kueue_queue_name="Team A")
    with pytest.raises(TraitError, match="kueue 'x_y' must be a LocalQueue name"):
        SpawnerMaker(offline_hub)(gpu_profiles=[{"display_name": "GPU", "gpu_counts": [1], "kueue": "x_y"}])


def test_other_backends_refuse_a_profiles_kueue():
    from gpuspawner.backends.local.spawner import GPULocalProcessSpawner

    with pytest.raises(TraitError, match="profile 'gpu': 'kueue' queues are only used by gpu-kube"):
        GPULocalProcessSpawner(gpu_profiles=[{"display_name": "GPU", "gpu_counts": [1], "kueue": "team-a"}])


async def test_pods_carry_the_queue_label_and_still_validate(make_spawner):
    own = [*PROFILES, {"slug": "team-b", "display_name": "Team B GPUs", "gpu_models": ["a100"],
                       "gpu_counts": [1], "kueue": "team-b"}]
    spawner = make_spawner(gpu_profiles=own, kueue_queue_name="team-a")
    for options, queue in ((GPU1, "team-a"), ({"profile": "cpu"}, "team-a"), ({"profile": "team-b"}, "team-b")):
        spawner.user_options = options
        await spawner._run_apply_user_options(options)
        await spawner.reserve_gpus()
        pod = validate_pod(spawner, await spawner.get_pod_manifest())
        assert pod["metadata"]["labels"][QUEUE_LABEL] == queue
        spawner.release_gpus()
        spawner.restore_configured()
    without = SpawnerMaker(make_spawner.url, make_spawner.namespace)(gpu_profiles=PROFILES)
    without.user_options = GPU1
    await without._run_apply_user_options(GPU1)
    await without.reserve_gpus()
    assert QUEUE_LABEL not in validate_pod(without, await without.get_pod_manifest())["metadata"]["labels"]


# ------------------------------------------------------------ real Kueue: gate, place, admission, form


async def test_pods_wait_in_kueue_with_their_place_and_start_once_admitted(team, make_hub):
    """1 GPU of quota: zoe's pod is admitted and runs; ana's and bob's are held by Kueue's gate with
    their places from the visibility API; the form shows the quota in use; when zoe stops, ana starts
    and bob moves up."""
    hub = make_hub()
    zoe, ana, bob = hub("zoe"), hub("ana"), hub("bob")
    assert (await (await start_task(zoe, GPU1))).startswith("http://10.244.")
    assert condition(team.workload_of(team.pod(zoe.pod_name)), "Admitted")

    ana_start = await start_task(ana, GPU1)
    messages = await progress_until(ana, ": position")  # once Kueue has queued the pod's Workload
    assert messages[-1] == "waiting in queue team-a: position 1 (Kueue)"
    assert ana.gpu_wait == {"kueue_queue": "team-a", "kueue_position": 1}  # what /hub/api/gpus lists for it
    assert "Asking Kubernetes for 1 x NVIDIA-A100-SXM4-80GB (nvidia.com/gpu) through the Kueue queue team-a" in messages
    pod = team.pod(ana.pod_name)
    assert gated(pod) and pod["metadata"]["labels"][QUEUE_LABEL] == "team-a"  # Kueue's own webhook gated it
    assert counted(ana)["ana/"] == {"nvidia.com/gpu": 1}
    # Kueue queues in order of creation, which the API server records to the second
    created = datetime.datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    await until(lambda: datetime.datetime.now(datetime.timezone.utc) >= created + datetime.timedelta(seconds=1),
                "a second after ana's pod was created")
    bob_start = await start_task(bob, GPU1)
    assert (await progress_until(bob, ": position"))[-1] == "waiting in queue team-a: position 2 (Kueue)"

    await until(lambda: cluster_queue_quota(team.api("GET", f"{KUEUE_API}/clusterqueues/{team.cluster_queue}")).used,
                "Kueue reports zoe's GPU in the ClusterQueue's status")
    words = text(await hub("eve")._render_options_form())
    assert words.count(f"Kueue quota: {team.cluster_queue}: 1 of 1 GPU in use") == len(PROFILES)

    ana_admitted = asyncio.ensure_future(progress_until(ana, "Kueue admitted"))
    await zoe.stop(now=True)
    assert (await ana_start).startswith("http://10.244.")  # admitted once zoe's GPU was given back
    assert (await ana_admitted)[-1] == (  # Kueue's own event on the pod, in words
        f"Kueue admitted your server (ClusterQueue {team.cluster_queue}); the scheduler places it next.")
    assert not gated(team.pod(ana.pod_name))
    assert (await progress_until(bob, "position 1"))[-1] == "waiting in queue team-a: position 1 (Kueue)"
    assert bob.gpu_wait["kueue_position"] == 1 and ana.gpu_wait is None
    assert not bob_start.done()
    bob_start.cancel()
    for spawner in (ana, bob):
        await spawner.stop(now=True)


async def test_form_says_when_the_hubs_account_may_not_read_cluster_queues(team, make_hub):
    words = text(await make_hub(read_cluster_queues=False)()._render_options_form())
    assert "queue team-a: GPU quota unknown (Kubernetes API answered 403 Forbidden)" in words
    assert re.search(r"NVIDIA-A100-SXM4-80GB - \d+ of 16 free", words)  # the rest of the form is there


async def test_a_hub_that_may_not_read_places_still_says_the_server_waits_in_the_queue(team, make_hub):
    hub = make_hub(read_positions=False)
    zoe, ana = hub("zoe"), hub("ana")
    assert (await (await start_task(zoe, GPU1))).startswith("http://10.244.")
    ana_start = await start_task(ana, GPU1)
    await until(lambda: gated(team.pod(ana.pod_name)), "Kueue's webhook gates ana's pod")
    assert "waiting in queue team-a (Kueue)" in await progress_until(ana, "waiting in queue")
    ana_start.cancel()
    for spawner in (zoe, ana):
        await spawner.stop(now=True)


# ------------------------------------------------------------ real Kueue: rejection, preemption


@pytest.mark.parametrize("case", ["stopped", "no ClusterQueue", "no LocalQueue"])
async def test_a_workload_kueue_rejects_fails_the_spawn_with_its_sentence(team, make_hub, case):
    queue, why = "team-a", f"ClusterQueue {team.cluster_queue} is inactive"
    if case == "stopped":
        team.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
                    "metadata": {"name": team.cluster_queue}, "spec": team.cluster_queue_spec(1, stopPolicy="Hold")})
    elif case == "no ClusterQueue":
        queue, why = "team-z", f"ClusterQueue {team.namespace}-gone doesn't exist"
        team.queue("team-z", f"{team.namespace}-gone")
    else:
        queue, why = "team-q", "LocalQueue team-q doesn't exist"
    spawner = make_hub()("zoe", kueue_queue_name=queue)
    start = await start_task(spawner, GPU1)
    with pytest.raises(HTTPError) as refused:
        await start
    assert refused.value.status_code == 409
    assert refused.value.jupyterhub_message == (
        f"Kueue rejected your server in queue {queue}: {why}. Ask an administrator about the queue.")
    assert "zoe/" not in counted(spawner)  # the failed start gave its count back
    await spawner.stop(now=True)  # as JupyterHub does after a failed start: the gated pod goes
    await until(lambda: team.pod(spawner.pod_name) is None, "the refused server's pod is deleted")


async def test_a_busy_cluster_is_left_to_kueue(full_a100s, make_hub):
    """All 16 A100s are held now: without Kueue refused at once, with Kueue queued; 32 never fit."""
    team = full_a100s
    await bound(team, "training-0", "training-1")
    options = {"profile": "gpu", "gpus": 4, "gpu_model": A100}
    hub = make_hub()
    plain = hub("zoe", kueue_queue_name=None)
    plain.user_options = options
    await plain._run_apply_user_options(options)
    with pytest.raises(HTTPError, match="409"):
        await plain.reserve_gpus()
    queued = hub("ana", kueue_queue_name="team-a")
    queued.user_options = options
    await queued._run_apply_user_options(options)
    await queued.reserve_gpus()
    assert queued.extra_resource_limits == {"nvidia.com/gpu": "4"}
    queued.release_gpus()
    queued.restore_configured()
    never = {"profile": "gpu", "gpus": 16, "gpu_model": A100}  # no node has 16: Kueue cannot help
    queued.user_options = never
    await queued._run_apply_user_options(never)
    with pytest.raises(HTTPError, match="409"):
        await queued.reserve_gpus()


@pytest.mark.parametrize("poll", [0.1, 4.0], ids=["watched-closely", "pod-gone-between-looks"])
async def test_kueue_preempting_a_server_fails_its_spawn_with_kueues_sentence(full_a100s, make_hub, poll):
    """zoe's pod is admitted (1 GPU of quota) but waits for a node (training jobs hold every A100);
    a workload of higher priority comes to the queue: Kueue preempts zoe's, and the spawn fails.
    Kueue deletes the pod and its Workload within a second: a hub that looks every 4 s finds them gone,
    and reads why from the events Kueue recorded on the Workload."""
    team = full_a100s
    team.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
                "metadata": {"name": team.cluster_queue},
                "spec": team.cluster_queue_spec(1, preemption={"withinClusterQueue": "LowerPriority"})})
    team.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"{team.namespace}-urgent"}, "value": 1000})
    await bound(team, "training-0", "training-1")
    zoe = make_hub(poll=poll)("zoe")
    start = await start_task(zoe, GPU1)
    await until(lambda: team.pod(zoe.pod_name) and condition(team.workload_of(team.pod(zoe.pod_name)), "Admitted"),
                "Kueue admits zoe's workload")
    await asyncio.sleep(poll)  # the hub has looked at the admitted pod
    assert not start.done()  # admitted, not yet on a node
    urgent = team.api("POST", f"/api/v1/namespaces/{team.namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "urgent", "labels": {QUEUE_LABEL: "team-a",
                                                  "kueue.x-k8s.io/priority-class": f"{team.namespace}-urgent"}},
        "spec": {"tolerations": TOLERATE_GPU, "containers": [{
            "name": "train", "image": "ghcr.io/example/torch:2.3", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    with pytest.raises(HTTPError) as refused:
        await start
    workload = await until(lambda: team.workload_of(urgent), "Kueue makes the urgent pod's workload")
    assert refused.value.status_code == 409
    assert refused.value.jupyterhub_message == (
        "Kueue evicted your server from queue team-a: a workload of higher priority (or of a queue reclaiming its "
        f"quota) needed the GPUs (Preempted to accommodate a workload (UID: {workload['metadata']['uid']}, "
        f"JobUID: {urgent['metadata']['uid']}) due to prioritization in the ClusterQueue). "
        "Start it again to queue anew.")
    assert "zoe/" not in counted(zoe)
    await zoe.stop(now=True)
    await until(lambda: condition(team.workload_of(urgent), "Admitted"), "Kueue admits the urgent workload")


def test_kueue_runs_on_loopback_with_its_webhooks_by_url(kueue):
    """What the hub relies on is there: every webhook Kueue's manifests register for pods and Kueue's
    objects, called by URL on 127.0.0.1, and the visibility API available through the API server."""
    hooks = kueue.cluster.api("GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
                                     "/kueue-mutating-webhook-configuration")["webhooks"]
    pod_hook = next(h for h in hooks if h["clientConfig"]["url"].endswith("/mutate--v1-pod"))
    assert pod_hook["clientConfig"]["url"] == f"https://127.0.0.1:{kueue.webhook_port}/mutate--v1-pod"
    assert all(h["clientConfig"]["url"].startswith("https://127.0.0.1:") for h in hooks)
    service = kueue.cluster.api("GET", "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.visibility.kueue.x-k8s.io")
    assert condition(service, "Available")
