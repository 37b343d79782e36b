"""gpuspawner's own tables in the hub's database: the one declarative base they all use.

JupyterHub's ORM has its base; gpuspawner's tables (usage accounting in
:mod:`gpuspawner.usage`, notebook GPU jobs in :mod:`gpuspawner.jobs.store`) are
declared on this one, on the same engine, and created by their modules at hub
start (``checkfirst``), so they never touch JupyterHub's own schema.
"""

from sqlalchemy.orm import DeclarativeBase


class Base(DeclarativeBase):
    """gpuspawner's tables (their metadata, separate from JupyterHub's)."""
