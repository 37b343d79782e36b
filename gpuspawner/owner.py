"""Who holds GPUs: :class:`Owner`, a user's server or a user's notebook job, and its one string form.

The ledger, the usage records, the start marks on containers, processes, pods and Slurm jobs,
and the hub's API all name an owner by one string, kept byte for byte as running hubs stored it:

* ``"user/server"`` for a server (``"user/"`` for the default server, whose name is empty);
* ``"user/job/<id>"`` for a notebook job.

JupyterHub's server names never hold a slash, so the two never collide: ``"ann/job"`` is Ann's
server called ``job``; ``"ann/job/7f3e"`` is her job ``7f3e``. :meth:`Owner.parse` is the one
reader of these strings and ``str(owner)`` the one writer. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JOB_PART", "Owner", "OwnerError", "user_of"]

SEP = "/"
#: what follows the user's name in a job's owner string: ``"user/job/<id>"``
JOB_PART = "job/"


class OwnerError(ValueError):
    """A string that names no server and no job (``str(e)`` says which part is wrong)."""


@dataclass(frozen=True, order=True)
class Owner:
    """A user's server (``job is None``; ``server`` is ``""`` for the default one) or notebook job."""

    user: str
    server: str = ""
    job: str | None = None

    def __post_init__(self) -> None:
        for part, value in (("user name", self.user), ("server name", self.server), ("job id", self.job)):
            if value is not None and (not isinstance(value, str) or SEP in value):
                raise OwnerError(f"an owner's {part} must be a string without '/', got {value!r}")
        if not self.user:
            raise OwnerError("an owner needs a user name")
        if self.job is not None and (self.server or not self.job):
            raise OwnerError(f"a job's owner has a job id and no server name, got {self!r}")

    @classmethod
    def of_server(cls, user: str, server: str | None = "") -> Owner:
        """The owner of ``user``'s server ``server`` (``""`` or ``None``: the default server)."""
        return cls(user, server or "")

    @classmethod
    def of_job(cls, user: str, job_id: str) -> Owner:
        """The owner of ``user``'s notebook job ``job_id``."""
        return cls(user, "", str(job_id))

    @classmethod
    def parse(cls, text: str) -> Owner:
        """The owner a ledger string names; :class:`OwnerError` for anything else."""
        if not isinstance(text, str):
            raise OwnerError(f"an owner is a string 'user/server' or 'user/job/ID', got {text!r}")
        user, sep, rest = text.partition(SEP)
        if not sep:
            raise OwnerError(f"an owner is 'user/server' or 'user/job/ID', got {text!r}: no '/'")
        if rest.startswith(JOB_PART):
            job = rest[len(JOB_PART):]
            if not job or SEP in job:
                raise OwnerError(f"an owner 'user/job/ID' has one job id without '/', got {text!r}")
            return cls(user, "", job)
        if SEP in rest:
            raise OwnerError(f"an owner is 'user/server' or 'user/job/ID', got {text!r}: a server name holds no '/'")
        return cls(user, rest)

    @classmethod
    def from_parts(cls, user: str, label: str) -> Owner:
        """The owner of ``user`` and :attr:`label` (a server name or ``job/<id>``), as marks keep them apart."""
        return cls.parse(f"{user}{SEP}{label}")

    def leftover(self, start: str) -> Owner:
        """The owner of a start of this owner's that the hub did not record and is stopping.

        Its GPUs stay held, and count against the same user, until its processes are gone; the
        label ``<server or job id>~stopping-<start>`` keeps it apart from the owner's live start.
        """
        mark = f"~stopping-{start}"
        if self.is_job:
            return Owner(self.user, "", f"{self.job}{mark}")
        return Owner(self.user, f"{self.server}{mark}")

    @property
    def is_job(self) -> bool:
        return self.job is not None

    @property
    def kind(self) -> str:
        """``"job"`` or ``"server"``."""
        return "job" if self.is_job else "server"

    @property
    def label(self) -> str:
        """What follows ``user/``: the server name, or ``job/<id>``."""
        return f"{JOB_PART}{self.job}" if self.is_job else self.server

    def __str__(self) -> str:
        return f"{self.user}{SEP}{self.label}"


def user_of(owner: str) -> str:
    """The user's name in an owner string (checked: :meth:`Owner.parse`)."""
    return Owner.parse(owner).user
