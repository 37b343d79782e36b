"""Pods of the development cluster that really run: their containers as local processes.

:class:`ProcessRunner` is the fake kubelet's :class:`~gpuspawner.backends.kube.dev.kubelet.PodRunner` for pods
that must serve (a single-user server the hub connects to, a helper pod a test execs into). From
the pod the API server holds, each container is started as a container runtime would start it:

- the program: ``command`` + ``args``, or ``args`` alone with the image's entrypoint, which here is
  unknown and taken as none; with neither, the image's default: ``jupyterhub-singleuser`` for the
  single-user images, ``python3`` for ``python`` images, ``jupyterhub`` for the hub's. It is looked
  up in the container's ``PATH``, which is the image's: the machine's ``.venv/bin`` (what a
  single-user image holds) before ``/usr/local/bin:/usr/bin:/bin``. ``$(VAR)`` references are
  expanded as the kubelet does;
- the environment: exactly what the pod spec gives (``env`` with values and field, ConfigMap and
  Secret references, ``envFrom`` of ConfigMaps and Secrets) over the image's ``PATH``, ``HOME`` and
  ``HOSTNAME``, and for ``nvidia.com/gpu`` limits what NVIDIA's device plugin adds: the allocated
  GPUs' UUIDs in ``NVIDIA_VISIBLE_DEVICES`` (and, as no container runtime hides the others here,
  ``CUDA_VISIBLE_DEVICES``);
- its network: the pod's own IP, a loopback address the fake kubelet gives each such pod
  (``127.X.<node>.<n>``). A container that listens on every address (``0.0.0.0``, as a single-user
  server in a pod does) or on ``127.0.0.1`` listens on its pod IP, and its connections to
  ``127.0.0.1`` go there too: gpuspawner.backends.kube.dev.container's preloaded shim stands in for a network
  namespace (``LD_PRELOAD`` and ``GPUSPAWNER_POD_IP``, the only two variables beyond the pod's own);
- its volumes: ``configMap``, ``secret`` and ``emptyDir`` volumes mounted at their ``mountPath``
  in a mount namespace of the pod's own (gpuspawner.backends.kube.dev.container; other kinds are not mounted);
- its user: ``runAsUser``/``runAsGroup`` of the container or the pod (``fsGroup`` and
  ``supplementalGroups`` as extra groups); never root: without a ``runAsUser`` (or with 0) it runs
  as the single-user images' ``jovyan`` (uid 1000, gid 100). Each pod has a home folder of its own.

A pod whose containers this runner cannot stand in for (another image, init containers) or outside
its ``namespaces`` is left to the base class: on paper, with an address nothing listens on.
Deleting a pod stops its processes by their pids (SIGTERM, SIGKILL after the grace period, at
most :data:`STOP_SECONDS`); a container that ends is reported Terminated with its exit code, the
pod Succeeded or Failed once all have ended (no restarts).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from . import container as devcontainer
from .api import APIError, Client, _now
from .container import build_shim
from .kubelet import PodRunner

#: the single-user images' user (docker-stacks' NB_UID, NB_GID)
JOVYAN = (1000, 100)
STOP_SECONDS = 10
SINGLEUSER_IMAGE = re.compile(r"(^|[/-])(base|minimal|scipy|datascience|pytorch|tensorflow|r|julia|pyspark|"
                              r"all-spark)-notebook$|singleuser|(^|/)gpuspawner-")
PYTHON_IMAGE = re.compile(r"(^|/)python$")
HUB_IMAGE = re.compile(r"(^|/)jupyterhub/jupyterhub$")
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def repository(image: str) -> str:
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return name


def default_command(image: str) -> list[str] | None:
    """The image's default command as far as this runner stands in for it (None: not an image it runs)."""
    name = repository(image)
    if SINGLEUSER_IMAGE.search(name):
        return ["jupyterhub-singleuser"]
    if PYTHON_IMAGE.search(name):
        return ["python3"]
    if HUB_IMAGE.search(name):
        return ["jupyterhub"]
    return None


def expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` as the kubelet expands it: a defined variable's value, an undefined one kept, ``$$`` a ``$``."""
    return _REFERENCE.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpuspawner-fake-node/{node}/{index}')}"


@dataclasses.dataclass
class Container:
    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen | None = None
    started: str = ""
    ports: list[int] = dataclasses.field(default_factory=list)  # up once something listens on each
    ready: bool = False
    ended: dict | None = None  # the Terminated state


@dataclasses.dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    node: str
    ip: str
    user: tuple[int, int, list[int]]
    home: Path
    gpus: list[int]
    grace: float
    containers: dict[str, Container]


class ProcessRunner(PodRunner):
    """Runs the pods of ``namespaces`` (None: every namespace) whose images it stands in for, as local
    processes; ``address(node)`` gives a pod IP on node ``node`` (the fake kubelet's ``pod_address``)."""

    def __init__(self, kubelet, namespaces: set[str] | None = None, folder: Path | None = None,
                 venv_bin: Path | None = None) -> None:
        self.kubelet = kubelet
        self.namespaces = namespaces
        self.venv_bin = Path(venv_bin or Path(sys.executable).parent)
        self._own_folder = folder is None
        self.folder = Path(folder or tempfile.mkdtemp(prefix="gpuspawner-pods-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o711)  # the pods' users pass through to their homes, and read the shim
        self.shim = build_shim(self.folder)
        self.pods: dict[str, Pod] = {}  # uid -> Pod
        self._lock = threading.Lock()
        self._client: Client | None = None

    # which pods
    def runs(self, pod: dict) -> bool:
        spec = pod["spec"]
        if self.namespaces is not None and pod["metadata"]["namespace"] not in self.namespaces:
            return False
        if spec.get("initContainers"):
            return False
        return all(default_command(c.get("image", "")) for c in spec["containers"])

    # PodRunner
    def start(self, pod: dict) -> str | None:
        if not self.runs(pod):
            return None
        meta, spec = pod["metadata"], pod["spec"]
        node = spec["nodeName"]
        ip = self.kubelet.pod_address(node)
        top = self.folder / meta["uid"]
        top.mkdir(mode=0o711, exist_ok=True)
        home = top / "home"
        user = self._user(spec, spec["containers"][0])
        home.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(home, user[0], user[1])
        volumes = self._volumes(pod, top / "volumes")
        wanted = sum(int((c.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu", 0))
                     for c in spec["containers"])
        entry = Pod(meta["namespace"], meta["name"], meta["uid"], node, ip, user, home,
                    self._allocate(node, wanted), float(spec.get("terminationGracePeriodSeconds", 30)), {})
        gpus = [gpu_uuid(node, i) for i in entry.gpus]
        for container in spec["containers"]:
            env = self._environment(pod, container, ip, home)
            if gpus and (container.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu"):
                env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            argv = [expand(a, env) for a in (container.get("command") or []) + (container.get("args") or [])]
            if not container.get("command") and not container.get("args"):
                argv = default_command(container.get("image", "")) or []
            entry.containers[container["name"]] = Container(container["name"], argv, env, ports=ports_of(container))
        with self._lock:
            self.pods[entry.uid] = entry
        for container in spec["containers"]:
            mounts = [[str(volumes[m["name"]] / m.get("subPath", "")).rstrip("/"), m["mountPath"]]
                      for m in container.get("volumeMounts") or [] if m["name"] in volumes]
            self._launch(entry, entry.containers[container["name"]], container.get("workingDir"), mounts)
        return ip

    def stop(self, pod: dict) -> None:
        with self._lock:
            entry = self.pods.pop(pod["metadata"]["uid"], None)
        if entry is None:
            return
        grace = min(entry.grace, STOP_SECONDS)
        processes = [c.process for c in entry.containers.values() if c.process is not None]
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)  # its own session: the container's processes
        deadline = time.monotonic() + grace
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(entry.home.parent, ignore_errors=True)

    def status(self, pod: dict) -> dict | None:
        with self._lock:
            entry = self.pods.get(pod["metadata"]["uid"])
        if entry is None:
            return None
        statuses = []
        for c in entry.containers.values():
            if c.ended is None and c.process is not None and c.process.poll() is not None:
                code = c.process.returncode
                code = 128 - code if code < 0 else code  # killed by a signal: as a runtime reports it
                c.ended = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                           "startedAt": c.started, "finishedAt": _now()}
            state = {"terminated": c.ended} if c.ended else {"running": {"startedAt": c.started}}
            if c.ended is None and not c.ready:
                c.ready = all(listening(entry.ip, port) for port in c.ports)
            statuses.append({"name": c.name, "ready": c.ended is None and c.ready, "started": c.ended is None,
                             "restartCount": 0, "state": state})
        ended = [s["state"]["terminated"] for s in statuses if "terminated" in s["state"]]
        phase = "Running"
        if len(ended) == len(statuses):
            phase = "Succeeded" if all(e["exitCode"] == 0 for e in ended) else "Failed"
        return {"phase": phase, "containerStatuses": statuses}

    def exec_context(self, namespace: str, name: str, container: str) -> tuple[Pod, Container] | None:
        """The running container ``container`` of pod ``namespace/name``, for an exec in it (None: none runs here)."""
        with self._lock:
            for entry in self.pods.values():
                if (entry.namespace, entry.name) == (namespace, name):
                    c = entry.containers.get(container) or (
                        next(iter(entry.containers.values())) if not container else None)
                    if c is not None and c.ended is None:
                        return entry, c
        return None

    def exec_argv(self, entry: Pod, c: Container, argv: list[str]) -> list[str] | None:
        """How to run ``argv`` in container ``c`` of pod ``entry``: in its mount namespace, as its user, in its
        environment (``c.env``); None where the program is not found in the container's ``PATH``."""
        program = resolve(argv[0], c.env)
        if program is None:
            return None
        plan = entry.home.parent / f"{c.name}-exec.json"
        if not plan.exists():
            plan.write_text(json.dumps({"mounts": [], "upper": "", "user": list(entry.user), "cwd": str(entry.home)}))
        helper = [sys.executable, "-m", "gpuspawner.backends.kube.dev.container", str(plan), "--", program, *argv[1:]]
        if os.geteuid() == 0 and c.process is not None and shutil.which("nsenter"):
            return ["nsenter", "-t", str(c.process.pid), "-m", "--", *helper]
        return helper

    def close(self) -> None:
        """Stop every pod still running (the cluster is going away)."""
        for uid in list(self.pods):
            self.stop({"metadata": {"uid": uid}})
        if self._client is not None:
            self._client.close()
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    # how
    def _launch(self, entry: Pod, c: Container, workdir: str | None, mounts: list[list[str]]) -> None:
        c.started = _now()
        program = resolve(c.argv[0], c.env) if c.argv else None
        if program is None:
            c.ended = {"exitCode": 128, "reason": "StartError", "startedAt": c.started, "finishedAt": c.started,
                       "message": f"exec: {c.argv[0] if c.argv else ''!r}: executable file not found in $PATH"}
            return
        top = entry.home.parent
        plan = top / f"{c.name}.json"
        plan.write_text(json.dumps({"mounts": mounts, "upper": str(top / "overlay"), "user": list(entry.user),
                                    "cwd": workdir if workdir and os.path.isdir(workdir) else str(entry.home)}))
        log = open(top.parent / f"{entry.uid}-{c.name}.log", "ab")  # the child keeps it
        try:
            c.process = subprocess.Popen(devcontainer.command(plan, [program, *c.argv[1:]]), env=c.env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        except OSError as error:
            c.ended = {"exitCode": 128, "reason": "StartError", "startedAt": c.started, "finishedAt": _now(),
                       "message": str(error)}
        finally:
            log.close()

    def _user(self, spec: dict, container: dict) -> tuple[int, int, list[int]]:
        pod_sc, sc = spec.get("securityContext") or {}, container.get("securityContext") or {}
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        if not uid:  # none, or root: a server never runs as root here
            uid, default_gid = JOVYAN
            gid = gid if gid else default_gid
        extra = [g for g in [pod_sc.get("fsGroup"), *(pod_sc.get("supplementalGroups") or [])] if g is not None]
        return int(uid), int(uid if gid is None else gid), [int(g) for g in extra]

    def _allocate(self, node: str, count: int) -> list[int]:
        """The lowest ``count`` GPU indices of ``node`` no running pod of this runner holds."""
        if count <= 0:
            return []
        with self._lock:
            held = {i for p in self.pods.values() if p.node == node for i in p.gpus}
        free = [i for i in range(self.kubelet.gpu_count(node)) if i not in held]
        return free[:count]

    def _api(self) -> Client:
        if self._client is None:
            self._client = Client(self.kubelet.server, self.kubelet.pki, "fake-kubelet")
        return self._client

    def _object(self, kind: str, namespace: str, name: str) -> dict:
        try:
            return self._api().request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}") or {}
        except APIError:
            return {}

    def _data(self, kind: str, namespace: str, name: str, raw: bool = False) -> dict:
        """A ConfigMap's or Secret's data: text, or bytes where ``raw``."""
        obj = self._object(kind, namespace, name)
        if kind == "secrets":
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        else:
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return data if raw else {k: v.decode(errors="replace") for k, v in data.items()}

    def _volumes(self, pod: dict, folder: Path) -> dict[str, Path]:
        """The pod's configMap, secret and emptyDir volumes as folders (name -> folder); other kinds are left out."""
        made = {}
        namespace = pod["metadata"]["namespace"]
        for volume in pod["spec"].get("volumes") or []:
            for kind, key, ref in (("configmaps", "configMap", "name"), ("secrets", "secret", "secretName")):
                if key in volume:
                    data = self._data(kind, namespace, volume[key].get(ref, ""), raw=True)
                    items = volume[key].get("items") or [{"key": k, "path": k} for k in data]
                    target = folder / volume["name"]
                    target.mkdir(parents=True, exist_ok=True)
                    for item in items:
                        if item["key"] in data:
                            path = target / item["path"]
                            path.parent.mkdir(parents=True, exist_ok=True)
                            path.write_bytes(data[item["key"]])
                            path.chmod(0o644)
                    made[volume["name"]] = target
            if "emptyDir" in volume:
                target = folder / volume["name"]
                target.mkdir(parents=True, exist_ok=True)
                target.chmod(0o777)
                made[volume["name"]] = target
        if made:
            for path in [folder, *folder.rglob("*")]:
                if path.is_dir():
                    path.chmod(path.stat().st_mode | 0o755)
        return made

    def _environment(self, pod: dict, container: dict, ip: str, home: Path) -> dict[str, str]:
        meta, spec = pod["metadata"], pod["spec"]
        namespace = meta["namespace"]
        env = {"PATH": f"{self.venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(home), "HOSTNAME": meta["name"]}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
                if key in source:
                    env.update({prefix + k: v for k, v in self._data(kind, namespace, source[key]["name"]).items()})
        fields = {"metadata.name": meta["name"], "metadata.namespace": namespace, "metadata.uid": meta["uid"],
                  "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName":
                  spec.get("serviceAccountName", ""), "status.podIP": ip, "status.hostIP":
                  self.kubelet.node_address(spec.get("nodeName", ""))}
        for item in container.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                env[item["name"]] = expand(item.get("value", ""), env)
            elif "fieldRef" in source:
                env[item["name"]] = fields.get(source["fieldRef"]["fieldPath"], "")
            else:
                for kind, key in (("configmaps", "configMapKeyRef"), ("secrets", "secretKeyRef")):
                    if key in source:
                        value = self._data(kind, namespace, source[key]["name"]).get(source[key]["key"])
                        if value is not None:
                            env[item["name"]] = value
        env["LD_PRELOAD"] = f"{self.shim} {env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(self.shim)
        env["GPUSPAWNER_POD_IP"] = ip
        return env


def ports_of(container: dict) -> list[int]:
    """The ports a container is up once it listens on: its readiness probe's (tcpSocket, httpGet), else
    the TCP ports (``containerPort``) it declares (a named or no port: none)."""
    probe = container.get("readinessProbe") or {}
    for kind in ("tcpSocket", "httpGet"):
        port = (probe.get(kind) or {}).get("port")
        if isinstance(port, int):
            return [port]
    return [p["containerPort"] for p in container.get("ports") or [] if p.get("protocol", "TCP") == "TCP"]


def listening(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((ip, port)) == 0


def resolve(program: str, env: dict[str, str]) -> str | None:
    """``program`` as a runtime finds it: a path as it is, a name in the container's ``PATH``."""
    if "/" in program:
        return program if os.access(program, os.X_OK) else None
    return shutil.which(program, path=env.get("PATH", ""))
