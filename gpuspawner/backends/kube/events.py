"""Kubernetes scheduling and kubelet events in plain words. Pure.

The scheduler explains a pending pod as, for example,
``0/8 nodes are available: 8 Insufficient nvidia.com/gpu. preemption: ...``.
:func:`explain_event` turns that, given what the user asked for, into
``Waiting for a free NVIDIA-A100-SXM4-80GB: ...``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ...compat import CudaVersion, cuda_version_text


@dataclass(frozen=True)
class EventContext:
    """What the user asked for, in the words the form used."""

    name: str  # "NVIDIA-A100-SXM4-80GB", "MIG 1g.10gb slice of ...", "GPU"
    count: int
    resource: str = "nvidia.com/gpu"
    cuda: CudaVersion | None = None


_AVAILABLE = re.compile(r"0/(\d+) nodes are available: (.*)", re.DOTALL)
_REASON = re.compile(r"(\d+) (.+)")


def _reasons(text: str) -> list[tuple[int, str]]:
    """``"2 Insufficient nvidia.com/gpu, 6 node(s) didn't match ..."`` -> [(2, ...), (6, ...)]."""
    text = text.split(" preemption:", 1)[0].strip().rstrip(".")
    found = []
    for part in re.split(r",\s+(?=\d+ )", text):
        match = _REASON.fullmatch(part.strip())
        if match:
            found.append((int(match.group(1)), match.group(2).strip()))
    return found


def _what(ctx: EventContext) -> str:
    if ctx.count == 1:
        return f"a free {ctx.name}"
    return f"{ctx.count} free {ctx.name} GPUs on one node"


def explain_scheduling(message: str, ctx: EventContext) -> str | None:
    """A FailedScheduling message in plain words, or None when it is not one."""
    match = _AVAILABLE.match(message.strip())
    if not match:
        return None
    nodes = int(match.group(1))
    parts = []
    busy = 0
    for n, reason in _reasons(match.group(2)):
        if reason.startswith("Insufficient nvidia.com/"):
            busy += n
            parts.append(f"{n} {'has' if n == 1 else 'have'} too few free right now")
        elif reason.startswith("Insufficient "):
            resource = reason.removeprefix("Insufficient ")
            parts.append(f"{n} lack{'s' if n == 1 else ''} free {resource}")
        elif "affinity/selector" in reason or "didn't match node selector" in reason or "node affinity" in reason:
            # current releases: "didn't match Pod's node affinity/selector"; v1.20 and older said the two apart
            why = "another GPU model"
            if ctx.cuda:
                why += f" or a driver older than CUDA {cuda_version_text(ctx.cuda)}"
            parts.append(f"{n} {'has' if n == 1 else 'have'} {why}")
        elif "untolerated taint" in reason or "the pod didn't tolerate" in reason:  # older: "had taint {..}, that .."
            parts.append(f"{n} {'is' if n == 1 else 'are'} reserved for other work")
        elif "unschedulable" in reason:
            parts.append(f"{n} {'is' if n == 1 else 'are'} cordoned")
        else:
            parts.append(f"{n}: {reason}")
    if busy or not parts:
        lead = f"Waiting for {_what(ctx)}"
    else:
        lead = f"No node can take {_what(ctx).replace('a free ', 'a ')} yet"
    detail = f": of {nodes} node{'s' if nodes != 1 else ''}, " + "; ".join(parts) if parts else ""
    tail = ". Your server starts as soon as one is free." if busy else "."
    return f"{lead}{detail}{tail}"


#: how Kueue's "Started" event on a pod begins (jobframework: "Admitted by clusterQueue <name>")
KUEUE_ADMITTED = "Admitted by clusterQueue"


def explain_event(event: Mapping, ctx: EventContext) -> str | None:
    """A Kubernetes event about the user's pod in plain words, or None to keep the original."""
    reason = event.get("reason") or ""
    message = event.get("message") or ""
    if reason == "FailedScheduling" or message.startswith("0/"):
        return explain_scheduling(message, ctx)
    if reason == "Scheduled":
        match = re.search(r"assigned \S+ to (\S+)", message)
        node = match.group(1) if match else "a node"
        if ctx.count:
            return f"Placed on {node}; the NVIDIA device plugin gives your server {ctx.count} x {ctx.name}."
        return f"Placed on {node} (no GPU)."
    if reason == "Pulling":
        match = re.search(r'image "([^"]+)"', message)
        image = match.group(1) if match else "the image"
        return f"Downloading {image} (the first time on a node can take minutes)."
    if reason == "Pulled":
        return "Image ready."
    # Kueue's pod integration records these on the pod (its "Started" is an admission, not the kubelet's)
    if reason == "CreatedWorkload":
        return "Kueue took your server into its queue."
    if reason == "Started" and message.startswith(KUEUE_ADMITTED):
        queue = message.removeprefix(KUEUE_ADMITTED).strip()
        return f"Kueue admitted your server (ClusterQueue {queue}); the scheduler places it next."
    if reason == "Started":  # the kubelet's own words kept: "Started container notebook" (older: "Container started")
        said = message.strip().rstrip(".") or "Started container"
        return f"Server process started ({said}); waiting for it to answer."
    if reason == "UnexpectedAdmissionError" and "nvidia.com/" in message:
        return f"The node could not hand out the GPU ({message.strip()}); try again."
    return None
