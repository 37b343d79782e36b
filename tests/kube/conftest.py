"""Fixtures for gpu-kube: on the real Kubernetes control plane (``kube_cluster``, a session fixture of
tests/conftest.py, shared with the parents' suites: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager built from the Go module proxy by gpuspawner.kube.devcluster, with the
recorded nodes as fake GPU nodes) and recorded cluster objects served by a Kubernetes API test
double (``cluster``).

The test double is kmock's KubernetesEmulator (PyPI ``kmock``): a real HTTP
server on 127.0.0.1 answering the Kubernetes REST API from the objects loaded
into it. gpuspawner and KubeSpawner talk to it through the real
kubernetes_asyncio client, configured by a kubeconfig file as in a hub.
"""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace

import aiohttp
import kmock
import pytest
import pytest_asyncio

from kubefixtures import NODES, PODS, SpawnerMaker, load, pod_controller, until, write_kubeconfig
from needs import missing


@pytest.fixture
def kube_namespace(kube_cluster):
    """A namespace of this test's own in ``kube_cluster`` (its ``default`` ServiceAccount made, so pods
    are accepted), deleted afterwards with all it holds (waited for)."""
    name = f"t-{os.urandom(4).hex()}"
    kube_cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": name}})
    until(lambda: kube_cluster.api("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default", ok=(404,)),
          f"the ServiceAccount controller makes {name}/default")
    yield name
    kube_cluster.api("DELETE", f"/api/v1/namespaces/{name}", ok=(404,))
    # gone before the next test reads the shared cluster's capacity (its pods no longer hold GPUs)
    until(lambda: kube_cluster.api("GET", f"/api/v1/namespaces/{name}", ok=(404,)) is None,
          f"the namespace controller deletes {name} and its pods")


@pytest_asyncio.fixture
async def kube_admin(kube_cluster, monkeypatch):
    """``KUBECONFIG`` (and kubernetes_asyncio's and KubeSpawner's cached client configuration) set to
    ``kube_cluster``'s admin, as for a hub outside the cluster; the cluster."""
    from kubespawner import KubeSpawner
    from kubespawner.clients import load_config

    kubeconfig = str(kube_cluster.admin_kubeconfig)
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    monkeypatch.setattr("kubernetes_asyncio.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
    load_config.cache_clear()
    yield kube_cluster
    await KubeSpawner._stop_all_reflectors()
    load_config.cache_clear()


@pytest.fixture
def node_items() -> list[dict]:
    return load("nodes.json")


@pytest.fixture
def pod_items() -> list[dict]:
    return load("pods.json")


class Cluster(SimpleNamespace):
    """A running API test double: ``url``, ``handler`` (kmock), and helpers."""

    def load(self, nodes: list[dict], pods: list[dict]) -> None:
        for node in nodes:
            self.handler.objects[NODES, None, node["metadata"]["name"]] = copy.deepcopy(node)
        for pod in pods:
            meta = pod["metadata"]
            self.handler.objects[PODS, meta["namespace"], meta["name"]] = copy.deepcopy(pod)

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod through the API, as its owner (a job controller, a user) would."""
        async with aiohttp.ClientSession() as session:
            async with session.delete(f"{self.url}/api/v1/namespaces/{namespace}/pods/{name}") as response:
                response.raise_for_status()

    def requests(self, method: str = "", path_part: str = "") -> list:
        return [r for r in self.handler
                if (not method or str(r.method.value).upper() == method.upper()) and path_part in r.url.path]


@pytest_asyncio.fixture
async def cluster(tmp_path, monkeypatch, node_items, pod_items):
    """The recorded cluster (tests/kube/fixtures) on a loopback API server; KUBECONFIG points at it."""
    from kubespawner import KubeSpawner
    from kubespawner.clients import load_config

    async with kmock.KubernetesEmulator() as handler, kmock.Server(handler) as server:
        handler.resources["v1/events"] = {}
        url = str(server.url).rstrip("/")
        kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig", url))
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        # kubernetes_asyncio reads KUBECONFIG once, at import
        monkeypatch.setattr("kubernetes_asyncio.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
        load_config.cache_clear()  # KubeSpawner configures its client once per process and host
        c = Cluster(url=url, handler=handler)
        c.load(node_items, pod_items)
        yield c
        # KubeSpawner's pod and event reflectors are shared by the class, across
        # spawners: any test's spawner (a stop() starts them too) would leave them
        # watching this API server after it is gone.
        await KubeSpawner._stop_all_reflectors()
    load_config.cache_clear()


@pytest.fixture
def make_spawner(cluster):
    """GPUKubeSpawner instances configured like a hub would, talking to the test double.

    ``make_spawner(**settings)`` (KubeSpawner's own mock user and hub, ``_mock=True``)
    or ``make_spawner(user="zoe", server="big", groups=[...], **settings)``; all
    spawners of one test share one hub state until ``make_spawner.restart()``.
    """
    from gpuspawner.state import stop_serving_hub_metrics

    yield SpawnerMaker(cluster.url)
    stop_serving_hub_metrics()


@pytest_asyncio.fixture
async def kubelet(cluster):
    """Stands in for what the API server and a kubelet add to a created pod: it runs at once.

    Every pod created through the API (one without a ``status.phase``) gets its
    namespace and a uid in ``metadata`` and a Running status with a ready
    ``notebook`` container, by a PATCH through the API, so KubeSpawner's pod
    reflector sees it start. (KubeSpawner's reflectors are stopped with ``cluster``.)
    """

    def run(namespace: str, name: str, pod: dict) -> dict | None:
        if (pod.get("status") or {}).get("phase"):
            return None
        image = pod["spec"]["containers"][0].get("image", "")
        return {
            "metadata": {"namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "status": {"phase": "Running", "podIP": "10.244.9.9", "containerStatuses": [
                {"name": "notebook", "ready": True, "restartCount": 0, "image": image,
                 "imageID": image, "state": {"running": {}}}]},
        }

    async with pod_controller(cluster.url, cluster.handler, run, 0.05):
        yield


@pytest.fixture(scope="session")
def kueue(kube_cluster):
    """Real Kueue on ``kube_cluster`` for this test run: the controller of
    gpuspawner.kube.devkueue.KUEUE_VERSION, built on first use into ``~/.cache/gpuspawner/kueue/<version>``
    (``GPUSPAWNER_KUEUE_CACHE``; minutes cold, nothing warm), with its CRDs, RBAC, webhooks (called
    by URL on loopback) and visibility API (an APIService through the API server's aggregator), its
    pod integration on for namespaces labelled ``gpuspawner.dev/kueue=true``. A
    :class:`~gpuspawner.kube.devkueue.Kueue`; stopped by its pid at the end of the run, its webhooks
    removed. Where it cannot be built or run (or another Kueue holds its fixed port 8082), the tests
    that use it skip, saying why (fail in CI)."""
    from gpuspawner.kube import devkueue

    why = devkueue.cannot_start()
    if why:
        missing(why)
    try:
        devkueue.build()
    except RuntimeError as error:
        missing(f"Kueue could not be built: {error}")
    kueue = devkueue.Kueue(kube_cluster)
    try:
        try:
            kueue.start()
        except devkueue.PortTaken as error:  # another test run's Kueue, say
            missing(str(error))
        yield kueue
    finally:
        kueue.stop()
