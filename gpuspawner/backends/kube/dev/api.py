"""What the development cluster's parts share: its certificates, kubeconfigs and a small API client
(the standard library only, and ``cryptography`` for the certificates)."""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import ssl
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SERVICE_CIDR = "10.96.0.0/16"

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


#: client certificates: file stem -> (user, groups)
CLIENTS = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    "scheduler": ("system:kube-scheduler", ()),
    "controller-manager": ("system:kube-controller-manager", ()),
    # the fake kubelet manages every fake node and the pods on them: admin rights, not a node's
    "fake-kubelet": ("gpuspawner:fake-kubelet", ("system:masters",)),
    # the API server as a client of the kubelets (exec), as kubeadm makes it
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",)),
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
