"""kubespawner 7.1.0's own tests, unmodified, with GPUKubeSpawner in KubeSpawner's place (issues 26, 27).

Their folder (``../shared/parents/kubespawner-7.1.0/tests``) runs in a pytest
subprocess per mode (:mod:`parentsuite`), the three at once: ``parent`` (KubeSpawner
itself, the baseline), ``cpu`` (GPUKubeSpawner with one CPU-only GPU profile
beside the profile_list each test sets) and ``default`` (GPUKubeSpawner with
gpuspawner's default profiles, which apply where a test sets no profile_list).

Their 20 cluster tests run against this test run's real control plane (the session
fixture ``kube_cluster``, shared with tests/kube): each run gets its admin kubeconfig
(their ``kube_client`` fixture lists namespaces, makes its two and deletes them at the
end) and two namespaces of its own (``KUBESPAWNER_TEST_NAMESPACE``,
``KUBESPAWNER_ANOTHER_NAMESPACE``), so the three modes do not meet. What their
cluster needs beside the control plane is given here, never by editing their files:

- a kubelet's events on each of their pods (``Pulled``, ``Created``, ``Started``:
  their test_spawn_progress looks for "Started container" in the progress), posted
  by :class:`KubeletEvents`, the fake kubelet's pod runner while the suites run, which
  has the cluster's :class:`~gpuspawner.backends.kube.dev.pods.ProcessRunner` really run their
  pods (their single-user servers, their hub pod, their ``python`` exec pod) and so
  serve their ``exec`` (206/207 in every mode);
- pre-provisioned PersistentVolumes (no StorageClass), which the real
  PersistentVolume controller binds to the claims KubeSpawner makes
  (``storage_pvc_ensure``), as on a cluster without a dynamic provisioner.

What their JupyterHub 6 needs is adapted by :mod:`kubeparent`. A failure that is
only a test artefact (test_spawn_internal_ssl: a hub pod running as root, cluster
DNS) is listed in docs/compatibility.md;
the GPU modes must pass every test the parent passes.

The CPU-only profile of the ``cpu`` mode is named ``gpuspawner-cpu``: their
test_profile.py names a profile of its own ``cpu``, and two profiles with one slug
are refused at hub start (a user's ``"profile": "cpu"`` would be ambiguous).
"""

from __future__ import annotations

import datetime

import pytest

from gpuspawner.backends.kube.dev.kubelet import PodRunner
from needs import module
from parentsuite import MODES, allowed_in, finish_suite, parent_tests, start_suite, unexpected

SECTION = "KubeSpawner (gpu-kube)"
TITLE = "kubespawner 7.1.0, against the real control plane"
TOTAL = 207
CPU_ONLY = [{"slug": "gpuspawner-cpu", "display_name": "CPU only", "gpu_counts": [0]}]
#: their tests and fixtures in one event loop, as the pytest-asyncio they pin (< 0.23) ran them: their
#: session fixture ``kube_client``'s client is used by every cluster test
SESSION_LOOP = ("-o", "asyncio_default_fixture_loop_scope=session", "-o", "asyncio_default_test_loop_scope=session")
#: PersistentVolumes per mode (their test_spawn_start_upgrade_pvc_name makes two claims per mode)
VOLUMES = 4


def namespaces(mode: str) -> tuple[str, str]:
    return f"ksp-{mode}", f"ksp-{mode}-another"


class KubeletEvents(PodRunner):
    """The fake kubelet's pod runner while the suites run: for each pod of theirs it posts the events a
    kubelet posts as it starts the pod's containers (the image already on the node), then leaves the
    pod to the runner it replaced, a :class:`~gpuspawner.backends.kube.dev.pods.ProcessRunner` told to run their
    namespaces' pods: their single-user servers and their ``python`` exec pod run as local processes
    on loopback pod IPs, and their ``exec`` reaches them; their hub pod (the jupyterhub image) stays on
    paper."""

    def __init__(self, cluster, namespaces: set[str], inner) -> None:
        self.cluster = cluster
        self.namespaces = namespaces
        self.inner = inner
        self.added = namespaces - inner.namespaces
        inner.namespaces |= self.added
        self.client = None  # made in the kubelet's thread, which alone calls start and stop
        self.posted: list[str] = []

    def start(self, pod: dict) -> str | None:
        from gpuspawner.backends.kube.dev.cluster import Client

        meta = pod["metadata"]
        if meta["namespace"] in self.namespaces:
            if self.client is None:
                self.client = Client(self.cluster.server, self.cluster.pki, "fake-kubelet")
            node = pod["spec"]["nodeName"]
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
                name = container["name"]
                for reason, message in (("Pulled", f'Container image "{container.get("image", "")}" already '
                                                   "present on machine"),
                                        ("Created", f"Created container: {name}"),
                                        ("Started", f"Started container {name}")):
                    self.client.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", {
                        "apiVersion": "v1", "kind": "Event",
                        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"],
                                           "name": meta["name"], "uid": meta["uid"],
                                           "fieldPath": f"spec.containers{{{name}}}"},
                        "reason": reason, "message": message, "type": "Normal", "count": 1,
                        "firstTimestamp": now, "lastTimestamp": now,
                        "source": {"component": "kubelet", "host": node},
                        "reportingComponent": "kubelet", "reportingInstance": node,
                    })
                    self.posted.append(f"{meta['namespace']}/{meta['name']}: {message}")
        return self.inner.start(pod)

    def stop(self, pod: dict) -> None:
        self.inner.stop(pod)

    def status(self, pod: dict) -> dict | None:
        return self.inner.status(pod)

    def exec_context(self, namespace: str, name: str, container: str):
        return self.inner.exec_context(namespace, name, container)

    def __getattr__(self, name: str):  # the rest of the inner runner's (exec_argv)
        return getattr(self.inner, name)

    def close(self) -> None:
        """Leave the runner as it was (its namespaces); not the kubelet's own close (the inner runner lives on)."""
        self.inner.namespaces -= self.added
        if self.client is not None:
            self.client.close()


def persistent_volume(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"gpuspawner.dev/test": "kubespawner-suite"}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/srv/{name}"}}}


@pytest.fixture(scope="module")
def suite():
    module("kubernetes", "kubespawner's tests need the sync kubernetes client (pip install -e '.[test]')")
    return parent_tests("kubespawner-7.1.0")


@pytest.fixture(scope="module")
def results(suite, kube_cluster, tmp_path_factory):
    """The three modes' results: run at once against ``kube_cluster``, each in its own namespaces."""
    kubelet = kube_cluster.kubelet
    runner = KubeletEvents(kube_cluster, {ns for mode in MODES for ns in namespaces(mode)}, kubelet.runner)
    volumes = [f"ksp-{mode}-{n}" for mode in MODES for n in range(VOLUMES)]
    for name in volumes:
        kube_cluster.api("POST", "/api/v1/persistentvolumes", persistent_volume(name))
    kubelet.runner = runner
    try:
        running = []
        for mode in MODES:
            test_ns, another_ns = namespaces(mode)
            workdir = tmp_path_factory.mktemp(f"kubespawner-{mode}")
            running.append(start_suite(
                TITLE, suite, mode,
                targets=[("kubespawner", "KubeSpawner")],
                gpu_class="gpuspawner.backends.kube.spawner:GPUKubeSpawner",
                defaults={"gpu_profiles": CPU_ONLY} if mode == "cpu" else None,
                extra_plugins=("kubeparent",),
                env={"KUBECONFIG": str(kube_cluster.admin_kubeconfig),
                     "KUBESPAWNER_TEST_NAMESPACE": test_ns, "KUBESPAWNER_ANOTHER_NAMESPACE": another_ns},
                args=SESSION_LOOP,
                workdir=workdir,
                timeout=900,
            ))
        yield {r.mode: finish_suite(r) for r in running}
    finally:
        kubelet.runner = runner.inner
        runner.close()
        for name in volumes:
            kube_cluster.api("DELETE", f"/api/v1/persistentvolumes/{name}", ok=(404,))


@pytest.mark.parametrize("mode", MODES)
def test_kubespawner_suite(results, mode):
    result = results[mode]
    failures = unexpected(result, SECTION, mode)
    assert failures == [], "\n".join(failures) + "\n\n" + result.output
    assert result.skipped == [], "\n".join(result.skipped) + "\n\n" + result.output
    assert result.total == TOTAL, result.output
    # the parent is the baseline: what it passes, the GPU class passes, bar an artefact listed for it
    lost = set(results["parent"].passed) - set(result.passed) - allowed_in(SECTION, mode)
    assert lost == set(), "\n".join(sorted(lost)) + "\n\n" + result.output
