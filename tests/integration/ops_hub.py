"""A test hub with gpuspawner's operations configured (admin overview, scope, metrics, culler)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fakenvml
from gpuspawner.simulation import simulated_config
from hub import Hub

OPS_CONFIG = """
from gpuspawner.hub.setup import configure
ops = json.loads(os.environ["GPUSPAWNER_TEST_OPS"])
c.Authenticator.admin_users = {"boss"}
c.JupyterHub.authenticate_prometheus = True
c.JupyterHub.concurrent_spawn_limit = 0
c.JupyterHub.allow_named_servers = True
c.JupyterHub.services.append({"name": "gpu-reader", "api_token": ops["reader_token"]})
c.JupyterHub.load_roles.append({"name": "gpu-reader", "scopes": ["custom:gpus:read", "read:metrics"],
                                "services": ["gpu-reader"]})
for key, value in ops.get("mixin", {}).items():
    setattr(c.GPUSpawnerMixin, key, value)
c.JupyterHub.load_groups = ops.get("groups", {})
c.Spawner.args = c.Spawner.args + ops.get("server_args", [])
configure(c, culler=ops.get("culler"))
"""


class OpsHub(Hub):
    """A Hub whose configuration calls gpuspawner.hub.setup.configure, plus a reader service token."""

    def __init__(self, directory: Path, libdir: Path, profiles: list[dict], *, devices: dict | None = None,
                 mixin: dict | None = None, groups: dict | None = None, culler: dict | None = None,
                 server_args: list[str] | None = None) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.gpus_path = directory / "gpus.json"
        self.gpus_config = devices or simulated_config(a100=2, t4=2)
        fakenvml.write_config(self.gpus_path, self.gpus_config)
        super().__init__(directory / "hub", fakenvml.env(libdir, self.gpus_path), profiles, extra_config=OPS_CONFIG)
        self.reader_token = secrets.token_hex(16)
        ops = {"reader_token": self.reader_token, "mixin": mixin or {}, "groups": groups or {},
               "server_args": server_args or []}
        if culler is not None:
            ops["culler"] = {"url": self.url, **culler}
        self.env["GPUSPAWNER_TEST_OPS"] = json.dumps(ops)

    def set_utilization(self, values: dict[str, int]) -> None:
        """Rewrite the stand-in's device file: uuid -> GPU utilisation (the stand-in reloads it)."""
        for device in self.gpus_config["devices"]:
            if device["uuid"] in values:
                device["utilization_gpu"] = values[device["uuid"]]
        fakenvml.write_config(self.gpus_path, self.gpus_config)

    def overview(self, token: str | None = None):
        import requests

        return requests.get(self.url + "/hub/api/gpus", timeout=60,
                            headers={"Authorization": f"token {token or self.reader_token}"})


@contextmanager
def started(hub: Hub) -> Iterator[Hub]:
    """``hub`` started, then closed (its users' servers stopped first) however the block ends."""
    hub.start()
    try:
        yield hub
    finally:
        hub.close()
