"""Fixtures for gpu-kube: recorded cluster objects served by a Kubernetes API test double.

The test double is kmock's KubernetesEmulator (PyPI ``kmock``): a real HTTP
server on 127.0.0.1 answering the Kubernetes REST API from the objects loaded
into it. gpuspawner and KubeSpawner talk to it through the real
kubernetes_asyncio client, configured by a kubeconfig file as in a hub.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import kmock
import pytest
import pytest_asyncio
import yaml

from kubefixtures import FIXTURES

NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")


def load(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())["items"]


@pytest.fixture
def node_items() -> list[dict]:
    return load("nodes.json")


@pytest.fixture
def pod_items() -> list[dict]:
    return load("pods.json")


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "jhub"}}],
        "current-context": "test",
    }))
    return path


class Cluster(SimpleNamespace):
    """A running API test double: ``url``, ``handler`` (kmock), and helpers."""

    def load(self, nodes: list[dict], pods: list[dict]) -> None:
        for node in nodes:
            self.handler.objects[NODES, None, node["metadata"]["name"]] = copy.deepcopy(node)
        for pod in pods:
            meta = pod["metadata"]
            self.handler.objects[PODS, meta["namespace"], meta["name"]] = copy.deepcopy(pod)

    def requests(self, method: str = "", path_part: str = "") -> list:
        return [r for r in self.handler
                if (not method or str(r.method.value).upper() == method.upper()) and path_part in r.url.path]


@pytest_asyncio.fixture
async def cluster(tmp_path, monkeypatch, node_items, pod_items):
    """The recorded cluster (tests/kube/fixtures) on a loopback API server; KUBECONFIG points at it."""
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
    load_config.cache_clear()


@pytest.fixture
def make_spawner(cluster):
    """GPUKubeSpawner instances configured like a hub would, talking to the test double.

    The user and hub are KubeSpawner's own test mocks (``_mock=True``).
    """
    from traitlets.config import Config

    from gpuspawner.spawners.kube import GPUKubeSpawner

    def make(**settings) -> GPUKubeSpawner:
        config = Config()
        config.KubeSpawner.namespace = "jhub"
        config.KubeSpawner.image = "quay.io/jupyter/base-notebook:2024-05-27"
        config.KubeSpawner.k8s_api_host = cluster.url
        for key, value in settings.items():
            setattr(config.GPUKubeSpawner, key, value)
        return GPUKubeSpawner(_mock=True, config=config)

    return make
