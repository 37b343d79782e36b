"""Which database session a GPU spawner writes its state through (gpuspawner/backends/saved_state.py)."""

from __future__ import annotations

from unittest.mock import Mock

from jupyterhub import orm
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from gpuspawner.backends.local.spawner import GPUSimpleLocalProcessSpawner


class StandInRow(Mock):
    """KubeSpawner's own tests pass a Mock as ``orm_spawner``: it answers every attribute, a session's too."""

    name = "server"
    server = None


def test_a_stand_in_row_gives_no_session_and_a_real_row_gives_its_own():
    assert GPUSimpleLocalProcessSpawner(orm_spawner=StandInRow(), _mock=True).hub_session() is None

    engine = create_engine("sqlite://")
    orm.Base.metadata.create_all(engine)
    with Session(engine) as db:
        user = orm.User(name="ada")
        db.add(user)
        row = orm.Spawner(user=user, name="")
        db.add(row)
        db.commit()
        spawner = GPUSimpleLocalProcessSpawner(orm_spawner=row, _mock=True)
        assert spawner.hub_session() is db
        spawner.gpu_allocation = ()
        spawner.save_state()  # through the row's own session: the state is in the database
        assert db.query(orm.Spawner).one().state is not None
