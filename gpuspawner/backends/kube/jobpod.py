"""A notebook GPU job as a pod, and how its pod ended. Pure.

A job's pod is the pod KubeSpawner would make for the user's default server
(its image, volumes and mounts, the profile's ``kubespawner_override``, the
GPU limits, node selector and tolerations gpu-kube set, the hub's labels and
annotations) turned into a run-to-completion pod:

- its own name, ``restartPolicy: Never``, no container ports;
- the notebook container runs the job's executor (``python3 -m
  gpuspawner.jobs.execute ...``) instead of the single-user server, in the
  user's files, without the server's ``JUPYTERHUB_*`` variables (a job holds
  no server token) and with the hub's marks (``GPUSPAWNER_HUB``/``SERVER``/``SPAWN``);
- the annotation ``hub.jupyter.org/servername: job/<id>`` (and the label
  ``gpuspawner.org/job: <id>``), so the hub's quota path
  (:func:`~gpuspawner.backends.kube.holdings.server_holdings`) counts its GPUs under
  the job's ledger owner ``user/job/<id>`` and adopts them after a restart.

The executor's status file lies in the user's volume, which the hub cannot
read; the pod says how it ended: the notebook container's exit code (0
completed, 1 failed, 2 bad notebook, 143 stopped) and its termination message
(the executor writes the error to ``/dev/termination-log``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .holdings import SERVERNAME_ANNOTATION

JOB_LABEL = "gpuspawner.org/job"
SERVERNAME_LABEL = "hub.jupyter.org/servername"
CONTAINER = "notebook"  # KubeSpawner's name for the single-user container
TERMINATION_LOG = "/dev/termination-log"  # the container's default terminationMessagePath
#: a container that waits for one of these will never start by itself: the job has ended
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "RunContainerError")


def job_pod_name(server_pod: str, job_id: str) -> str:
    """``jupyter-alice`` -> ``jupyter-alice-job-3f2a9c0e1b7d``."""
    return f"{server_pod[:200]}-job-{job_id[:12]}"


def job_pod(
    server_pod: Mapping[str, Any], *, job_id: str, name: str, command: Sequence[str],
    env: Mapping[str, str], working_dir: str | None = None,
) -> dict:
    """The job's pod from the server's pod (JSON as the API takes it; ``server_pod`` is not changed)."""
    pod = copy.deepcopy(dict(server_pod))
    meta = pod.setdefault("metadata", {})
    meta["name"] = name
    meta.setdefault("labels", {}).update({SERVERNAME_LABEL: f"job-{job_id[:12]}", JOB_LABEL: job_id})
    meta.setdefault("annotations", {}).update({SERVERNAME_ANNOTATION: f"job/{job_id}", JOB_LABEL: job_id})
    spec = pod.setdefault("spec", {})
    spec["restartPolicy"] = "Never"
    containers = spec.get("containers") or []
    container = next((c for c in containers if c.get("name") == CONTAINER), containers[0] if containers else None)
    if container is None:
        raise ValueError("the server's pod has no container")
    container["command"] = list(command)
    container.pop("args", None)
    container.pop("ports", None)
    kept = [e for e in container.get("env") or []
            if not e["name"].startswith("JUPYTERHUB_") and e["name"] != "JPY_API_TOKEN" and e["name"] not in env]
    container["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]
    container["terminationMessagePath"] = TERMINATION_LOG
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    if working_dir:
        container["workingDir"] = working_dir
    return pod


@dataclass(frozen=True)
class PodEnd:
    """Whether a job's pod has ended, and how."""

    ended: bool
    exit_code: int | None = None
    error: str | None = None


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == CONTAINER), statuses[0] if statuses else {})


def pod_end(pod: Mapping[str, Any] | None) -> PodEnd:
    """How the job's pod stands: running (or still to start), or ended with an exit code and an error.

    The notebook container decides (a sidecar may run on); a pod that failed
    without it running (evicted, an image that cannot be pulled) ends with the
    reason Kubernetes gives.
    """
    if pod is None:
        return PodEnd(True, None, "the job's pod is gone")
    status = pod.get("status") or {}
    state = _container_status(pod).get("state") or {}
    terminated = state.get("terminated")
    if terminated:
        code = terminated.get("exitCode")
        message = (terminated.get("message") or "").strip()
        error = None
        if code != 0:
            reason = terminated.get("reason")
            error = message or (f"the job's container ended: {reason}" if reason and reason != "Error" else None)
        return PodEnd(True, code, error)
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in FATAL_WAITING:
        detail = (waiting.get("message") or "").strip()
        return PodEnd(True, None, f"the job's container could not start: {waiting['reason']}"
                                  + (f" ({detail})" if detail else ""))
    if status.get("phase") in ("Succeeded", "Failed"):
        code = 0 if status["phase"] == "Succeeded" else None
        why = " ".join(x for x in (status.get("reason"), status.get("message")) if x)
        return PodEnd(True, code, None if code == 0 else (why or "the job's pod failed"))
    return PodEnd(False)
