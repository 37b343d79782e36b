"""The fake kubelet of the development cluster (gpuspawner.backends.kube.dev.cluster): fake GPU nodes kept
Ready, the pods the real scheduler binds to them marked Running, and a :class:`PodRunner` hook for
what must really serve (gpuspawner.backends.kube.dev.pods runs pods as local processes)."""

from __future__ import annotations

import copy
import threading
import time
import urllib.parse
from pathlib import Path

from .api import Client, _now, _now_micro
from .exec import KUBELET_PORT, KubeletServer, free_octet

#: how often the fake kubelet renews its nodes' Leases (the kubelet: a quarter of the lease duration)
LEASE_RENEW_SECONDS = 3
LEASE_DURATION_SECONDS = 40
LABEL_FAKE = "gpuspawner.dev/fake-node"

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
    The base class runs nothing: every pod gets such an address.

    A runner that runs processes also answers :meth:`status` (the pod's phase and container states
    now, polled while the pod lives) and :meth:`exec_context` (where an ``exec`` into a container runs:
    gpuspawner.backends.kube.dev.exec); :class:`~gpuspawner.backends.kube.dev.pods.ProcessRunner` is one."""

    def start(self, pod: dict) -> str | None:
        return None

    def stop(self, pod: dict) -> None:
        return None

    def status(self, pod: dict) -> dict | None:
        """``{"phase": ..., "containerStatuses": [...]}`` of a pod this runner runs; None: on paper (Running)."""
        return None

    def exec_context(self, namespace: str, name: str, container: str):
        """What an exec into ``container`` of pod ``namespace/name`` runs as (None: nothing runs there)."""
        return None

    def close(self) -> None:
        return None


class FakeKubelet:
    """Keeps fake nodes Ready and runs (on paper) the pods bound to them, in a thread.

    Each node: created with its status (Ready, the pressure conditions False, an InternalIP), a
    Lease in ``kube-node-lease`` renewed every :data:`LEASE_RENEW_SECONDS` and the Ready condition's
    heartbeat refreshed, as a kubelet does, so the real node controller keeps it Ready. Each pod the
    scheduler binds to one of them: marked Running, Ready, with a pod IP (from the :class:`PodRunner`,
    else the node's pod range) and running containers. Each such pod being deleted (the API server
    set ``deletionTimestamp``): the runner stops it, and the deletion is finished (grace 0).

    Addresses are on loopback: node ``n`` is ``127.X.0.n`` and the pods the runner runs there get
    ``127.X.n.m`` (X: a second octet free on this machine, one per cluster); the node's kubelet API
    (exec: gpuspawner.backends.kube.dev.exec) listens on ``127.X.0.n:10250`` with a certificate of the cluster's
    CA and asks the API server for one of that CA (``--kubelet-client-certificate``).
    """

    def __init__(self, server: str, pki: Path, runner: PodRunner | None = None, poll: float = 0.2,
                 version: str = "", octet: int | None = None) -> None:
        self.server = server
        self.pki = pki
        self.runner = runner or PodRunner()
        self.poll = poll
        self.version = version
        self.octet = octet if octet is not None else free_octet()
        self.api_server = KubeletServer(self)
        self._reported: dict[str, dict] = {}  # uid -> the runner's status last patched
        self._nodes: dict[str, dict] = {}  # name -> {"index": n, "heartbeat": bool, "next_ip": n}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started: set[str] = set()  # uids of pods marked Running
        self._last_index = 0  # of the nodes added so far (their addresses 127.X.0.<index>)
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
        with self._lock:  # never an index (an address) a node had before: a removed node's may still be in use
            self._last_index = index = self._last_index + 1
            self._nodes[name] = {"index": index, "heartbeat": heartbeat, "next_ip": 2,
                                 "gpus": int(node.get("status", {}).get("capacity", {}).get("nvidia.com/gpu", 0))}
        status = node.setdefault("status", {})
        status["conditions"] = self._conditions()
        status["addresses"] = [{"type": "InternalIP", "address": self._node_ip(index)},
                               {"type": "Hostname", "address": name}]
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": KUBELET_PORT}}
        status["nodeInfo"] = {**status.get("nodeInfo", {}), "kubeletVersion": self.version,
                              "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
                              "containerRuntimeVersion": "fake://0", "osImage": "gpuspawner fake node",
                              "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": ""}
        status.setdefault("allocatable", dict(status.get("capacity", {})))
        node.setdefault("spec", {}).pop("providerID", None)
        self.api_server.serve(name, self._node_ip(index))
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

    def set_unhealthy(self, name: str, count: int, resource: str = "nvidia.com/gpu") -> dict:
        """Mark ``count`` of node ``name``'s ``resource`` devices unhealthy (0: all healthy again) the way
        NVIDIA's device plugin does: they leave the node's allocatable, its capacity keeps them. Returns
        the node as the API server then holds it."""
        client = Client(self.server, self.pki, "fake-kubelet")
        try:
            node = client.request("GET", f"/api/v1/nodes/{name}")
            capacity = int(node["status"]["capacity"][resource])
            if not 0 <= count <= capacity:
                raise ValueError(f"node {name} has {capacity} {resource}: cannot mark {count} unhealthy")
            allocatable = {**node["status"]["allocatable"], resource: str(capacity - count)}
            return client.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"allocatable": allocatable}},
                                  "application/merge-patch+json")
        finally:
            client.close()

    def remove_node(self, name: str) -> None:
        with self._lock:
            self._nodes.pop(name, None)
        self.api_server.unserve(name)
        client = Client(self.server, self.pki, "fake-kubelet")
        try:
            client.request("DELETE", f"/api/v1/nodes/{name}", ok=(404,))
        finally:
            client.close()

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._nodes)

    def _node_ip(self, index: int) -> str:
        return f"127.{self.octet}.0.{index}"

    def node_address(self, name: str) -> str:
        with self._lock:
            entry = self._nodes.get(name)
        return self._node_ip(entry["index"]) if entry else ""

    def pod_address(self, name: str) -> str:
        """A new loopback pod IP on node ``name``, for a pod that really runs (:class:`PodRunner`)."""
        with self._lock:
            entry = self._nodes[name]
            entry["next_loopback"] = entry.get("next_loopback", 1) % 254 + 1
            return f"127.{self.octet}.{entry['index']}.{entry['next_loopback']}"

    def gpu_count(self, name: str) -> int:
        """The node's ``nvidia.com/gpu`` capacity, as created."""
        with self._lock:
            entry = self._nodes.get(name)
        return entry.get("gpus", 0) if entry else 0

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
        self.api_server.start()
        self._thread = threading.Thread(target=self._run, name="gpuspawner-fake-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.runner.close()
        self.api_server.stop()

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
                self._reported.pop(uid, None)
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
                status = self._running(pod, ip, nodes[node]["index"])
                self._report(client, base, uid, pod, status)
                self._started.add(uid)
            elif uid in self._started:
                self._report(client, base, uid, pod, {})
        self._started &= live
        for uid in set(self._reported) - live:
            del self._reported[uid]

    def _report(self, client: Client, base: str, uid: str, pod: dict, status: dict) -> None:
        """PATCH ``status`` with the runner's own word on the pod (its containers' states), when that changed."""
        own = self.runner.status(pod)
        if own is not None:
            if own == self._reported.get(uid) and not status:
                return
            self._reported[uid] = own
            images = {c["name"]: c.get("image", "") for c in pod["spec"]["containers"]}
            containers = [{"image": images.get(c["name"], ""), "imageID": images.get(c["name"], ""),
                           "containerID": f"fake://{uid}/{c['name']}", **c} for c in own["containerStatuses"]]
            ready = "True" if own["phase"] == "Running" and all(c["ready"] for c in containers) else "False"
            now = _now()
            conditions = [{"type": kind, "status": ready if kind in ("Ready", "ContainersReady") else "True",
                           "lastProbeTime": None, "lastTransitionTime": now}
                          for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                       "PodScheduled")]
            status = {**status, "phase": own["phase"], "containerStatuses": containers, "conditions": conditions}
        if status:
            client.request("PATCH", f"{base}/status", {"status": status}, "application/merge-patch+json", ok=(404,))

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
