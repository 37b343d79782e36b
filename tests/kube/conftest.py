"""Fixtures for gpu-kube, on the real Kubernetes control plane (``kube_cluster``, a session fixture of
tests/conftest.py, shared with the parents' suites: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager built from the Go module proxy by gpuspawner.backends.kube.dev.cluster, with the
recorded nodes as fake GPU nodes kept Ready by a fake kubelet).

Each test works in a namespace of its own (``kube_namespace``); ``cluster`` makes the recorded pods
there and runs the hub as its ServiceAccount with the Helm chart's RBAC (kubefixtures.hub_account),
talking to the API server through the real kubernetes_asyncio client, configured by a kubeconfig file
as in a hub. Tests that only build objects use the recorded ones (``node_items``, ``pod_items``) and
no cluster.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import pytest_asyncio

from kubefixtures import (
    HUB_CLUSTER_RULES,
    HUB_RULES,
    SpawnerMaker,
    as_hub,
    hub_account,
    load,
    load_pods,
    namespace_of_its_own,
    write_kubeconfig,
)
from needs import missing


@pytest.fixture
def kube_namespace(kube_cluster):
    """A namespace of this test's own in ``kube_cluster`` (kubefixtures.namespace_of_its_own)."""
    with namespace_of_its_own(kube_cluster) as name:
        yield name


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
    """The real ``kube_cluster`` (``cluster.kube``) seen from a test's namespace (``namespace``), where the
    recorded pods were made and the hub runs as its ServiceAccount (``url``: the API server)."""

    def api(self, method: str, path: str, body=None, **kwargs):
        """A request as the cluster's admin (kubectl, an operator)."""
        return self.kube.api(method, path, body, **kwargs)

    def hub(self, monkeypatch, rules: list[dict] = HUB_RULES, cluster_rules: list[dict] = HUB_CLUSTER_RULES) -> None:
        """The hub's ServiceAccount given these rights (default: the Helm chart's), and its kubeconfig in use."""
        as_hub(monkeypatch, hub_account(self.kube, self.namespace, rules, cluster_rules))

    def pod(self, name: str) -> dict | None:
        return self.api("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}", ok=(404,))

    def made_pods(self) -> list[str]:
        """The pods of the namespace besides the recorded ones (what the hub made and still has), sorted."""
        items = self.api("GET", f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        return sorted({p["metadata"]["name"] for p in items} - self.recorded)

    def made_claims(self) -> list[str]:
        items = self.api("GET", f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims")["items"]
        return sorted(p["metadata"]["name"] for p in items)

    def delete_pod(self, name: str) -> None:
        """Delete a pod through the API, as its owner (a job controller, a user) would; the kubelet ends it."""
        self.api("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}")


@pytest_asyncio.fixture
async def cluster(kube_cluster, kube_namespace, monkeypatch, pod_items):
    """The recorded cluster (tests/kube/fixtures) on the real control plane: the standing fake nodes, the
    recorded pods made again in this test's namespace (bound to their nodes; jhub's and the others'), and
    ``KUBECONFIG`` set to the hub's ServiceAccount there with the Helm chart's RBAC."""
    from kubespawner import KubeSpawner
    from kubespawner.clients import load_config

    c = Cluster(kube=kube_cluster, namespace=kube_namespace, url=kube_cluster.server,
                recorded={p["metadata"]["name"] for p in pod_items})
    c.hub(monkeypatch)
    load_pods(kube_cluster, kube_namespace, pod_items)
    yield c
    # KubeSpawner's pod and event reflectors are shared by the class, across spawners: stop them with the hub
    await KubeSpawner._stop_all_reflectors()
    load_config.cache_clear()


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> str:
    """For tests that only configure spawners and build objects: ``KUBECONFIG`` set to an API address with
    no server behind it (nothing is asked of it); that address."""
    url = "https://127.0.0.1:9"
    as_hub(monkeypatch, str(write_kubeconfig(tmp_path / "kubeconfig", url)))
    return url


@pytest.fixture
def make_spawner(cluster, fresh_metrics):
    """GPUKubeSpawner instances configured like a hub would, in ``cluster``'s namespace as its ServiceAccount.

    ``make_spawner(**settings)`` (KubeSpawner's own mock user and hub, ``_mock=True``)
    or ``make_spawner(user="zoe", server="big", groups=[...], **settings)``; all
    spawners of one test share one hub state until ``make_spawner.restart()``.
    """
    return SpawnerMaker(cluster.url, cluster.namespace)


@pytest.fixture(scope="session")
def kueue(kube_cluster):
    """Real Kueue on ``kube_cluster`` for this test run: the controller of
    gpuspawner.backends.kube.dev.kueue.KUEUE_VERSION, built on first use into ``~/.cache/gpuspawner/kueue/<version>``
    (``GPUSPAWNER_KUEUE_CACHE``; minutes cold, nothing warm), with its CRDs, RBAC, webhooks (called
    by URL on loopback) and visibility API (an APIService through the API server's aggregator), its
    pod integration on for namespaces labelled ``gpuspawner.dev/kueue=true``. A
    :class:`~gpuspawner.backends.kube.dev.kueue.Kueue`; stopped by its pid at the end of the run, its webhooks
    removed. Where it cannot be built or run (or another Kueue holds its fixed port 8082), the tests
    that use it skip, saying why (fail in CI)."""
    from gpuspawner.backends.kube.dev import kueue as devkueue

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
