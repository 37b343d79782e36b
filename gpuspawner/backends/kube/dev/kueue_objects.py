"""What Kueue's manifests install on the development control plane (:mod:`gpuspawner.backends.kube.dev.kueue`),
as pure builders: the objects kustomize would make from the cached ``config/components`` folder, with
every webhook called by URL on loopback and the visibility API reached through an ExternalName Service
(the module :mod:`~gpuspawner.backends.kube.dev.kueue` says why), Kueue's Configuration, and the API
path of each object."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import yaml

NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
#: namespaces whose pods Kueue manages carry this label with the value "true"
MANAGED_LABEL = "gpuspawner.dev/kueue"
#: fixed in Kueue's visibility server (pkg/visibility/server.go): port and certificate folder
VISIBILITY_PORT = 8082


def _documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


#: Kueue's own objects' webhook paths contain this; the pod integration's end in "--v1-pod"
_KUEUE_OBJECTS = "-kueue-x-k8s-io-"


def _wanted_webhook(path: str) -> bool:
    return _KUEUE_OBJECTS in path or path.endswith("--v1-pod")


def _prefixed(name: str) -> str:
    return name if name.startswith("kueue-") else f"kueue-{name}"


def install_objects(config: Path, ca_pem: bytes, webhook_port: int) -> list[dict]:
    """The objects Kueue's manifests under ``config`` (``config/components`` of the module) make, as
    kustomize would name them (prefix ``kueue-``, namespace ``kueue-system``), with every webhook
    called by URL on 127.0.0.1:``webhook_port`` and the visibility API reached through an
    ExternalName Service (see the module's docstring). In the order they are to be applied."""
    url = f"https://127.0.0.1:{webhook_port}"
    bundle = base64.b64encode(ca_pem).decode()
    objects: list[dict] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
    ]
    # RBAC: the manager's ClusterRole, the token and access reviews its visibility server delegates
    # to the API server (metrics-auth-role), and the authentication ConfigMap's reader in kube-system
    rbac = config / "rbac"
    ours = set()
    for stem in ("role", "role_binding", "metrics_auth_role", "metrics_auth_role_binding",
                 "manager_secrets_role", "manager_secrets_role_binding"):
        for doc in _documents(rbac / f"{stem}.yaml"):
            if doc["kind"] in ("ClusterRole", "Role"):
                ours.add(doc["metadata"]["name"])
            objects.append(doc)
    objects += _documents(config / "visibility" / "role_binding.yaml")
    for doc in objects[2:]:
        meta = doc["metadata"]
        meta["name"] = _prefixed(meta["name"])
        if doc["kind"] in ("Role", "RoleBinding") and meta.get("namespace") in (None, "system"):
            meta["namespace"] = NAMESPACE
        if "roleRef" in doc and doc["roleRef"]["name"] in ours:
            doc["roleRef"]["name"] = _prefixed(doc["roleRef"]["name"])
        for subject in doc.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount" and subject.get("name") == "controller-manager":
                subject.update(name=SERVICE_ACCOUNT, namespace=NAMESPACE)

    # CRDs, with the conversion webhook where Kueue's kustomization patches one in
    patches = yaml.safe_load((config / "crd" / "kustomization.yaml").read_text()).get("patches") or []
    converted = {Path(p["path"]).stem.removeprefix("webhook_in_") for p in patches
                 if Path(p.get("path", "")).stem.startswith("webhook_in_")}
    for path in sorted((config / "crd" / "bases").glob("*.yaml")):
        for crd in _documents(path):
            if crd["spec"]["names"]["plural"] in converted:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": bundle},
                    "conversionReviewVersions": ["v1"]}}
            objects.append(crd)

    # the visibility API: an ExternalName Service the aggregator resolves to 127.0.0.1
    objects.append({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "kueue-visibility-server", "namespace": NAMESPACE},
                    "spec": {"type": "ExternalName", "externalName": "127.0.0.1",
                             "ports": [{"name": "https", "port": VISIBILITY_PORT, "protocol": "TCP"}]}})
    for path in sorted((config / "visibility").glob("apiservice_*.yaml")):
        for api in _documents(path):
            api["spec"]["service"] = {"name": "kueue-visibility-server", "namespace": NAMESPACE,
                                      "port": VISIBILITY_PORT}
            objects.append(api)
    return objects


def webhook_objects(config: Path, ca_pem: bytes, webhook_port: int) -> list[dict]:
    """Kueue's Mutating- and ValidatingWebhookConfigurations: only the pod webhooks (for namespaces
    labelled :data:`MANAGED_LABEL`) and those of Kueue's own objects, each called by URL."""
    url = f"https://127.0.0.1:{webhook_port}"
    bundle = base64.b64encode(ca_pem).decode()
    configurations = []
    for doc in _documents(config / "webhook" / "manifests.yaml"):
        kept = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if not _wanted_webhook(path):
                continue
            hook = copy.deepcopy(hook)
            hook["clientConfig"] = {"url": url + path, "caBundle": bundle}
            if path.endswith("--v1-pod"):
                hook["namespaceSelector"] = {"matchLabels": {MANAGED_LABEL: "true"}}
            kept.append(hook)
        doc["metadata"]["name"] = _prefixed(doc["metadata"]["name"])
        doc["webhooks"] = kept
        configurations.append(doc)
    return configurations


def configuration(webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    """Kueue's Configuration file: loopback ports, no leader election, certificates of its own
    (no internal cert manager), the pod integration for namespaces labelled :data:`MANAGED_LABEL`."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},  # off
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: "true"}},
        "integrations": {"frameworks": ["pod"]},
    }


_KINDS = {  # kind -> (API prefix, plural, namespaced)
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "MutatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations",
                                     False),
    "ValidatingWebhookConfiguration": ("/apis/admissionregistration.k8s.io/v1",
                                       "validatingwebhookconfigurations", False),
    "APIService": ("/apis/apiregistration.k8s.io/v1", "apiservices", False),
}


def object_path(obj: dict) -> str:
    prefix, plural, namespaced = _KINDS[obj["kind"]]
    meta = obj["metadata"]
    where = f"/namespaces/{meta['namespace']}" if namespaced else ""
    return f"{prefix}{where}/{plural}/{meta['name']}"
