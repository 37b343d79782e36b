"""gpu-slurm's GPU health: nodes Slurm took out of service, with Slurm's reason and its time.

A node drained (``scontrol update nodename=N state=drain reason="XID 79"``, by an administrator or a
health check program such as NHC), down or failing (Slurm's own reason, e.g. "Not responding") runs no
new job: its GPUs leave what the form offers (:func:`.capacity.gpu_availability` counts them out of
service) and this module says so to the hub (:class:`~gpuspawner.health_cluster.NodeHealth`):
``/hub/gpus`` shows the node, Slurm's reason and since when (``reason_changed_at``), the metric counts its
GPUs out, and the users whose jobs of this hub run on it are told (a drained node lets them run on).
It comes back when an administrator resumes the node (``state=resume``). Power saving (a node powered
down until a job wants it) is not a health matter and is left out.
"""

from __future__ import annotations

import asyncio
import getpass
import re
from collections.abc import Iterable

from batchspawner import format_template

from ...health_cluster import NodeHealth
from ...owner import Owner, OwnerError
from .capacity import UNTYPED, GresTypes, SlurmNode, parse_gres
from .commands import SlurmReader
from .queue import ENDED, SlurmJob, parse_comment

#: states and flags that mean a node is unfit (not power saving, not a maintenance reservation)
UNFIT_STATES = {"down", "error", "fail"}
UNFIT_FLAGS = {"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "NOT_RESPONDING"}
#: why, where Slurm gives no reason
NO_REASON = "Slurm lists the node as {state} (no reason given)"


def unfit(node: SlurmNode) -> bool:
    """Whether Slurm took ``node`` out of service for its health (drained, down, failing)."""
    return node.state in UNFIT_STATES or bool(set(node.flags) & UNFIT_FLAGS)


def hosts(expression: str) -> set[str]:
    """The node names of a Slurm hostlist: ``"gpu[01-03,7],login"`` -> gpu01, gpu02, gpu03, gpu7, login."""
    names: set[str] = set()
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]*)\]|([^,\[\]]+)", expression or ""):
        if plain:
            names.add(plain.strip())
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                continue
            for n in range(int(first), int(last or first) + 1):
                names.add(f"{prefix}{n:0{len(first)}d}")
    return names


def job_owner(job: SlurmJob, hub_id: str) -> str | None:
    """The ledger owner of one of this hub's jobs (its comment, ``jupyterhub:ID user server``), or None."""
    tag = parse_comment(job.comment)
    if tag is None or tag[0] != hub_id:
        return None
    try:
        return str(Owner.from_parts(tag[1], tag[2]))
    except OwnerError:  # a comment this hub never writes
        return None


def node_health(nodes: Iterable[SlurmNode], jobs: Iterable[SlurmJob], types: GresTypes,
                hub_id: str) -> list[NodeHealth]:
    """Every node's GPUs per model, those of an unfit node out of service with Slurm's reason and time,
    and the owners of this hub's jobs running there on GPUs of that model (an untyped ``--gres=gpu:N``:
    any model of the node)."""
    on_node: dict[tuple[str, str], set[str]] = {}  # (node, GRES type) -> owners of jobs using such GPUs there
    for job in jobs:
        owner = job_owner(job, hub_id)
        if owner is None or job.state in ENDED or job.pending:
            continue
        asked = parse_gres(job.gpus.replace("gres:", ""))
        for name in hosts(job.nodes):
            for gres_type in asked:
                on_node.setdefault((name, gres_type), set()).add(owner)
    result = []
    for node in nodes:
        out = unfit(node)
        reason = (node.reason or NO_REASON.format(state=" ".join([node.state, *node.flags]).lower())) if out else ""
        for gres_type, count in sorted(node.gpus.items()):
            affected = on_node.get((node.name, gres_type), set()) | on_node.get((node.name, UNTYPED), set())
            result.append(NodeHealth(node.name, types.slug(gres_type), types.name(gres_type), count,
                                     count if out else 0, reason, node.reason_since if out else None,
                                     tuple(sorted(affected)) if out else ()))
    return result


class SlurmHealthReader:
    """Reads node health through ``sinfo --json`` and ``squeue --json``, behind ``exec_prefix`` filled in for
    ``slurm_query_user`` (else the hub's own account), as the hub's other Slurm commands run."""

    def __init__(self, reader: SlurmReader, types: GresTypes, hub_id: str) -> None:
        self.reader, self.types, self.hub_id = reader, types, hub_id

    @classmethod
    def of(cls, spawner) -> SlurmHealthReader:
        account = spawner.slurm_query_user or getpass.getuser()
        try:
            reader = SlurmReader(format_template(spawner.exec_prefix, username=account), ttl=spawner.gpu_inventory_ttl)
        except Exception as e:  # a site's template may want more than {username}
            reader = SlurmReader(problem=f"exec_prefix cannot be filled in for {account}: {e!r}")
        return cls(reader, GresTypes(dict(spawner.slurm_gres_types)), spawner.gpu_hub_id)

    async def read(self) -> list[NodeHealth]:
        """Every node's GPU health now; RuntimeError saying why when Slurm does not answer."""
        nodes = await self.reader.nodes()
        jobs = await self.reader.jobs()
        for reading in (nodes, jobs):
            if reading.unknown is not None:
                raise RuntimeError(reading.unknown)
        return await asyncio.to_thread(node_health, nodes.value, jobs.value, self.types, self.hub_id)  # off the loop
