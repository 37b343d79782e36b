"""A real Kubernetes control plane on loopback, with fake GPU nodes: for the tests and for people.

What runs (one folder per cluster; every process stopped by its pid):

- Debian's ``etcd`` (package etcd-server), plain HTTP on a free loopback port;
- ``kube-apiserver``, ``kube-scheduler`` and ``kube-controller-manager`` at :data:`KUBE_VERSION`,
  built from the Go module proxy by :func:`build` and cached outside the repository
  (``$GPUSPAWNER_KUBE_CACHE``, default ``~/.cache/gpuspawner/kube/<version>/bin``), with
  ``kubectl`` beside them. The API server serves TLS on 127.0.0.1 with certificates of a CA made
  per cluster, authenticates clients by certificate and authorizes with ``Node,RBAC``; the
  scheduler and the controller-manager use their own kubeconfigs (``system:kube-scheduler``,
  ``system:kube-controller-manager``), so the bootstrap RBAC the API server makes is what they get.
- :class:`FakeKubelet`: the only stand-in, for the kubelets of GPU nodes. It keeps its nodes Ready
  (Ready condition and a Lease in ``kube-node-lease`` renewed, as a kubelet does), marks the pods
  the real scheduler binds to them Running with a pod IP, and finishes their deletion
  (gpuspawner.backends.kube.dev.kubelet). A :class:`PodRunner` given to it starts what must really serve:
  gpuspawner.backends.kube.dev.pods runs pods as local processes on loopback pod IPs, and each node's
  kubelet API (gpuspawner.backends.kube.dev.exec) serves ``exec`` into them, so ``kubectl exec`` works.

``admin.kubeconfig`` in the folder is the cluster's admin (group ``system:masters``);
:meth:`KubeCluster.service_account` makes a ServiceAccount's token files and kubeconfig for a hub
that must not be admin.

Build once (``python -m gpuspawner.backends.kube.dev.cluster build``); ``scripts/kube-dev`` builds, starts a
cluster for a person and stops it on Ctrl-C; the tests' ``kube_cluster`` fixture
(tests/kube/conftest.py) starts one per test run.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ....ports import free_port

# the fake kubelet and the API client live in modules of their own; their names stay importable from here
from .api import (
    CLIENTS,
    SERVICE_CIDR,
    APIError,
    Client,
    _certificate,
    _new_key,
    _pem_cert,
    _pem_key,
    kubeconfig,
    make_pki,
)
from .build import (
    COMPONENTS,
    KUBE_VERSION,
    bin_dir,
    build,
    built,
    cache_root,
    consumer_go_mod,
    find_go,
    kube_version,
)
from .kubelet import LABEL_FAKE, LEASE_DURATION_SECONDS, LEASE_RENEW_SECONDS, FakeKubelet, PodRunner, gpu_node

__all__ = [
    "COMPONENTS", "DEV_NODES", "KUBE_VERSION", "LABEL_FAKE", "LEASE_DURATION_SECONDS", "LEASE_RENEW_SECONDS",
    "NODE_MONITOR_GRACE_SECONDS", "APIError", "Client", "FakeKubelet", "KubeCluster", "PodRunner", "build",
    "built", "cannot_start", "consumer_go_mod", "develop", "gpu_node", "kube_version", "kubeconfig", "make_pki",
    "start_watcher", "watch",
    # the certificate helpers gpuspawner.backends.kube.dev.kueue takes from here
    "_certificate", "_new_key", "_pem_cert", "_pem_key",
]

ETCD = "etcd"
#: how long the node controller waits for a heartbeat before it marks a node's Ready condition
#: Unknown (kube-controller-manager ``--node-monitor-grace-period``; the default is 50s)
NODE_MONITOR_GRACE_SECONDS = 20
NODE_MONITOR_PERIOD_SECONDS = 2


def cannot_start(version: str | None = None) -> str | None:
    """Why a control plane cannot be started here (None: it can; the binaries may still need a build)."""
    if shutil.which(ETCD) is None:
        return "Debian's etcd is not installed (scripts/setup installs etcd-server)"
    if not built(version) and find_go() is None:
        return (f"Kubernetes {version or kube_version()} is not built in {bin_dir(version)} and no Go toolchain "
                "was found to build it (install Go, or set GPUSPAWNER_GO)")
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return "the Python package cryptography is needed to make the cluster's certificates"
    return None


# --- the control plane ------------------------------------------------------------------------------


#: the processes, in start order (stopped in reverse)
PROCESSES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")


class KubeCluster:
    """etcd, kube-apiserver, kube-scheduler and kube-controller-manager under ``directory``, with a
    :class:`FakeKubelet` for fake GPU nodes (started by :meth:`start`).

    ``directory`` holds ``pki/`` (certificates), ``*.kubeconfig`` (``admin.kubeconfig`` for people
    and tests), ``etcd/`` (data), ``logs/``, ``pids/``. :meth:`stop` stops every process by the pid
    in its pid file, whichever process started them."""

    def __init__(self, directory: Path, version: str | None = None,
                 runner: Callable[[FakeKubelet], PodRunner] | None = None) -> None:
        self.dir = Path(directory)
        self.version = version or kube_version()
        self.bin = bin_dir(self.version)
        self.pki = self.dir / "pki"
        self.runner = runner
        self.kubelet: FakeKubelet | None = None
        self.timings: dict[str, float] = {}
        self._client: Client | None = None
        self._children: dict[str, subprocess.Popen] = {}  # the processes this object started
        meta = self.dir / "cluster.json"
        self.server = json.loads(meta.read_text())["server"] if meta.exists() else ""

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    # processes
    def _spawn(self, name: str, command: list[str]) -> int:
        (self.dir / "logs").mkdir(exist_ok=True)
        (self.dir / "pids").mkdir(exist_ok=True)
        with open(self.dir / "logs" / f"{name}.log", "ab") as log:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=self.dir, start_new_session=True)
        (self.dir / "pids" / f"{name}.pid").write_text(str(process.pid))
        self._children[name] = process
        return process.pid

    def pids(self) -> dict[str, int]:
        """name -> pid of each of this cluster's processes that is alive (the pid file's process is that
        program: a stale pid file names nobody)."""
        alive = {}
        for name in PROCESSES:
            try:
                pid = int((self.dir / "pids" / f"{name}.pid").read_text().strip())
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except (OSError, ValueError):
                continue
            if os.path.basename(command.decode(errors="replace")) == name:
                alive[name] = pid
        return alive

    def _check_alive(self, name: str) -> None:
        process = self._children.get(name)
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{name} exited with status {process.returncode}:\n{self.log(name)}")

    def log(self, name: str, chars: int = 4000) -> str:
        path = self.dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _wait(self, what: str, check: Callable[[], bool], name: str, timeout: float) -> None:
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            self._check_alive(name)
            try:
                if check():
                    self.timings[what] = round(time.monotonic() - started, 2)
                    return
            except (OSError, http.client.HTTPException, APIError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{what}: not ready within {timeout:.0f}s:\n{self.log(name)}")

    def start(self, timeout: float = 120, nodes: Iterable[dict] = ()) -> None:
        """Make certificates and kubeconfigs, start etcd, the API server, the scheduler and the
        controller-manager, wait until they serve, and start the fake kubelet with ``nodes``."""
        missing = [name for name in COMPONENTS if not os.access(self.bin / name, os.X_OK)]
        if missing:
            raise RuntimeError(f"Kubernetes {self.version} is not built ({', '.join(missing)} absent from "
                               f"{self.bin}): run `python -m gpuspawner.backends.kube.dev.cluster build`")
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)  # a fresh cluster each start
        make_pki(self.pki)
        p = self.pki
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        (self.dir / "cluster.json").write_text(json.dumps({"server": self.server, "version": self.version}))
        ca = (p / "ca.crt").read_bytes()
        for stem, (user, _) in CLIENTS.items():
            (self.dir / f"{stem}.kubeconfig").write_text(kubeconfig(
                self.server, ca, user, cert_pem=(p / f"{stem}.crt").read_bytes(),
                key_pem=(p / f"{stem}.key").read_bytes()))
        self.admin_kubeconfig.chmod(0o600)

        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", [shutil.which(ETCD) or ETCD, "--name", "gpuspawner", "--data-dir", str(self.dir / "etcd"),
                             "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                             "--initial-cluster", f"gpuspawner={peer_url}", "--initial-cluster-state", "new",
                             "--log-level", "warn"])
        self._wait("etcd", lambda: _http_ok(f"{etcd_url}/health"), "etcd", timeout)

        self._spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
            f"--cert-dir={self.dir / 'apiserver'}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",  # beside the default ones (ResourceQuota, ...)
            f"--service-account-key-file={p / 'sa.pub'}", f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # the `kubernetes` Service's endpoints may not be a loopback address; nothing in-cluster uses them
            "--endpoint-reconciler-type=none",
            # for aggregated API servers (Kueue's visibility API) later: the front proxy's client
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client", "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            # the fake nodes' kubelet API (exec): at their InternalIP, TLS both ways with the cluster's CA, and
            # WebSockets passed through (the kubelet speaks no SPDY, which the API server would translate them to)
            "--kubelet-preferred-address-types=InternalIP", f"--kubelet-certificate-authority={p / 'ca.crt'}",
            f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
            "--feature-gates=TranslateStreamCloseWebsocketRequests=false",
            "--allow-privileged=true", "--profiling=false", "--v=1",
        ])
        self._wait("kube-apiserver", lambda: self._ready("/readyz"), "kube-apiserver", timeout)

        scheduler_port, manager_port = free_port(), free_port()
        kc = str(self.dir / "scheduler.kubeconfig")
        self._spawn("kube-scheduler", [
            str(self.bin / "kube-scheduler"), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1", f"--secure-port={scheduler_port}",
            f"--cert-dir={self.dir / 'scheduler'}", "--leader-elect=false", "--profiling=false", "--v=1",
        ])
        kc = str(self.dir / "controller-manager.kubeconfig")
        self._spawn("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1", f"--secure-port={manager_port}",
            f"--cert-dir={self.dir / 'controller-manager'}", "--leader-elect=false", "--profiling=false",
            "--use-service-account-credentials=true", f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}", f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE_SECONDS}s",
            f"--node-monitor-period={NODE_MONITOR_PERIOD_SECONDS}s", "--v=1",
        ])
        self._wait("kube-scheduler", lambda: _http_ok(f"https://127.0.0.1:{scheduler_port}/healthz", insecure=True),
                   "kube-scheduler", timeout)
        self._wait("kube-controller-manager",
                   lambda: _http_ok(f"https://127.0.0.1:{manager_port}/healthz", insecure=True),
                   "kube-controller-manager", timeout)
        # the ServiceAccount controller has made `default` (pods are refused until it has)
        self._wait("serviceaccount default/default",
                   lambda: self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default") is not None,
                   "kube-controller-manager", timeout)
        self.timings["control plane ready"] = round(time.monotonic() - started, 2)
        self.kubelet = FakeKubelet(self.server, self.pki, version=self.version)
        if self.runner is not None:
            self.kubelet.runner = self.runner(self.kubelet)
        for node in nodes:
            self.kubelet.add_node(node)
        self.kubelet.start()

    def _ready(self, path: str) -> bool:
        return self.api("GET", path, ok=(500, 503)) is not None

    def api(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
            ok: Iterable[int] = ()) -> Any:
        """A request as the cluster's admin: JSON in, JSON out (``{"text": ...}`` for an answer that
        is not JSON; None for a status in ``ok``); errors raise :class:`APIError`."""
        if self._client is None:
            self._client = Client(self.server, self.pki, "admin")
        return self._client.request(method, path, body, content_type, ok=ok)

    def service_account(self, namespace: str, name: str, seconds: int = 86400) -> Path:
        """Files as Kubernetes mounts them into a pod for ServiceAccount ``namespace/name`` (``token``,
        ``ca.crt``, ``namespace``) plus a ``kubeconfig`` with that token, under
        ``<dir>/serviceaccounts/<namespace>/<name>/``; the account must exist. Its rights are its RBAC's."""
        token = self.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"], "expirationSeconds": seconds}},
        )["status"]["token"]
        folder = self.dir / "serviceaccounts" / namespace / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "token").write_text(token)
        (folder / "namespace").write_text(namespace)
        shutil.copy(self.pki / "ca.crt", folder / "ca.crt")
        (folder / "kubeconfig").write_text(kubeconfig(self.server, (self.pki / "ca.crt").read_bytes(),
                                                      f"system:serviceaccount:{namespace}:{name}", token=token,
                                                      namespace=namespace))
        return folder

    def stop(self) -> None:
        """Stop the fake kubelet, then each process by its pid in reverse start order (SIGTERM, then
        SIGKILL after 15s).
        Safe to call twice, and from another process that knows only the folder."""
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None
        if self._client is not None:
            self._client.close()
            self._client = None
        pids = self.pids()
        # one after the other, the API server before etcd, so none loses what it needs while it stops
        for name in reversed(PROCESSES):
            pid = pids.get(name)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            process = self._children.get(name)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if process is not None:
                    if process.poll() is not None:
                        break
                else:
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                time.sleep(0.05)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if process is not None:
                    process.wait(timeout=5)
        for name in PROCESSES:
            (self.dir / "pids" / f"{name}.pid").unlink(missing_ok=True)


def _http_ok(url: str, insecure: bool = False) -> bool:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "https":
        context = ssl._create_unverified_context() if insecure else ssl.create_default_context()
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(parsed.hostname, parsed.port,
                                                                        context=context, timeout=5)
    else:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=5)
    try:
        conn.request("GET", parsed.path)
        return conn.getresponse().status == 200
    finally:
        conn.close()


# --- for people: scripts/kube-dev ---------------------------------------------------------------------

#: the nodes ``scripts/kube-dev`` starts with: whole GPUs of two models, a MIG node, a time-sliced one
DEV_NODES = (
    lambda: gpu_node("gpu-a100-0", "NVIDIA-A100-SXM4-80GB", 4),
    lambda: gpu_node("gpu-h100-0", "NVIDIA-H100-80GB-HBM3", 8, cuda=(12, 8)),
    lambda: gpu_node("gpu-a100-mig-0", "NVIDIA-A100-SXM4-80GB", 0,
                     resources={"nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2}),
    lambda: gpu_node("gpu-t4-0", "Tesla-T4", 0, 15360, resources={"nvidia.com/gpu.shared": 16},
                     labels={"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}),
)


def watch(pid: int, directory: Path, period: float = 0.5) -> None:
    """Stop the cluster under ``directory`` once process ``pid`` is gone (however it ended)."""
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(period)
    KubeCluster(directory).stop()


def start_watcher(directory: Path) -> subprocess.Popen:
    """A process that stops the cluster under ``directory`` when this process ends (even by SIGKILL)."""
    log = open(Path(directory) / "watcher.log", "ab")  # the child keeps it
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuspawner.backends.kube.dev.cluster", "watch", str(os.getpid()), str(directory)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log.close()
    return process


def develop(directory: Path, addons: Iterable[Callable[[KubeCluster], Callable[[], None]]] = ()) -> int:
    """Build (once), start a cluster with :data:`DEV_NODES` under ``directory``, say how to use it, and
    stop it on Ctrl-C (or SIGTERM). Each of ``addons`` (Kueue: gpuspawner.backends.kube.dev.kueue) is called
    with the started cluster and returns what stops it, called before the cluster stops."""
    why = cannot_start()
    if why:
        print(why, file=sys.stderr)
        return 1
    started = time.monotonic()
    build()
    built_at = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    from .pods import ProcessRunner

    cluster = KubeCluster(directory, runner=ProcessRunner)  # pods of single-user and python images really run
    cluster.stop()  # one a previous run left here
    start_watcher(directory)
    stopping = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):  # (SIGINT too where a shell started this with it ignored)
        signal.signal(number, lambda *_: stopping.set())
    stops: list[Callable[[], None]] = []
    try:
        cluster.start(nodes=[make() for make in DEV_NODES])
        print(f"Kubernetes {cluster.version} is up at {cluster.server} (build/cache {built_at - started:.1f}s, "
              f"start {cluster.timings['control plane ready']:.1f}s), fake GPU nodes: "
              f"{', '.join(cluster.kubelet.node_names())}\n\n"
              f"  export KUBECONFIG={cluster.admin_kubeconfig}\n"
              f"  {cluster.bin / 'kubectl'} get nodes -L nvidia.com/gpu.product\n\n"
              f"logs: {directory / 'logs'}    Ctrl-C stops it.", flush=True)
        for addon in addons:
            stops.append(addon(cluster))
        while not stopping.wait(1):
            pass
    finally:
        print("kube: stopping", flush=True)
        for stop in reversed(stops):
            stop()
        cluster.stop()
    return 0


def main(argv: list[str]) -> int:
    usage = ("usage: python -m gpuspawner.backends.kube.dev.cluster build | dev [DIR] | stop DIR | watch PID DIR\n"
             f"  (version {kube_version()}, cache {cache_root()})")
    if argv[:1] == ["build"] and len(argv) == 1:
        started = time.monotonic()
        print(build())
        print(f"({time.monotonic() - started:.1f}s)")
        return 0
    if argv[:1] == ["dev"] and len(argv) <= 2:
        directory = Path(argv[1]) if len(argv) == 2 else Path(tempfile.gettempdir()) / "gpuspawner-kube-dev"
        return develop(directory.resolve())
    if argv[:1] == ["stop"] and len(argv) == 2:
        KubeCluster(Path(argv[1])).stop()
        return 0
    if argv[:1] == ["watch"] and len(argv) == 3:
        watch(int(argv[1]), Path(argv[2]))
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
