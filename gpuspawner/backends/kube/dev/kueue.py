"""Real Kueue on the development control plane (:mod:`gpuspawner.backends.kube.dev.cluster`): for tests and people.

- Kueue's controller manager (``cmd/kueue`` of the Go module ``sigs.k8s.io/kueue`` at
  :data:`KUEUE_VERSION`) is built from the Go module proxy by :func:`build` and cached beside the
  control plane, keyed by version (``$GPUSPAWNER_KUEUE_CACHE``, default
  ``~/.cache/gpuspawner/kueue/<version>/``: ``bin/kueue`` and the module's ``config/`` manifests),
  written whole (a temporary folder, then a rename).
- :class:`Kueue` installs what Kueue's own manifests install (its CRDs, its RBAC for the
  ServiceAccount ``kueue-system/kueue-controller-manager``, its webhook configurations, the
  visibility API's APIService), runs the controller on loopback as that ServiceAccount, and stops it
  by its pid. What differs from an in-cluster install, because nothing here runs in a pod:

  * **webhooks by URL**: every webhook (the pod webhook, Kueue's own objects' webhooks, the CRDs'
    conversion webhook) is called by ``clientConfig.url: https://127.0.0.1:PORT/...`` with a
    ``caBundle`` of a CA made here; Kueue serves them with a certificate of that CA for 127.0.0.1
    (its Configuration: ``internalCertManagement.enable: false``, ``webhook.host``/``port``/``certDir``).
    Only the pod webhooks and those of Kueue's own objects are installed (the other frameworks are
    not enabled, and their webhooks would refuse every Job or Deployment of the cluster), and the pod
    webhooks only see namespaces labelled :data:`MANAGED_LABEL` ``=true`` (the Configuration's
    ``managedJobsNamespaceSelector`` says the same), so a shared cluster's other tests never meet Kueue.
  * **the visibility API through the aggregator**: the APIService points at a Service
    ``kueue-system/kueue-visibility-server`` of type ``ExternalName`` ``127.0.0.1``: the API server's
    aggregator resolves an ExternalName Service to that host and the APIService's port (a ClusterIP
    would need a kube-proxy, and Endpoints may not hold a loopback address), and calls it with the
    front proxy's client certificate (kube_cluster's ``--requestheader-*``/``--proxy-client-*``).
  * **files at fixed paths, as in Kueue's pod**: Kueue 0.15 reads its visibility server's
    certificate from ``/visibility``, its metrics server's from ``/etc/kueue/metrics/certs`` (both
    with ``internalCertManagement`` off), and its visibility server authenticates callers through
    the in-cluster configuration (``KUBERNETES_SERVICE_HOST``/``_PORT`` and the ServiceAccount files
    in ``/var/run/secrets/kubernetes.io/serviceaccount``). The controller runs in a mount namespace
    of its own (``unshare --mount``, so root) where this cluster's folders are bind-mounted on those
    paths, as the ServiceAccount ``kueue-system/kueue-controller-manager``; the mount points are made
    for it and removed when it stops.
  * **port 8082 on every address**: the visibility server's port and address are fixed in Kueue's
    code (pkg/visibility/server.go), the one part not on loopback only; one Kueue per machine holds
    it at a time (a lock file in the temporary folder).

``python -m gpuspawner.backends.kube.dev.kueue build`` builds it; the tests' ``kueue`` fixture
(tests/kube/conftest.py) and ``scripts/kube-dev --kueue`` start one on a :class:`KubeCluster`.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ....ports import free_port
from .build import cache_root, find_go
from .cluster import APIError, KubeCluster, _certificate, _new_key, _pem_cert, _pem_key
from .kueue_objects import (
    MANAGED_LABEL,
    NAMESPACE,
    SERVICE_ACCOUNT,
    VISIBILITY_PORT,
    configuration,
    install_objects,
    object_path,
    webhook_objects,
)

#: the Kueue release built and run (``GPUSPAWNER_KUEUE_VERSION`` overrides): 0.15 is built with the
#: k8s.io modules of Kubernetes 1.34, the control plane's release
KUEUE_VERSION = "v0.15.2"
MODULE = "sigs.k8s.io/kueue"

#: the module's manifests kept in the cache (config/components/...)
MANIFESTS = ("crd", "rbac", "webhook", "visibility")
FIELD_MANAGER = "gpuspawner-devkueue"


def kueue_version() -> str:
    return os.environ.get("GPUSPAWNER_KUEUE_VERSION") or KUEUE_VERSION


def version_dir(version: str | None = None) -> Path:
    return cache_root("kueue") / (version or kueue_version())


def binary(version: str | None = None) -> Path:
    return version_dir(version) / "bin" / "kueue"


def manifests(version: str | None = None) -> Path:
    """The module's ``config/components`` folder, as cached."""
    return version_dir(version) / "config"


def built(version: str | None = None) -> bool:
    return os.access(binary(version), os.X_OK) and (manifests(version) / "crd" / "bases").is_dir()


def cannot_start(version: str | None = None) -> str | None:
    """Why Kueue cannot run here (None: it can; it may still need a build)."""
    if not built(version) and find_go() is None:
        return (f"Kueue {version or kueue_version()} is not built in {version_dir(version)} and no Go toolchain "
                "was found to build it (install Go, or set GPUSPAWNER_GO)")
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is needed to run Kueue in a mount namespace of its own"
    if os.geteuid() != 0:
        return ("Kueue's visibility server reads its certificate from /visibility (fixed in Kueue); it runs in a "
                "mount namespace of its own with this cluster's folder there, which needs root")
    return None


def build(version: str | None = None, log: Callable[[str], None] = print) -> Path:
    """Build ``cmd/kueue`` of ``version`` and keep the module's manifests, in the cache (nothing to do
    when they are there); returns the binary. One build at a time per version (a lock file); the
    binary and the manifests go into a temporary folder first and are renamed into place, so a
    killed build leaves nothing half-written."""
    version = version or kueue_version()
    top = version_dir(version)
    if built(version):
        return binary(version)
    go = find_go()
    if go is None:
        raise RuntimeError(cannot_start(version) or "no Go toolchain")
    top.mkdir(parents=True, exist_ok=True)
    with open(top / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built(version):  # another process built it while this one waited
            return binary(version)
        env = {**os.environ, "GOFLAGS": "-trimpath -buildvcs=false", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0",
               "GOWORK": "off"}
        started = time.monotonic()
        out = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{version}"], env=env, cwd=top,
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"go mod download {MODULE}@{version} failed:\n{out.stderr[-3000:]}")
        source = Path(json.loads(out.stdout)["Dir"])
        log(f"kueue: building {MODULE}/cmd/kueue {version} with {go} (a first build takes minutes)")
        with tempfile.TemporaryDirectory(prefix=".build-", dir=top) as tmp:
            command = [go, "install", "-ldflags", f"-s -w -X {MODULE}/pkg/version.GitVersion={version}",
                       f"{MODULE}/cmd/kueue@{version}"]
            with open(top / "build.log", "w") as build_log:
                result = subprocess.run(command, env={**env, "GOBIN": tmp}, cwd=top, stdout=build_log,
                                        stderr=subprocess.STDOUT)
            if result.returncode != 0:
                text = (top / "build.log").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"building Kueue {version} failed (log: {top / 'build.log'}):\n{text}")
            config = Path(tmp) / "config"
            for part in MANIFESTS:
                shutil.copytree(source / "config" / "components" / part, config / part)
            for path in config.rglob("*"):  # the module cache's files are read-only
                path.chmod(0o755 if path.is_dir() else 0o644)
            if not manifests(version).is_dir():
                os.replace(config, manifests(version))
            (top / "bin").mkdir(exist_ok=True)
            os.replace(Path(tmp) / "kueue", binary(version))
        log(f"kueue: built {version} in {time.monotonic() - started:.0f}s into {top}")
    return binary(version)


# --- running it --------------------------------------------------------------------------------------


def _http_status(port: int, path: str) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


class PortTaken(RuntimeError):
    """Port 8082, fixed for Kueue's visibility server, is held by another Kueue or another program."""


def _bind_every_address(port: int) -> None:
    """Bind ``port`` on every address as Kueue's listener does (IPv6 and IPv4 where there is IPv6), and let
    go; connections of a past listener (TIME_WAIT) do not count. OSError when a process listens there."""
    family, address = (socket.AF_INET6, "::") if socket.has_ipv6 else (socket.AF_INET, "")
    try:
        s = socket.socket(family)
    except OSError:  # no IPv6 here after all
        family, address = socket.AF_INET, ""
        s = socket.socket(family)
    with s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((address, port))


class Kueue:
    """Kueue's controller on ``cluster`` (a started :class:`KubeCluster`), its files under
    ``cluster.dir / "kueue"``: ``pki/`` (the webhooks' CA and serving certificate), ``config.yaml``,
    ``kueue.log``, ``kueue.pid``. :meth:`start` installs and starts it; :meth:`stop` stops the process
    by its pid and removes its webhooks and APIServices (the cluster works on without Kueue)."""

    def __init__(self, cluster: KubeCluster, version: str | None = None) -> None:
        self.cluster = cluster
        self.version = version or kueue_version()
        self.dir = cluster.dir / "kueue"
        self.process: subprocess.Popen | None = None
        self.webhook_port = 0
        self.health_port = 0
        self.timings: dict[str, float] = {}
        self._port_lock = None
        self._removable: list[dict] = []
        self._made: list[Path] = []

    @property
    def log_path(self) -> Path:
        return self.dir / "kueue.log"

    def log(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def _certificates(self) -> bytes:
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        pki.chmod(0o700)
        ca_key = _new_key()
        ca = _certificate("gpuspawner-kueue-webhook-ca", ca_key, ca=True)
        key = _new_key()
        cert = _certificate("kueue-webhook", key, ca, ca_key, server_names=["127.0.0.1", "localhost"])
        (pki / "ca.crt").write_bytes(_pem_cert(ca))
        (pki / "tls.crt").write_bytes(_pem_cert(cert))
        (pki / "tls.key").write_bytes(_pem_key(key))
        return _pem_cert(ca)

    def _apply(self, obj: dict) -> dict:
        path = object_path(obj)
        return self.cluster.api("PATCH", f"{path}?fieldManager={FIELD_MANAGER}&force=true", obj,
                                content_type="application/apply-patch+yaml")

    def _wait(self, what: str, check: Callable[[], Any], timeout: float) -> None:
        started = time.monotonic()
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"Kueue exited with status {self.process.returncode} while waiting for {what}:\n"
                                   f"{self.log()}")
            try:
                if check():
                    self.timings[what] = round(time.monotonic() - started, 2)
                    return
            except (OSError, APIError, http.client.HTTPException):
                pass
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{what}: not within {timeout:.0f}s (log {self.log_path}):\n{self.log()}")
            time.sleep(0.2)

    def _hold_visibility_port(self) -> None:
        """One Kueue per machine: its visibility server's port is fixed."""
        path = Path(tempfile.gettempdir()) / f"gpuspawner-kueue-{VISIBILITY_PORT}.lock"
        lock = open(path, "w")  # held until stop
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise PortTaken(f"another Kueue on this machine holds port {VISIBILITY_PORT} (lock {path}): Kueue's "
                               "visibility server always listens there") from None
        self._port_lock = lock
        try:
            _bind_every_address(VISIBILITY_PORT)
        except OSError as error:
            self._release_port()
            raise PortTaken(f"port {VISIBILITY_PORT}, where Kueue's visibility server always listens, is taken: "
                               f"{error}") from None

    def _release_port(self) -> None:
        if self._port_lock is not None:
            self._port_lock.close()
            self._port_lock = None

    def start(self, timeout: float = 120) -> None:
        """Install Kueue's objects, start the controller, install its webhooks, and wait until its
        webhooks answer and its visibility API is available through the API server."""
        exe = binary(self.version)
        if not built(self.version):
            raise RuntimeError(f"Kueue {self.version} is not built in {version_dir(self.version)}: run "
                               "`python -m gpuspawner.backends.kube.dev.kueue build`")
        started = time.monotonic()
        self._hold_visibility_port()
        try:
            self._start(exe, timeout)
        except BaseException:
            self.stop()
            raise
        self.timings["kueue ready"] = round(time.monotonic() - started, 2)

    def _start(self, exe: Path, timeout: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ca_pem = self._certificates()
        self.webhook_port, self.health_port = free_port(), free_port()
        config = manifests(self.version)
        objects = install_objects(config, ca_pem, self.webhook_port)
        for obj in objects:
            self._apply(obj)
        self._removable = [o for o in objects if o["kind"] == "APIService"]
        for crd in (o for o in objects if o["kind"] == "CustomResourceDefinition"):
            self._wait(f"CRD {crd['metadata']['name']} established", lambda crd=crd: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (self.cluster.api("GET", object_path(crd)).get("status") or {}).get("conditions") or []),
                timeout)
        account = self.cluster.service_account(NAMESPACE, SERVICE_ACCOUNT)
        (self.dir / "config.yaml").write_text(yaml.safe_dump(
            configuration(self.webhook_port, self.health_port, self.dir / "pki")))
        # Kueue reads files from fixed paths, as in its pod: certificates (its visibility server's in
        # /visibility, its metrics server's in /etc/kueue/metrics/certs: this cluster's pki) and, for the
        # visibility server's delegated authentication, the in-cluster ServiceAccount files. They are
        # mounted there in Kueue's own mount namespace, on mount points made for it and removed by stop().
        binds = []
        for source, fixed in ((self.dir / "pki", "/visibility"), (self.dir / "pki", "/etc/kueue/metrics/certs"),
                              (account, "/var/run/secrets/kubernetes.io/serviceaccount")):
            self._make_mount_point(Path(fixed))
            binds += [str(source), fixed]
        script = 'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; exec "$@"'
        # setpriv --pdeathsig: SIGTERM should the process that started it end first, however it ended (a
        # safety net beside stop(); unshare, sh and setpriv each exec the next, so the pid stays Kueue's)
        command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "kueue", *binds, "--",
                   "setpriv", "--pdeathsig", "TERM", "--", str(exe), f"--config={self.dir / 'config.yaml'}",
                   "--zap-log-level=info"]
        api = urllib.parse.urlsplit(self.cluster.server)
        env = {**os.environ, "KUBERNETES_SERVICE_HOST": api.hostname, "KUBERNETES_SERVICE_PORT": str(api.port)}
        env.pop("KUBECONFIG", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=self.dir, env=env, start_new_session=True)
        (self.dir / "kueue.pid").write_text(str(self.process.pid))
        self._wait("kueue healthy", lambda: _http_status(self.health_port, "/readyz") == 200, timeout)
        hooks = webhook_objects(config, ca_pem, self.webhook_port)
        for obj in hooks:
            self._apply(obj)
        self._removable += hooks
        for api in self._removable:
            if api["kind"] == "APIService":
                self._wait(f"APIService {api['metadata']['name']} available", lambda api=api: any(
                    c["type"] == "Available" and c["status"] == "True"
                    for c in (self.cluster.api("GET", object_path(api)).get("status") or {}).get("conditions") or []),
                    timeout)

    def _make_mount_point(self, path: Path) -> None:
        """``path`` and the folders above it that are missing, remembered to be removed by :meth:`stop`."""
        missing = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for folder in reversed(missing):
            folder.mkdir()
            self._made.append(folder)

    def stop(self) -> None:
        """Remove Kueue's webhook configurations and APIServices, stop the controller by its pid
        (SIGTERM, SIGKILL after 15s), and remove the mount points it made. Safe to call twice."""
        for obj in reversed(self._removable):
            with contextlib.suppress(APIError, OSError):
                self.cluster.api("DELETE", object_path(obj), ok=(404,))
        self._removable = []
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.process.pid, signal.SIGKILL)
                    self.process.wait(timeout=5)
            (self.dir / "kueue.pid").unlink(missing_ok=True)
            self.process = None
        for folder in reversed(self._made):  # empty: the mounts were Kueue's own
            with contextlib.suppress(OSError):
                folder.rmdir()
        self._made = []
        self._release_port()


def _start_for_people(cluster: KubeCluster) -> Callable[[], None]:
    """Start Kueue on ``cluster`` for ``scripts/kube-dev --kueue``, say how to use it; what stops it."""
    kueue = Kueue(cluster)
    kueue.start()
    print(f"\nKueue {kueue.version} is up ({kueue.timings['kueue ready']:.1f}s; log {kueue.log_path}): label a "
          f"namespace {MANAGED_LABEL}=true for its pod integration, then make a ResourceFlavor, a ClusterQueue "
          "with an nvidia.com/gpu quota and a LocalQueue (kueue.x-k8s.io/v1beta1) for "
          "c.GPUKubeSpawner.kueue_queue_name.\nIts visibility server listens on port 8082 of every address "
          "(fixed in Kueue).", flush=True)
    return kueue.stop


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        started = time.monotonic()
        print(build())
        print(f"({time.monotonic() - started:.1f}s)")
        return 0
    if argv[:1] == ["dev"] and len(argv) <= 2:
        from .cluster import develop

        why = cannot_start()
        if why:
            print(why, file=sys.stderr)
            return 1
        build()
        directory = Path(argv[1]) if len(argv) == 2 else Path(tempfile.gettempdir()) / "gpuspawner-kube-dev"
        return develop(directory.resolve(), addons=[_start_for_people])
    print(f"usage: python -m gpuspawner.backends.kube.dev.kueue build | dev [DIR]\n  (version {kueue_version()}, "
          f"cache {cache_root('kueue')})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["KUEUE_VERSION", "MANAGED_LABEL", "NAMESPACE", "SERVICE_ACCOUNT", "VISIBILITY_PORT", "Kueue", "PortTaken",
           "build", "built", "cannot_start", "configuration", "install_objects", "object_path", "webhook_objects"]
