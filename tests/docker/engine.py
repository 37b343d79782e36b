"""A private Docker engine for the tests and benchmarks, stopped by pid afterwards.

:class:`Engine` starts its own ``dockerd`` with a socket, data root, exec root
and pidfile under a temporary directory, no iptables changes, no default
bridge, and its own bridge network (a fresh subnet and interface name), so it
never meets another engine on the machine. The stand-in
``nvidia-container-runtime-hook`` (``tests/docker/hook/``) is first on its
PATH, which makes dockerd register its ``nvidia`` device driver; the hook
checks requested GPUs against the stand-in NVML device file ``gpus_path``.
With ``nvidia_runtime=True`` the stand-in ``nvidia-container-runtime`` (same
folder) is the default runtime, as on a Swarm GPU node; with ``hostname`` the
engine runs in its own UTS namespace under that name (a swarm node of its own).
With ``default_bridge=True`` the engine's default ``bridge`` network exists too
(for code that uses it by name, as DockerSpawner's own tests do), on a bridge
interface of its own (``gb-...``, a fresh subnet) instead of ``docker0``; ``env``
adds variables to dockerd's environment (e.g. a registry's, ``tests/docker/registry.py``).

:func:`unavailable_reason` says why no engine can run here (then tests skip, or fail in CI).
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

from gpuspawner.ports import free_port
from gpuspawner.simulation import simulated_devices

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
HOOK_DIR = Path(__file__).resolve().parent / "hook"
IMAGE_TAG = "gpuspawner-singleuser:test"
TENSORFLOW_TAG = "gpuspawner-tensorflow:test"


def unavailable_reason() -> str | None:
    """None if a private dockerd can run here, else why not."""
    if sys.platform != "linux":
        return "a Docker engine needs Linux"
    if os.geteuid() != 0:
        return "dockerd must run as root to start containers; these tests run as a normal user"
    for tool in ("dockerd", "containerd", "runc"):
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/setup installs docker.io)"
    if not shutil.which("mmdebstrap"):
        return "mmdebstrap is not installed (scripts/setup installs it)"
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 under 10.200.0.0/13 that no route of this machine uses."""
    out = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    used = []
    for line in out.splitlines():
        word = line.split()[0] if line.split() else ""
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    for _ in range(200):
        candidate = ipaddress.ip_network(f"10.{random.randint(200, 207)}.{random.randint(0, 255)}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise RuntimeError("no free 10.200.0.0/13 subnet for the test network")


class Engine:
    """One private dockerd and its bridge network."""

    def __init__(
        self, extra_args: list[str] | tuple[str, ...] = (), *, hostname: str | None = None,
        nvidia_runtime: bool = False, default_bridge: bool = False, env: dict[str, str] | None = None,
    ) -> None:
        self.extra_args = list(extra_args)  # more dockerd flags (e.g. --node-generic-resource)
        self.hostname = hostname  # dockerd in its own UTS namespace with this name (a swarm node's name)
        self.nvidia_runtime = nvidia_runtime  # the stand-in nvidia-container-runtime as default runtime
        self.dir = Path(tempfile.mkdtemp(prefix="gsd-", dir="/tmp"))  # short: socket paths are limited
        self.socket = self.dir / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.pidfile = self.dir / "docker.pid"
        self.gpus_path = self.dir / "gpus.json"
        self.log_path = self.dir / "dockerd.log"
        self.proc: subprocess.Popen | None = None
        self.client: docker.DockerClient | None = None
        self.network = f"gs-{self.dir.name[4:].lower()}"
        self.gateway = ""
        self.extra_env = dict(env or {})
        self.bridge = f"gb-{self.dir.name[4:].lower()}"[:15] if default_bridge else None
        self.bridge_address = ""  # the default bridge's address on this host (where its containers reach it)

    def start(self, timeout: float = 120) -> Engine:
        env = {
            **os.environ,
            "PATH": f"{HOOK_DIR}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
            "FAKENVML_CONFIG": str(self.gpus_path),  # what the stand-in hook checks devices against
            "FAKENVML_LIBRARY": str(self.dir / "fakenvml" / "libnvidia-ml.so.1"),  # what the runtime mounts
        }
        env.pop("DOCKER_HOST", None)
        env.update(self.extra_env)
        bridge = "--bridge=none"
        if self.bridge:
            bridge = f"--bridge={self.bridge}"
            self._make_bridge()
        runtime = []
        if self.nvidia_runtime:
            runtime = ["--add-runtime", f"nvidia={HOOK_DIR / 'nvidia-container-runtime'}",
                       "--default-runtime", "nvidia"]
        node = []
        if self.hostname:  # unshare execs sh, which execs dockerd: the pid stays dockerd's
            node = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                *node,
                "dockerd",
                "--data-root", str(self.dir / "data"),
                "--exec-root", str(self.dir / "exec"),
                "-H", self.url,
                "--pidfile", str(self.pidfile),
                bridge, "--iptables=false", "--ip-masq=false", "--ip-forward=false",
                *runtime,
                *self.extra_args,
            ],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                self.client = docker.DockerClient(base_url=self.url, version="auto", timeout=300)
                self.client.ping()
                break
            except docker.errors.DockerException as e:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"dockerd did not answer within {timeout}s:\n{self.log()}") from e
                time.sleep(0.3)
        subnet = _free_subnet()
        self.gateway = str(next(subnet.hosts()))
        pool = docker.types.IPAMPool(subnet=str(subnet), gateway=self.gateway)
        self.client.networks.create(
            self.network, driver="bridge",
            ipam=docker.types.IPAMConfig(pool_configs=[pool]),
            options={"com.docker.network.bridge.name": self.network[:15]},
        )
        return self

    def _make_bridge(self) -> None:
        """The interface the default ``bridge`` network uses: dockerd takes its address and subnet."""
        subnet = _free_subnet()
        self.bridge_address = str(next(subnet.hosts()))
        for command in (["ip", "link", "add", self.bridge, "type", "bridge"],
                        ["ip", "addr", "add", f"{self.bridge_address}/{subnet.prefixlen}", "dev", self.bridge],
                        ["ip", "link", "set", self.bridge, "up"]):
            subprocess.run(command, check=True, capture_output=True)

    def init_swarm(self, model: str) -> None:
        """Make this engine a one-node swarm on loopback whose node label names its GPUs' model."""
        self.client.swarm.init(advertise_addr="127.0.0.1", listen_addr=f"127.0.0.1:{free_port('127.0.0.1')}")
        self.label_node(model)

    def join_swarm(self, manager: Engine, address: str, model: str) -> None:
        """Join ``manager``'s swarm as a worker listening on ``address`` (another loopback address)."""
        token = manager.client.swarm.attrs["JoinTokens"]["Worker"]
        managers = [n.attrs["ManagerStatus"]["Addr"] for n in manager.client.nodes.list(filters={"role": "manager"})]
        self.client.swarm.join(remote_addrs=managers, join_token=token,
                               listen_addr=f"{address}:{free_port(address)}", advertise_addr=address)
        self.manager = manager
        self.label_node(model)

    def node_id(self) -> str:
        return self.client.info()["Swarm"]["NodeID"]

    def label_node(self, model: str) -> None:
        """Name this node's GPU model in its label (set through a manager) and wait until it is ready."""
        from gpuspawner.backends.swarm.objects import MODEL_LABEL

        manager = getattr(self, "manager", self)
        deadline = time.monotonic() + 60
        while True:
            node = manager.client.nodes.get(self.node_id())
            if node.attrs["Status"]["State"] == "ready" or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        spec = dict(node.attrs["Spec"])
        spec["Labels"] = {**(spec.get("Labels") or {}), MODEL_LABEL: model}
        node.update(spec)

    def env(self) -> dict[str, str]:
        """Variables that point docker clients (and DockerSpawner) at this engine."""
        return {"DOCKER_HOST": self.url}

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def build_image(self, tag: str = IMAGE_TAG, image: str = "singleuser") -> str:
        """Build (or load from build/images) one of images/build.py's images on this engine."""
        proc = subprocess.run(
            [sys.executable, str(ROOT / "images" / "build.py"), "--image", image, "--tag", tag],
            env={**os.environ, **self.env()}, capture_output=True, text=True, timeout=1200,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"building the {image} image failed:\n{proc.stdout}{proc.stderr}")
        return tag

    def containers(self, **filters) -> list:
        """Every container (any state); retried when one vanishes while being listed."""
        for _ in range(20):
            try:
                return self.client.containers.list(all=True, filters=filters)
            except docker.errors.NotFound:
                time.sleep(0.05)
        return self.client.containers.list(all=True, filters=filters)

    def remove_containers(self) -> None:
        for c in self.client.containers.list(all=True):
            try:
                c.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass

    def stop(self, timeout: float = 60) -> None:
        """Remove every container, the network, stop dockerd by pid, delete its files."""
        if self.client is not None:
            try:
                self.remove_containers()
                for net in self.client.networks.list(names=[self.network]):
                    net.remove()
            except docker.errors.DockerException:
                pass
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # containerd-shims of this engine outlive nothing: dockerd stopped its containers.
        self._unmount_leftovers()
        if self.bridge:
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _unmount_leftovers(self) -> None:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        ours = sorted((line.split()[1] for line in mounts if line.split()[1].startswith(str(self.dir))), reverse=True)
        for mount in ours:
            subprocess.run(["umount", "-l", mount], capture_output=True)


def process_environ(container) -> list[tuple[str, str]]:
    """The environment of a container's first process, every entry in order (duplicates kept)."""
    result = container.exec_run(["cat", "/proc/1/environ"])
    if result.exit_code != 0:
        raise RuntimeError(f"reading /proc/1/environ in {container.name} failed: {result.output!r}")
    pairs = []
    for item in result.output.split(b"\0"):
        if b"=" in item:
            key, _, value = item.partition(b"=")
            pairs.append((key.decode(), value.decode()))
    return pairs


def visible_devices(container) -> str:
    """NVIDIA_VISIBLE_DEVICES as the container's process holds it; every copy must agree."""
    values = {v for k, v in process_environ(container) if k == "NVIDIA_VISIBLE_DEVICES"}
    if len(values) != 1:
        raise AssertionError(f"{container.name}: NVIDIA_VISIBLE_DEVICES entries disagree or are missing: {values}")
    return values.pop()


def device_requests(container) -> list[dict]:
    container.reload()
    return container.attrs["HostConfig"].get("DeviceRequests") or []


def gpu_config(count: int) -> dict:
    """A stand-in host with ``count`` GPUs: half A100 80GB, half Tesla T4 (all A100 if odd)."""
    t4 = count // 2 if count > 1 else 0
    return {
        "driver_version": "550.54.15",
        "cuda_driver_version": 12040,
        "nvml_version": "12.550.54.15",
        "devices": simulated_devices(a100=count - t4, t4=t4),
    }
