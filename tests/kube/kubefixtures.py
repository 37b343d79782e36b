"""Constants the gpu-kube tests share (a module of its own: every test folder has a conftest)."""

import json
from pathlib import Path

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
