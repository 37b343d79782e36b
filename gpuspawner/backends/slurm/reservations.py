"""Bookings as Slurm advance reservations (issue 30): what a booking holds on this cluster, and the
``scontrol`` commands that create, list and delete this hub's reservations.

**Pure part.** :func:`plan` turns a booking's windows (:class:`gpuspawner.bookings.Booking`: its
``id``, ``user`` or ``group``, ``model``, ``count`` and :func:`~gpuspawner.bookings.windows`) into one
:class:`Reservation` per window: ``ReservationName`` is the hub's prefix, the booking id and the
window's number (``jupyterhub-b-3f9a2c-0``), ``StartTime``/``Duration`` the window (whole minutes),
``Users=`` the booked user's account, or ``Groups=`` the booked group. What it holds depends on the
site's Slurm:

- Slurm before 23.11 (Debian's 22.05) reserves whole nodes only: ``Nodes=`` the nodes of the model
  whose GPUs add up to exactly the booked count ("whole node gpu-1 (4 GPUs)"); a count no set of
  whole nodes makes is refused with a sentence (HTTP 400) saying which counts can be booked;
- Slurm 23.11 and later reserve GPUs: ``TRES=gres/gpu:TYPE=N`` ("2 GPUs").

:func:`read_reservations` parses ``scontrol show reservation -o`` (one line per reservation, the
text form every Slurm version prints); :func:`active_for` says which of them a user's job may run
in now (the server's job gets ``--reservation=NAME`` during its window).

**I/O part.** :class:`SlurmReservations` runs the commands (``scontrol``, ``sinfo``) with a given
environment (``SLURM_CONF``): ``reserve(booking)``, ``unreserve(booking_id)`` and ``reservations()``
(this hub's, for reconciliation), the functions gpu-slurm's booking hook calls.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...bookings import Booking, windows
from .capacity import SlurmNode, read_nodes

__all__ = ["WORDS", "Reservation", "ReservationError", "SlurmReservations", "active_for", "create_args", "holds",
           "plan", "read_reservations", "slurm_version"]

#: Every sentence about what a booking holds on gpu-slurm, key -> template.
WORDS: dict[str, str] = {
    "holds_nodes": "whole node{s} {nodes} ({gpus} GPUs)",
    "holds_gpus": "{count} GPU{s}",
    "holds": "On this Slurm cluster a booking of {count} {model} GPU{s} holds {what}.",
    "whole_nodes": "This Slurm cluster (Slurm {version}) reserves whole nodes only, and no set of whole {model} "
                   "nodes has exactly {count} GPUs: book {counts} GPUs instead.",
    "no_nodes": "This Slurm cluster has no node with {model} GPUs to reserve.",
    "taken": "Every {model} node of this Slurm cluster is already reserved then ({names}): pick another time.",
    "refused": "Slurm refused the reservation for booking {booking}: {said}",
    "unreachable": "Slurm did not answer while reserving booking {booking}: {said}. Try again in a while.",
}

#: the first Slurm version that reserves GPUs (``TRES=gres/gpu...``), not only whole nodes
GRES_RESERVATIONS = (23, 11)


class ReservationError(ValueError):
    """A booking this cluster cannot hold as asked; ``str()`` is the sentence (an HTTP 400)."""


@dataclass(frozen=True)
class Reservation:
    """One advance reservation: as :func:`plan` makes it, or as ``scontrol show reservation`` lists it."""

    name: str
    start: float
    end: float
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()  # the node names (as listed: a hostlist expression stays one entry)
    tres: str = ""  # what it holds besides nodes, e.g. "gres/gpu:a100=2"
    state: str = ""  # ACTIVE / INACTIVE (listed only)

    def booking_id(self, prefix: str) -> str | None:
        """The booking a reservation of ``prefix`` belongs to (None: not this hub's)."""
        match = re.fullmatch(re.escape(prefix) + r"-(.+)-(\d+)", self.name)
        return match[1] if match else None


def slurm_version(text: str) -> tuple[int, int]:
    """``sinfo -V``'s version: ``"slurm-wlm 22.05.8"`` -> (22, 5)."""
    match = re.search(r"(\d+)\.(\d+)", text or "")
    if not match:
        raise ValueError(f"not a Slurm version: {text!r}")
    return int(match[1]), int(match[2])


def _windows(booking: Booking) -> list[tuple[float, float]]:
    return windows(booking, -math.inf, math.inf)  # every window of its calendar


def _whole_nodes(nodes: Sequence[tuple[str, int]], count: int) -> tuple[str, ...] | None:
    """Nodes whose GPUs add up to exactly ``count`` (fewest nodes, then first by name); None if none do."""
    best: dict[int, tuple[str, ...]] = {0: ()}
    for name, gpus in sorted(nodes, key=lambda n: (-n[1], n[0])):
        for total, chosen in sorted(best.items(), reverse=True):
            if total + gpus <= count and (total + gpus not in best or len(best[total + gpus]) > len(chosen) + 1):
                best[total + gpus] = (*chosen, name)
    return best.get(count) if count else None


def _model_nodes(nodes: Iterable[SlurmNode], gres_type: str) -> list[tuple[str, int]]:
    """(node, its GPUs of ``gres_type``: all its GPUs for "any") for each node that has some."""
    out = []
    for node in nodes:
        gpus = sum(node.gpus.values()) if gres_type == "any" else node.gpus.get(gres_type, 0)
        if gpus:
            out.append((node.name, gpus))
    return out


def _plural(n: int) -> str:
    return "" if n == 1 else "s"


def holds(booking: Booking, nodes: Iterable[SlurmNode], version: tuple[int, int], gres_type: str | None = None) -> str:
    """What ``booking`` holds on this cluster, in the form's words ("... holds whole node gpu-1 (4 GPUs)."),
    or :class:`ReservationError` with the sentence saying why it cannot be held."""
    kind = gres_type or booking.model
    if version >= GRES_RESERVATIONS:
        what = WORDS["holds_gpus"].format(count=booking.count, s=_plural(booking.count))
    else:
        chosen = _node_choice(booking, list(nodes), kind, version)
        what = WORDS["holds_nodes"].format(s=_plural(len(chosen)), nodes=", ".join(chosen), gpus=booking.count)
    return WORDS["holds"].format(count=booking.count, model=booking.model, s=_plural(booking.count), what=what)


def _node_choice(booking: Booking, nodes: list[SlurmNode], kind: str, version: tuple[int, int]) -> tuple[str, ...]:
    found = _model_nodes(nodes, kind)
    if not found:
        raise ReservationError(WORDS["no_nodes"].format(model=booking.model))
    chosen = _whole_nodes(found, booking.count)
    if chosen is None:
        sizes = sorted({total for total in range(1, sum(g for _, g in found) + 1) if _whole_nodes(found, total)})
        raise ReservationError(WORDS["whole_nodes"].format(
            version=f"{version[0]}.{version[1]:02d}", model=booking.model, count=booking.count,
            counts=", ".join(map(str, sizes[:-1])) + (" or " if len(sizes) > 1 else "") + str(sizes[-1])))
    return chosen


def plan(booking: Booking, prefix: str, nodes: Iterable[SlurmNode], version: tuple[int, int],
         account: str | None = None, gres_type: str | None = None) -> list[Reservation]:
    """One reservation per window of ``booking`` (every repeat), named ``PREFIX-ID-N``.

    ``account``: the booked user's Slurm account (default: the hub user's name); ``gres_type``: the
    booked model's GRES type (default: the model slug). :class:`ReservationError` when the cluster
    cannot hold it (see :func:`holds`)."""
    kind = gres_type or booking.model
    users = (account or booking.user,) if booking.user else ()
    groups = () if booking.user else (booking.group,)
    if version >= GRES_RESERVATIONS:
        node_names: tuple[str, ...] = ()
        tres = f"gres/gpu={booking.count}" if kind == "any" else f"gres/gpu:{kind}={booking.count}"
    else:
        node_names, tres = _node_choice(booking, list(nodes), kind, version), ""
    return [Reservation(f"{prefix}-{booking.id}-{n}", start, end, users, groups, node_names, tres)
            for n, (start, end) in enumerate(_windows(booking))]


def _slurm_clock(t: float) -> str:
    """An epoch time as scontrol takes it (slurmctld's local time, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def create_args(r: Reservation, now: float | None = None) -> list[str]:
    """``scontrol create reservation ...`` for ``r`` (Duration in whole minutes, at least one; a window
    that has begun by ``now`` starts ``now`` and keeps its end)."""
    begun = now is not None and r.start <= now
    start = "now" if begun else _slurm_clock(r.start)
    minutes = max(1, round((r.end - (now if begun else r.start)) / 60))
    args = ["scontrol", "create", "reservation", f"ReservationName={r.name}", f"StartTime={start}",
            f"Duration={minutes}"]
    args.append(f"Users={','.join(r.users)}" if r.users else f"Groups={','.join(r.groups)}")
    if r.nodes:
        args.append(f"Nodes={','.join(r.nodes)}")
    if r.tres:
        args.append(f"TRES={r.tres}")
    return args


_FIELD = re.compile(r"(\w+)=(\S*)")


def _epoch(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def _names(value: str) -> tuple[str, ...]:
    return () if value in ("", "(null)") else tuple(v for v in value.split(",") if v)


def read_reservations(text: str) -> tuple[Reservation, ...]:
    """The reservations of ``scontrol show reservation -o`` (one per line; "No reservations in the
    system" reads as none); ValueError for a line that is not one."""
    out = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.lower().startswith("no reservations"):
            continue
        fields = dict(_FIELD.findall(line))
        if "ReservationName" not in fields or "StartTime" not in fields:
            raise ValueError(f"not a reservation: {line[:120]!r}")
        tres = ",".join(t for t in _names(fields.get("TRES", "")) if t.startswith("gres/"))
        out.append(Reservation(fields["ReservationName"], _epoch(fields["StartTime"]), _epoch(fields["EndTime"]),
                               _names(fields.get("Users", "")), _names(fields.get("Groups", "")),
                               _names(fields.get("Nodes", "")), tres, fields.get("State", "")))
    return tuple(out)


def active_for(reservations: Iterable[Reservation], account: str, groups: Iterable[str], now: float) -> str | None:
    """The reservation a job of ``account`` (member of ``groups``) submitted at ``now`` runs in: the
    first one whose window holds ``now`` and that names the account or one of its groups."""
    member = set(groups)
    for r in sorted(reservations, key=lambda r: (r.start, r.name)):
        if r.start <= now < r.end and (account in r.users or member & set(r.groups)):
            return r.name
    return None


Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]


class SlurmReservations:
    """This hub's reservations on a Slurm cluster: ``reserve``, ``unreserve``, ``reservations``.

    ``prefix``: the hub's id (every reservation name starts with it); ``env``: the environment of
    the Slurm commands (``SLURM_CONF``); ``accounts``: hub user -> Slurm account; ``gres_types``:
    model slug -> GRES type (as ``slurm_gres_types``); ``run``: runs one command (tests may swap it)."""

    def __init__(self, prefix: str, env: Mapping[str, str] | None = None, accounts: Callable[[str], str] = str,
                 gres_types: Mapping[str, str] | None = None, run: Runner | None = None) -> None:
        self.prefix = prefix
        self.env = None if env is None else dict(env)
        self.accounts = accounts
        self.gres_types = dict(gres_types or {})
        self._run = run or self._subprocess

    def _subprocess(self, args: Sequence[str]) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=30)

    def _check(self, args: Sequence[str], booking: str = "") -> str:
        try:
            out = self._run(args)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(WORDS["unreachable"].format(booking=booking or "-", said=e)) from e
        if out.returncode != 0:
            said = (out.stderr or out.stdout or "").strip().splitlines()
            raise RuntimeError(WORDS["refused"].format(booking=booking or "-", said=said[-1] if said else "no reason"))
        return out.stdout

    def version(self) -> tuple[int, int]:
        return slurm_version(self._check(["sinfo", "-V"]))

    def nodes(self) -> tuple[SlurmNode, ...]:
        return read_nodes(self._check(["sinfo", "--json"]))

    def plan(self, booking: Booking) -> list[Reservation]:
        """:func:`plan` on the nodes no reservation (this hub's or another's) holds during the booking's windows
        (whole-node reservations; from Slurm 23.11 Slurm itself places the GPUs a reservation holds)."""
        version = self.version()
        account = self.accounts(booking.user) if booking.user else None
        if version >= GRES_RESERVATIONS:
            return plan(booking, self.prefix, (), version, account, self.gres_types.get(booking.model))
        windows = _windows(booking)
        overlapping = [r for r in read_reservations(self._check(["scontrol", "show", "reservation", "-o"]))
                       if any(r.start < end and start < r.end for start, end in windows)]
        taken = {name for r in overlapping for name in r.nodes}
        nodes = self.nodes()
        free = [n for n in nodes if n.name not in taken]
        kind = self.gres_types.get(booking.model) or booking.model
        if _model_nodes(nodes, kind) and not _model_nodes(free, kind):
            raise ReservationError(WORDS["taken"].format(model=booking.model,
                                                         names=", ".join(sorted(r.name for r in overlapping))))
        return plan(booking, self.prefix, free, version, account, self.gres_types.get(booking.model))

    def holds(self, booking: Booking) -> str:
        """What ``booking`` would hold here, in the form's words (:class:`ReservationError`: cannot)."""
        return holds(booking, self.nodes(), self.version(), self.gres_types.get(booking.model))

    def reserve(self, booking: Booking) -> list[Reservation]:
        """Create a reservation for each window of ``booking`` not yet over; all or none (a refused one
        removes those made before it). :class:`ReservationError` (a 400 sentence) when the cluster
        cannot hold it, RuntimeError with Slurm's words when Slurm refuses."""
        now = time.time()
        made = []
        try:
            for r in self.plan(booking):
                if r.end > now:
                    self._check(create_args(r, now), booking.id)
                    made.append(r)
        except RuntimeError:
            for r in made:
                self._run(["scontrol", "delete", f"ReservationName={r.name}"])
            raise
        return made

    def reservations(self) -> tuple[Reservation, ...]:
        """This hub's reservations (names starting with the prefix) that have not ended, as Slurm lists them."""
        listed = read_reservations(self._check(["scontrol", "show", "reservation", "-o"]))
        now = time.time()
        return tuple(r for r in listed if r.booking_id(self.prefix) is not None and r.end > now)

    def unreserve(self, booking_id: str) -> int:
        """Delete every reservation of ``booking_id``; how many. One a job runs in ("Requested reservation
        is in use": Slurm deletes none such) is ended now instead: the job runs on, nobody else waits for it."""
        gone = 0
        for r in self.reservations():
            if r.booking_id(self.prefix) != booking_id:
                continue
            try:
                self._check(["scontrol", "delete", f"ReservationName={r.name}"], booking_id)
            except RuntimeError as e:
                if "in use" not in str(e):
                    raise
                self._check(["scontrol", "update", f"ReservationName={r.name}", "EndTime=now"], booking_id)
            gone += 1
        return gone
