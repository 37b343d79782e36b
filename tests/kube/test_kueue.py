"""gpu-kube with Kueue: queue label, queue position, quota line, eviction and rejection.

Real GPUKubeSpawners against the API test double holding recorded Kueue
objects (tests/kube/fixtures/kueue: a LocalQueue and ClusterQueue ``team-a``,
a pod's Workload, the visibility API's pending workloads). The ``kueue_webhook``
fixture does what Kueue's webhook does to a created pod with a queue label: it
adds the scheduling gate ``kueue.x-k8s.io/admission``.
"""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest
import pytest_asyncio
from tornado.web import HTTPError
from traitlets import TraitError

from gpuspawner.kube.kueue import (
    ADMISSION_GATE,
    QUEUE_LABEL,
    cluster_queue_quota,
    queue_position,
    quota_lines,
    workload_problem,
)
from gpuspawner.ledger import cluster_holdings
from kubefixtures import PODS, WORKLOADS, load_object, pod_controller
from profiles import A100, PROFILES, validate_pod

GPU1 = {"profile": "gpu", "gpus": 1, "gpu_model": A100}
POD_UID = "0c1d2e3f-0000-4000-8000-000000000003"
PENDING = "/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/jhub/localqueues/team-a/pendingworkloads"


def workload_with(pod_name: str, status_file: str | None = None) -> dict:
    workload = load_object("kueue/workload.json", pod_name)
    if status_file:
        workload["status"]["conditions"] = load_object(f"kueue/{status_file}")["conditions"]
    return workload


@pytest_asyncio.fixture
async def kueue_webhook(kueue):
    """Gates every created pod that carries Kueue's queue label, as Kueue's pod webhook does."""
    gated: set[str] = set()

    def gate(namespace: str, name: str, pod: dict) -> dict | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if QUEUE_LABEL not in labels or name in gated:
            return None
        gated.add(name)
        # the uid the API server gives it (the recorded Workload's job-uid label and owner)
        return {"metadata": {"uid": POD_UID}, "spec": {"schedulingGates": [{"name": ADMISSION_GATE}]},
                "status": {"phase": "Pending", "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                    "message": "Scheduling is blocked due to non-empty scheduling gates"}]}}

    async with pod_controller(kueue.url, kueue.handler, gate, 0.02):
        yield kueue


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def counted(spawner) -> dict[str, dict[str, int]]:
    return {owner: cluster_holdings(keys) for owner, keys in spawner.ledger.allocations().items()}


async def start_task(spawner, options: dict) -> asyncio.Task:
    spawner.user_options = options
    await spawner._run_apply_user_options(options)
    task = asyncio.ensure_future(asyncio.wait_for(spawner.start(), 60))
    while spawner._start_future is None and not task.done():  # the hub shows progress once the pod is asked for
        await asyncio.sleep(0.01)
    return task


async def progress_until(spawner, wanted: str, timeout: float = 30) -> list[str]:
    """Progress messages, as the hub's progress page gets them, until one contains ``wanted``."""
    messages: list[str] = []

    async def collect():
        async for event in spawner.progress():
            messages.append(event["message"])
            if wanted in event["message"]:
                return

    await asyncio.wait_for(collect(), timeout)
    return messages


# ------------------------------------------------------------ recorded objects in words


def test_recorded_objects_in_words():
    assert cluster_queue_quota(load_object("kueue/clusterqueue.json")).line == "team-a: 6 of 8 GPUs in use"
    assert queue_position(load_object("kueue/pendingworkloads.json", "jupyter-zoe"), "jupyter-zoe") == 3
    assert queue_position(load_object("kueue/pendingworkloads.json"), "jupyter-nobody") is None
    assert workload_problem(workload_with("jupyter-zoe"), "team-a") is None  # waiting for quota is no problem


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


# ------------------------------------------------------------ configuration


def test_queue_true_with_kueue_is_refused_at_configuration(make_spawner):
    queued = [*PROFILES, {"slug": "wait", "display_name": "Wait", "gpu_counts": [1], "queue": True}]
    with pytest.raises(TraitError, match="profile 'wait': sets 'queue': True and sends its pods to the Kueue "
                                         "queue 'team-a': Kueue is the queue, and the hub never runs"):
        make_spawner(kueue_queue_name="team-a", gpu_profiles=queued)


def test_queue_true_with_a_profiles_own_kueue_is_refused(make_spawner):
    queued = [*PROFILES, {"slug": "wait", "display_name": "Wait", "gpu_counts": [1], "queue": True,
                          "kueue": "team-b"}]
    with pytest.raises(TraitError, match="Kueue queue 'team-b': Kueue is the queue"):
        make_spawner(gpu_profiles=queued)
    entry = {"display_name": "Wait", "slug": "wait", "gpu_counts": [1], "queue": True,
             "kubespawner_override": {}}
    with pytest.raises(TraitError, match="Kueue queue 'team-a': Kueue is the queue"):
        make_spawner(gpu_profiles=PROFILES, kueue_queue_name="team-a", profile_list=[entry])


def test_a_bad_queue_name_is_refused(make_spawner):
    with pytest.raises(TraitError, match="kueue_queue_name 'Team A' must be a LocalQueue name"):
        make_spawner(kueue_queue_name="Team A")
    with pytest.raises(TraitError, match="kueue 'x_y' must be a LocalQueue name"):
        type(make_spawner)(make_spawner.url)(gpu_profiles=[{"display_name": "GPU", "gpu_counts": [1], "kueue": "x_y"}])


def test_other_backends_refuse_a_profiles_kueue():
    from gpuspawner.spawners.local import GPULocalProcessSpawner

    with pytest.raises(TraitError, match="profile 'gpu': 'kueue' queues are only used by gpu-kube"):
        GPULocalProcessSpawner(gpu_profiles=[{"display_name": "GPU", "gpu_counts": [1], "kueue": "team-a"}])


# ------------------------------------------------------------ pods, form, progress


async def test_pods_carry_the_queue_label_and_still_validate(kueue, make_spawner):
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
    # as Kueue's webhook leaves it: gated, and still a valid pod
    pod["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]
    validate_pod(spawner, pod)
    without = type(make_spawner)(kueue.url)(gpu_profiles=PROFILES)
    without.user_options = GPU1
    await without._run_apply_user_options(GPU1)
    await without.reserve_gpus()
    assert QUEUE_LABEL not in validate_pod(without, await without.get_pod_manifest())["metadata"]["labels"]


async def test_form_shows_the_cluster_queues_gpu_quota(kueue, make_spawner):
    spawner = make_spawner(gpu_profiles=PROFILES, kueue_queue_name="team-a")
    words = text(await spawner._render_options_form())
    assert words.count("Kueue quota: team-a: 6 of 8 GPUs in use") == len(PROFILES)
    assert len(kueue.requests("GET", "/clusterqueues")) == 1  # one list per form, however many profiles


async def test_form_says_when_the_quota_cannot_be_read(kueue, make_spawner):
    kueue.handler["get /apis/kueue.x-k8s.io/v1beta1/clusterqueues"] << 403 << {"kind": "Status", "code": 403}
    spawner = make_spawner(gpu_profiles=PROFILES, kueue_queue_name="team-a")
    words = text(await spawner._render_options_form())
    assert "queue team-a: GPU quota unknown (Kubernetes API answered 403 Forbidden)" in words
    assert "NVIDIA-A100-SXM4-80GB - 3 of 16 free" in words  # the rest of the form is there


async def test_a_gated_pod_shows_its_place_then_eviction_fails_the_spawn(kueue_webhook, make_spawner):
    cluster = kueue_webhook
    spawner = make_spawner("zoe", gpu_profiles=PROFILES, kueue_queue_name="team-a", kueue_poll_interval=0.05)
    pending = load_object("kueue/pendingworkloads.json", spawner.pod_name)
    cluster.handler[f"get {PENDING}"] << pending
    cluster.handler.objects[WORKLOADS, "jhub", f"pod-{spawner.pod_name}-a41b8"] = workload_with(spawner.pod_name)
    start = await start_task(spawner, GPU1)
    messages = await progress_until(spawner, "waiting in queue")
    assert messages[-1] == "waiting in queue team-a: position 3 (Kueue)"
    assert "Asking Kubernetes for 1 x NVIDIA-A100-SXM4-80GB (nvidia.com/gpu) through the Kueue queue team-a" in messages
    assert not start.done()
    assert counted(spawner)["zoe/"] == {"nvidia.com/gpu": 1}
    # the Workload is looked up by the pod's uid, as Kueue labels it (the test double ignores selectors)
    lookups = cluster.requests("GET", "/workloads")
    assert lookups and {r.url.query.get("labelSelector") for r in lookups} == {f"kueue.x-k8s.io/job-uid={POD_UID}"}

    # the two ahead are admitted: the pod moves up
    pending = {**pending, "items": pending["items"][2:]}
    pending["items"][0]["positionInLocalQueue"] = 0
    cluster.handler[f"get {PENDING}"] << pending
    messages = await progress_until(spawner, "position 1")
    assert messages[-1] == "waiting in queue team-a: position 1 (Kueue)"

    # Kueue preempts the workload
    name = f"pod-{spawner.pod_name}-a41b8"
    cluster.handler.objects[WORKLOADS, "jhub", name] = workload_with(spawner.pod_name, "workload-evicted.json")
    with pytest.raises(HTTPError) as refused:
        await start
    assert refused.value.status_code == 409
    assert refused.value.jupyterhub_message == (
        "Kueue evicted your server from queue team-a: a workload of higher priority (or of a queue reclaiming its "
        "quota) needed the GPUs (Preempted to accommodate a workload (UID: 1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9, "
        "JobUID: 0c1d2e3f-0000-4000-8000-000000000009) due to prioritization in the ClusterQueue). "
        "Start it again to queue anew.")
    assert "zoe/" not in counted(spawner)  # the failed start gave its count back
    await spawner.stop(now=True)  # as JupyterHub does after a failed start: the gated pod goes
    assert cluster.handler.objects[PODS, "jhub", spawner.pod_name].deleted


async def test_an_admitted_pod_starts(kueue_webhook, make_spawner):
    """Kueue admits the workload: the gate goes, the pod runs, the server starts and keeps its count."""
    cluster = kueue_webhook
    spawner = make_spawner("zoe", gpu_profiles=PROFILES, kueue_queue_name="team-a", kueue_poll_interval=0.05)
    cluster.handler[f"get {PENDING}"] << load_object("kueue/pendingworkloads.json", spawner.pod_name)
    cluster.handler.objects[WORKLOADS, "jhub", f"pod-{spawner.pod_name}-a41b8"] = workload_with(spawner.pod_name)
    start = await start_task(spawner, GPU1)
    await progress_until(spawner, "position 3")
    image = cluster.handler.objects[PODS, "jhub", spawner.pod_name]["spec"]["containers"][0]["image"]
    body = {"metadata": {"namespace": "jhub"}, "spec": {"schedulingGates": []},
            "status": {"phase": "Running", "podIP": "10.244.9.9", "containerStatuses": [
                {"name": "notebook", "ready": True, "restartCount": 0, "image": image, "imageID": image,
                 "state": {"running": {}}}]}}
    async with aiohttp.ClientSession() as session:
        url = f"{cluster.url}/api/v1/namespaces/jhub/pods/{spawner.pod_name}"
        async with session.patch(url, data=json.dumps(body),
                                 headers={"Content-Type": "application/merge-patch+json"}) as response:
            response.raise_for_status()
    assert (await start).startswith("http://10.244.9.9:")
    assert counted(spawner)["zoe/"] == {"nvidia.com/gpu": 1}
    await spawner.stop(now=True)
    assert "zoe/" not in counted(spawner)


async def test_a_rejected_workload_fails_the_spawn_with_a_sentence(kueue_webhook, make_spawner):
    cluster = kueue_webhook
    spawner = make_spawner("zoe", gpu_profiles=PROFILES, kueue_queue_name="team-a", kueue_poll_interval=0.05)
    cluster.handler[f"get {PENDING}"] << {"kind": "PendingWorkloadsSummary", "items": []}
    cluster.handler.objects[WORKLOADS, "jhub", f"pod-{spawner.pod_name}-a41b8"] = workload_with(
        spawner.pod_name, "workload-rejected.json")
    start = await start_task(spawner, GPU1)
    with pytest.raises(HTTPError) as refused:
        await start
    assert refused.value.jupyterhub_message == (
        "Kueue rejected your server in queue team-a: ClusterQueue team-a is inactive. "
        "Ask an administrator about the queue.")
    await spawner.stop(now=True)


async def test_a_busy_cluster_is_left_to_kueue(kueue, make_spawner):
    """4 A100s are not free on one node now: without Kueue refused at once, with Kueue queued."""
    options = {"profile": "gpu", "gpus": 4, "gpu_model": A100}
    plain = make_spawner(gpu_profiles=PROFILES)
    plain.user_options = options
    await plain._run_apply_user_options(options)
    with pytest.raises(HTTPError, match="409"):
        await plain.reserve_gpus()
    queued = type(make_spawner)(kueue.url)(gpu_profiles=PROFILES, kueue_queue_name="team-a")
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
