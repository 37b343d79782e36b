"""Constants the gpu-kube tests share (a module of its own: every test folder has a conftest)."""

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import kmock
import yaml

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# kmock's handle on the core/v1 events resource, for scripting scheduling events
EVENTS = kmock.resource("", "v1", "events")
NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")


def load(name: str) -> list[dict]:
    """The items of a recorded object list in tests/kube/fixtures."""
    return json.loads((FIXTURES / name).read_text())["items"]


def load_object(name: str, pod_name: str = "POD") -> dict:
    """A recorded object in tests/kube/fixtures, the placeholder pod name ``POD`` replaced."""
    return json.loads((FIXTURES / name).read_text().replace('"POD"', json.dumps(pod_name))
                      .replace("pod-POD-", f"pod-{pod_name}-"))


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


@contextlib.asynccontextmanager
async def pod_controller(url: str, handler, change: Callable[[str, str, dict], dict | None], interval: float):
    """While open, PATCHes through the API every live pod ``change(namespace, name, pod)``
    returns a merge patch for, as a controller of the API server would (a kubelet, a webhook)."""

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                for (resource, namespace, name), obj in list(handler.objects.items()):
                    if resource != PODS or obj.deleted:
                        continue
                    body = change(namespace, name, obj)
                    if body is None:
                        continue
                    async with session.patch(f"{url}/api/v1/namespaces/{namespace}/pods/{name}", data=json.dumps(body),
                                             headers={"Content-Type": "application/merge-patch+json"}) as response:
                        response.raise_for_status()
                await asyncio.sleep(interval)

    task = asyncio.ensure_future(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def until(check: Callable[[], object], what: str, timeout: float = 60, period: float = 0.2):
    """``check()``'s first true answer, polling; fails naming ``what`` when none comes in ``timeout``
    seconds (a bound on waiting for the cluster, not a timing being tested)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f}s in vain: {what}")
        time.sleep(period)


class SpawnerMaker:
    """Makes GPUKubeSpawner instances of one hub (one traitlets Config, so one hub state)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.settings: dict = {}
        self.restart()

    def restart(self) -> None:
        """A new hub with the same settings: a new Config, so a new hub state, as after a restart."""
        from traitlets.config import Config

        self.config = Config()
        self.config.KubeSpawner.namespace = "jhub"
        self.config.KubeSpawner.image = "quay.io/jupyter/base-notebook:2024-05-27"
        self.config.KubeSpawner.k8s_api_host = self.url
        for key, value in self.settings.items():
            setattr(self.config.GPUKubeSpawner, key, value)

    def __call__(self, user: str | None = None, server: str = "", groups: tuple = (), **settings):
        """A spawner for ``user``'s server ``server`` (default: KubeSpawner's mock user)."""
        from gpuspawner.spawners.kube import GPUKubeSpawner

        for key, value in settings.items():
            setattr(self.config.GPUKubeSpawner, key, value)
        self.settings.update(settings)
        extra = {}
        if user is not None:
            extra["user"] = SimpleNamespace(name=user, id=abs(hash(user)) % 10_000, url=f"/user/{user}/",
                                            groups=list(groups))
        if server:
            extra["orm_spawner"] = SimpleNamespace(name=server, display_name=server, server=None)
        return GPUKubeSpawner(_mock=True, config=self.config, **extra)
