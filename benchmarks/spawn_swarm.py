"""What gpu-swarm costs on a real one-node Docker swarm: ``scripts/bench spawn_swarm``.

Starts a private dockerd whose node advertises 4 stand-in A100s as generic
resources ``NVIDIA-GPU=GPU-<uuid>`` and names their model in its node label, as
the Swarm tests do (tests/docker/conftest.py ``swarm_engine``), builds or loads
the single-user image, and prints figures only (asserts nothing about timing):

spawn-to-ready, median over ``--rounds`` spawns each, of gpu-swarm (1 GPU of the
A100 profile) and of DockerSpawner's plain ``SwarmSpawner`` with the same generic
resource request (a service reserving ``NVIDIA-GPU=1``, constrained to nodes
labelled with that model), on the same engine and image, interleaved (who goes
first rotates every round; round 0 warms both up and is not counted), and the
ratio of gpu-swarm to plain (goal: 1.05 or less). Both hubs' tasks use the
node's ``host`` network: plain SwarmSpawner configured as dockerspawner
documents for host networking (``get_ip_and_port`` overridden to answer
``self.host_ip, self.port``, in the hub's config; one fixed port, free when the
benchmark starts, since one server runs at a time), gpu-swarm with a port of
its own per server. A spawn is timed from the REST POST until the Jupyter server
in the task answers (``/user/NAME/api`` at 127.0.0.1 and the port the service's
``JUPYTERHUB_SERVICE_URL`` names, polled every 20 ms), and until the hub marks
it ready (polled at 20 ms once the server answers; the hub's own check backs off with random jitter and
SwarmSpawner waits for the task with a 1 s backoff, so that figure is coarser).
Between spawns each stopped service's task containers are waited out, untimed.

Needs root (dockerd), docker.io and mmdebstrap (scripts/setup installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# the test helpers by their plain names, as under pytest (scripts/bench puts pytest's pythonpath on this process's path)
from spawn_timing import interleaved, no_engine_here, print_medians, timed_spawn

import fakenvml
from dockerhub import DockerHub
from engine import Engine, gpu_config
from gpuspawner.backends.swarm.objects import MODEL_LABEL, RESOURCE_KIND
from gpuspawner.simulation import simulated_devices
from hub import free_port

ROOT = Path(__file__).resolve().parent.parent
PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["a100"], "gpu_counts": [1],
             "default_gpus": 1, "default": True}]
GPU_BODY = {"profile": "gpu", "gpus": 1, "gpu_model": "a100-sxm4-80gb"}

# Plain SwarmSpawner on the host network, as its get_ip_and_port docstring says to configure it,
# with the service reserving the same generic resource on nodes of the same model as gpu-swarm's.
PLAIN_CONFIG = f"""
from dockerspawner import SwarmSpawner


class HostNetworkSwarmSpawner(SwarmSpawner):
    async def get_ip_and_port(self):
        return self.host_ip, self.port


c.JupyterHub.spawner_class = HostNetworkSwarmSpawner
c.SwarmSpawner.port = settings["plain_port"]
c.SwarmSpawner.extra_resources_spec = {{"generic_resources": {{"{RESOURCE_KIND}": 1}}}}
c.SwarmSpawner.extra_placement_spec = {{"constraints": ["node.labels.{MODEL_LABEL}==" + settings["gpu_model"]]}}
"""


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"# {platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}; load average {load}")


def service_port(hub: DockerHub, name: str) -> int | None:
    """The port the user's service tells its server to listen on (its JUPYTERHUB_SERVICE_URL)."""
    service_name = f"{hub.prefix}-{name}"
    for service in hub.engine.client.services.list(filters={"name": service_name}):
        spec = service.attrs["Spec"]
        if spec["Name"] != service_name:
            continue
        for entry in spec["TaskTemplate"]["ContainerSpec"].get("Env") or []:
            key, _, value = entry.partition("=")
            if key == "JUPYTERHUB_SERVICE_URL":
                return int(value.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    return None


def service_request(hub: DockerHub, name: str) -> str:
    """What the user's service reserves and where it may run, in words (the same for both, or unfair)."""
    spec = hub.engine.client.services.get(f"{hub.prefix}-{name}").attrs["Spec"]["TaskTemplate"]
    reserved = [f"{r['DiscreteResourceSpec']['Kind']}={r['DiscreteResourceSpec']['Value']}"
                for r in (spec.get("Resources") or {}).get("Reservations", {}).get("GenericResources") or []
                if "DiscreteResourceSpec" in r]
    networks = [hub.engine.client.networks.get(n["Target"]).name for n in spec.get("Networks") or []]
    constraints = (spec.get("Placement") or {}).get("Constraints") or []
    return f"reserves {', '.join(reserved) or 'nothing'}; constraints {constraints}; networks {networks}"


def task_url(hub: DockerHub, name: str) -> str | None:
    port = service_port(hub, name)
    return f"http://127.0.0.1:{port}/user/{name}/api" if port else None


def wait_tasks_gone(hub: DockerHub, name: str, timeout: float = 120) -> None:
    """Wait until the stopped service's task containers are gone (its port is free again)."""
    label = f"com.docker.swarm.service.name={hub.prefix}-{name}"
    deadline = time.monotonic() + timeout
    while hub.engine.containers(label=label):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}'s task containers still there after {timeout}s")
        time.sleep(0.2)


def spawn_to_ready(hubs: dict[str, DockerHub], rounds: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    requests_made: dict[str, str] = {}

    def spawn(key: str, hub: DockerHub, name: str, round_: int) -> tuple[float, float]:
        timed = timed_spawn(hub, name, GPU_BODY if key == "gpu" else "", lambda: task_url(hub, name))
        if not round_:
            requests_made[key] = service_request(hub, name)
        hub.stop_server(name, timeout=120)
        wait_tasks_gone(hub, name)
        return timed

    return interleaved(hubs, rounds, spawn), requests_made


def remove_services(engine: Engine, prefix: str) -> None:
    for service in engine.client.services.list():
        if service.name.startswith(prefix + "-"):
            try:
                service.remove()
            except Exception:
                pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed spawns per spawner (default 10)")
    args = parser.parse_args()
    if no_engine_here():
        return 1
    print(machine())
    work = Path(tempfile.mkdtemp(prefix="bench-swarm-"))
    config = {**gpu_config(4), "devices": simulated_devices(a100=4, t4=0)}
    model = config["devices"][0]["name"]
    engine = Engine([a for d in config["devices"] for a in ("--node-generic-resource", f"NVIDIA-GPU={d['uuid']}")])
    hubs: list[DockerHub] = []
    try:
        engine.start()
        fakenvml.write_config(engine.gpus_path, config)
        engine.init_swarm(model)
        engine.build_image()
        libdir = fakenvml.build(ROOT / "build" / "fakenvml")
        container_libdir = engine.dir / "fakenvml"  # containers' users must read it (0755)
        container_libdir.mkdir(mode=0o755)
        shutil.copy(libdir / fakenvml.LIBRARY_NAME, container_libdir / fakenvml.LIBRARY_NAME)
        (container_libdir / fakenvml.LIBRARY_NAME).chmod(0o755)
        env = fakenvml.env(libdir, engine.gpus_path)

        def hub(name: str, spawner_class: str, extra_config: str = "", **settings) -> DockerHub:
            h = DockerHub(work / name, engine, env, container_libdir, PROFILES, spawner_class=spawner_class,
                          slow_spawn_timeout=0)
            hubs.append(h)
            h.settings.update(network="host", **settings)  # tasks share the node's network
            h.env["GPUSPAWNER_TEST_HUB"] = json.dumps(h.settings)
            if extra_config:
                with open(h.dir / "jupyterhub_config.py", "a") as f:
                    f.write(extra_config)
            h.start(timeout=120)
            return h

        spawners = {
            "plain": hub("plain", "docker", PLAIN_CONFIG, plain_port=free_port(), gpu_model=model),
            "gpu": hub("gpu", "gpuspawner.backends.swarm.spawner.GPUSwarmSpawner"),
        }
        t, made = spawn_to_ready(spawners, args.rounds)
        labels = {"plain": f"SwarmSpawner, {RESOURCE_KIND}=1 reserved", "gpu": "gpu-swarm, 1 GPU"}
        print("the services (round 0):")
        for key, label in labels.items():
            print(f"  {label}: {made[key]}")
        print(f"spawn-to-ready, median of {args.rounds} each (same swarm and image, host network, interleaved):")
        for title, suffix in (("until the server in the task answers", ""),
                              ("until the hub says ready (its checks back off)", "_hub")):
            print(f"  {title}:")
            print_medians(t, labels, suffix)
            ratio = statistics.median(t["gpu" + suffix]) / statistics.median(t["plain" + suffix])
            print(f"    ratio gpu-swarm / SwarmSpawner with the same generic resource request: "
                  f"{ratio:.3f} (goal <= 1.05)")
    finally:
        for h in hubs:
            h.close()
            if engine.client is not None:
                remove_services(engine, h.prefix)
        engine.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(machine())
    return 0


if __name__ == "__main__":
    sys.exit(main())
