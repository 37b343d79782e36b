"""A real JupyterHub process spawning gpu-docker containers on a private engine.

The hub runs on this machine (loopback for users, the engine's bridge gateway
for containers), reads the stand-in NVML device file the engine's hook checks
against, and mounts the stand-in library and that file into every container
with ``FAKENVML_CONTAINER=1``, as the NVIDIA runtime mounts the real driver.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from engine import IMAGE_TAG, Engine
from hub import BASE_HUB_CONFIG, Hub, free_port, login

DOCKER_HUB_CONFIG = BASE_HUB_CONFIG + """
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": settings["slow_spawn_timeout"]}
c.JupyterHub.spawner_class = settings["spawner_class"]
c.DockerSpawner.image = settings["image"]
c.DockerSpawner.network_name = settings["network"]
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.prefix = settings["prefix"]
c.DockerSpawner.remove = True
c.DockerSpawner.volumes = settings["volumes"]
c.DockerSpawner.environment = settings["container_env"]
c.DockerSpawner.extra_host_config = settings["extra_host_config"]
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
c.Spawner.default_url = "/lab"
c.GPUDockerSpawner.gpu_hub_id = settings["hub_id"]
c.GPUDockerSpawner.check_cuda_compatibility = settings["check_cuda"]
c.GPUSpawnerMixin.simulated_gpus = True
c.GPUSpawnerMixin.gpu_inventory_ttl = 0.5
c.GPUSpawnerMixin.gpu_profiles = settings["profiles"]
c.GPUSpawnerMixin.gpu_reconcile_interval = 2  # the ledger checked against the engine every 2 s
"""

CONTAINER_LIB = "/opt/fakenvml"
CONTAINER_GPUS = "/etc/fakenvml/gpus.json"


class DockerHub(Hub):
    """A hub whose servers are containers on ``engine``."""

    def __init__(
        self,
        directory: Path,
        engine: Engine,
        nvml_env: dict[str, str],
        libdir: Path,
        profiles: list[dict],
        spawner_class: str = "gpu-docker",
        slow_spawn_timeout: float = 10,
        check_cuda: bool = True,
        image: str = IMAGE_TAG,
        extra_host_config: dict | None = None,
    ) -> None:
        super().__init__(directory, nvml_env, profiles)
        self.engine = engine
        self.hub_id = "test-" + secrets.token_hex(4)
        self.prefix = "gs" + secrets.token_hex(3)
        self.settings.update({
            "hub_bind_url": f"http://{engine.gateway}:{free_port()}",
            "spawner_class": spawner_class,
            "image": image,
            "network": engine.network,
            "prefix": self.prefix,
            "hub_id": self.hub_id,
            "check_cuda": check_cuda,
            "slow_spawn_timeout": slow_spawn_timeout,
            "extra_host_config": extra_host_config or {},
            "volumes": {
                str(libdir): {"bind": CONTAINER_LIB, "mode": "ro"},
                str(engine.gpus_path): {"bind": CONTAINER_GPUS, "mode": "ro"},
            },
            "container_env": {
                "LD_LIBRARY_PATH": CONTAINER_LIB,
                "FAKENVML_CONFIG": CONTAINER_GPUS,
                "FAKENVML_CONTAINER": "1",
            },
        })
        (self.dir / "jupyterhub_config.py").write_text(DOCKER_HUB_CONFIG)
        self.env.update(engine.env())
        self.env["GPUSPAWNER_TEST_HUB"] = json.dumps(self.settings)

    def containers(self) -> list:
        """This hub's containers (any state), by its name prefix."""
        return [c for c in self.engine.containers() if c.name.startswith(self.prefix + "-")]

    def container(self, user: str):
        return self.engine.client.containers.get(f"{self.prefix}-{user}")

    def close(self) -> None:
        super().close()
        for c in self.containers():
            try:
                c.remove(force=True, v=True)
            except Exception:
                pass


def free_in_form(hub: Hub, viewer: str = "form-viewer") -> tuple[int, int]:
    """(free, total) GPUs over every model, as the spawn form shows them to a user."""
    html = login(hub, viewer).get(hub.url + "/hub/spawn", timeout=60).text
    counts = re.findall(r" - (\d+) of (\d+) free", html)
    assert counts, f"the spawn form shows no GPU counts:\n{html[:3000]}"
    # each model is listed once per GPU profile: take one listing per model name
    per_model = dict(re.findall(r">([^<>]+?) - (\d+ of \d+) free", html))
    free = sum(int(v.split(" of ")[0]) for v in per_model.values())
    total = sum(int(v.split(" of ")[1]) for v in per_model.values())
    return free, total
