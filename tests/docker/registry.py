"""An image registry on loopback that stands in for Docker Hub (read-only, Registry API v2).

No registry can be reached from this machine, yet some tests need a Docker engine
to *pull*: DockerSpawner's own tests pull ``busybox:1.29.1`` and ``busybox`` and
expect a registry's "not found" for an image that does not exist. :class:`Registry`
serves images built here, on ``127.0.0.1``:

- as itself (``127.0.0.1:PORT/name:tag``; engines treat loopback registries as
  insecure, so plain HTTP works), and
- as Docker Hub, for one engine that is started with :meth:`Registry.engine_env`:
  ``HTTPS_PROXY`` points its pulls of ``registry-1.docker.io`` at this server,
  which answers the proxy's ``CONNECT`` itself with TLS (a certificate for that
  name from a CA made here, which ``SSL_CERT_FILE`` makes the engine trust). Other
  hosts get the same certificate, which the engine refuses: as unreachable as before.
  Nothing outside that engine's process changes.

Images are made from files (:func:`busybox_layer`: Debian's static busybox with
its applets), one gzip layer and a config each; an image the registry does not
hold is answered ``404 MANIFEST_UNKNOWN``, as Docker Hub answers.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import io
import json
import os
import re
import ssl
import subprocess
import tarfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_HUB = "registry-1.docker.io"
BUSYBOX = Path("/bin/busybox")


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def busybox_layer(busybox: Path = BUSYBOX) -> bytes:
    """An uncompressed layer tar: ``/bin/busybox`` (static) and a link per applet (``sh``, ``ls``, ...)."""
    if not busybox.exists():
        raise RuntimeError(f"{busybox} is missing: apt-get install busybox-static (scripts/setup does)")
    applets = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "tmp", "etc"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in applets:
            if applet == "bin/busybox" or applet.count("/") > 2:
                continue
            link = tarfile.TarInfo(applet)
            link.type, link.linkname = tarfile.SYMTYPE, "/bin/busybox"
            tar.addfile(link)
    return buf.getvalue()


@dataclass
class Image:
    manifest: bytes
    blobs: dict[str, bytes] = field(default_factory=dict)


def make_image(layer: bytes, labels: dict[str, str], cmd: tuple[str, ...] = ("sh",)) -> Image:
    """One image of one layer (an uncompressed tar), with ``labels`` (which make images differ)."""
    compressed = gzip.compress(layer, mtime=0)
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "created": "2018-01-01T00:00:00Z",
        "config": {"Cmd": list(cmd), "Labels": labels,
                   "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
        "history": [{"created": "2018-01-01T00:00:00Z", "created_by": "tests/docker/registry.py"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": MANIFEST_V2,
        "config": {"mediaType": CONFIG_V1, "size": len(config), "digest": digest(config)},
        "layers": [{"mediaType": LAYER_GZIP, "size": len(compressed), "digest": digest(compressed)}],
    }, sort_keys=True).encode()
    return Image(manifest, {digest(config): config, digest(compressed): compressed})


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for Docker Hub's registry name, made here: (ca, cert, key) files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuspawner test registry CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=7))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, DOCKER_HUB)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(DOCKER_HUB)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(paths[2], 0o600)
    return paths


_MANIFEST = re.compile(r"/v2/(?P<name>.+)/manifests/(?P<ref>[^/]+)")
_BLOB = re.compile(r"/v2/(?P<name>.+)/blobs/(?P<digest>sha256:[0-9a-f]{64})")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args):  # the base class's name
        what = f"{getattr(self, 'command', '?')} {getattr(self, 'path', '?')}"
        self.server.registry.log.append(f"{what}: {format % args}")

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"errors": [{"code": code, "message": message, "detail": None}]}).encode()
        self._send(status, body, {"Content-Type": "application/json"})

    def do_CONNECT(self):  # http.server's name
        """A proxy's CONNECT: answer it, then speak TLS as Docker Hub on this very connection."""
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        try:
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            self.close_connection = True
            return
        _Handler(tls, self.client_address, self.server)
        self.close_connection = True

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        images = self.server.registry.images
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            return self._send(200, b"{}", {"Content-Type": "application/json"})
        match = _MANIFEST.fullmatch(path)
        if match:
            name, ref = match["name"], match["ref"]
            image = images.get((name, ref))
            if image is None and ref.startswith("sha256:"):
                image = next((i for (n, _), i in images.items() if n == name and digest(i.manifest) == ref), None)
            if image is None:
                return self._error(404, "MANIFEST_UNKNOWN", f"manifest unknown: {name}:{ref}")
            return self._send(200, image.manifest, {"Content-Type": MANIFEST_V2,
                                                    "Docker-Content-Digest": digest(image.manifest)})
        match = _BLOB.fullmatch(path)
        if match:
            for (name, _), image in images.items():
                if name == match["name"] and match["digest"] in image.blobs:
                    return self._send(200, image.blobs[match["digest"]], {
                        "Content-Type": "application/octet-stream", "Docker-Content-Digest": match["digest"]})
            return self._error(404, "BLOB_UNKNOWN", "blob unknown to registry")
        return self._error(404, "NAME_UNKNOWN", "repository name not known to registry")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: Registry
    tls: ssl.SSLContext


class Registry:
    """The loopback registry; :meth:`add` images, :meth:`start`, :meth:`stop`.

    ``images`` keys are ``(repository, tag)`` as Docker Hub names them (``library/busybox``).
    """

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.images: dict[tuple[str, str], Image] = {}
        self.log: list[str] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.ca_path: Path | None = None

    def add(self, repository: str, tag: str, image: Image) -> None:
        self.images[(repository, tag)] = image

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``: the registry's own name in image references."""
        assert self._server is not None, "start() the registry first"
        return f"127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Registry:
        ca, cert, key = _certificates(self.dir)
        self.ca_path = ca
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        server = _Server(("127.0.0.1", 0), _Handler)
        server.registry, server.tls = self, tls
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="test-registry", daemon=True)
        self._thread.start()
        return self

    def engine_env(self) -> dict[str, str]:
        """dockerd's environment that sends its Docker Hub pulls here (and trusts this registry's CA)."""
        return {"HTTPS_PROXY": f"http://{self.address}", "https_proxy": f"http://{self.address}",
                "NO_PROXY": "", "no_proxy": "", "SSL_CERT_FILE": str(self.ca_path)}

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
