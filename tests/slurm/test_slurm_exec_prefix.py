"""gpu-slurm's own Slurm commands go through batchspawner's exec_prefix, filled in for the right account.

No cluster here: the prefix is a script that logs the account it was given and the
command, and answers as Slurm does (``sinfo --json`` and ``squeue --json`` recorded
from slurmctld 22.05, tests/slurm/fixtures). The spawner is made as JupyterHub makes
it (``User._new_spawner``). ``test_slurm_batchspawner_site.py`` runs the same against
the test cluster, through a hub.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from jupyterhub import orm
from jupyterhub.objects import Hub, Server
from jupyterhub.user import User
from sqlalchemy.orm import object_session
from traitlets.config import Config

from gpuspawner.backends.slurm.spawner import GPUSlurmSpawner
from gpuspawner.bookings import Booking
from gpuspawner.reconcile import Workload

FIXTURES = Path(__file__).parent / "fixtures"

PREFIX = """#!/bin/sh
account="$1"; shift
printf '%s %s\\n' "$account" "$*" >> {log}
case "$1 $2" in
  "sinfo -V") echo "slurm-wlm 22.05.8" ;;
  sinfo*) cat {fixtures}/sinfo-mixed.json ;;
  squeue*) cat {fixtures}/squeue-one-pending.json ;;
  "scontrol show") echo "No reservations in the system" ;;
esac
"""


@pytest.fixture
def prefix(tmp_path) -> tuple[Path, Path]:
    """The prefix script (a stand-in for ``ssh {username}@login``) and its log."""
    script, log = tmp_path / "login", tmp_path / "calls.log"
    script.write_text(PREFIX.format(log=log, fixtures=FIXTURES))
    script.chmod(0o755)
    return script, log


def spawner_of(name: str, **traits) -> GPUSlurmSpawner:
    """``name``'s default server's spawner, as JupyterHub makes it."""
    db = orm.new_session_factory("sqlite:///:memory:")()
    row = orm.User(name=name)
    db.add(row)
    db.add(orm.Spawner(user=row, name=""))
    db.commit()
    user = User(row, {})
    return user._new_spawner("", spawner_class=GPUSlurmSpawner, hub=Hub(), user=user,
                             home_dir_template="/nonexistent/{username}", **traits)


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def test_sinfo_and_squeue_run_through_the_prefix_as_the_user_or_the_query_account(prefix):
    script, log = prefix
    ann = spawner_of("ann", exec_prefix=f"{script} {{username}}")
    nodes = await (await ann.slurm()).nodes()
    assert nodes.unknown is None and nodes.value, nodes
    jobs = await (await ann.slurm()).jobs()
    assert jobs.unknown is None and jobs.value, jobs
    assert calls(log) == ["ann sinfo --json", "ann squeue --json"]
    # reading before the start (the form) does not fix the variables the job exports: batchspawner's
    # req_keepvars is computed when first used, and the server's URL is known only at its start
    server = orm.Server(base_url="/user/ann/")  # as JupyterHub gives it at the start
    db = object_session(ann.orm_spawner)
    db.add(server)
    db.commit()
    ann.server = Server(orm_server=server)
    assert "JUPYTERHUB_SERVICE_PREFIX" in ann.get_req_subvars()["keepvars"].split(",")

    # where Slurm hides other users' jobs from users (PrivateData=jobs), an account that sees them all
    bob = spawner_of("bob", exec_prefix=f"{script} {{username}}", slurm_query_user="slurm-ops")
    assert (await (await bob.slurm()).nodes()).unknown is None
    assert calls(log)[-1] == "slurm-ops sinfo --json"


async def test_an_orphaned_job_is_cancelled_with_the_sites_cancel_command_as_its_owners_account(prefix):
    script, log = prefix
    ann = spawner_of("ann", exec_prefix=f"{script} {{username}}", batch_cancel_cmd="scancel --full {job_id}",
                     create_system_users=True, system_user_prefix="site-")
    await ann.end_orphan(Workload("4711", "bob/job/5e1f0c", (), "", "Slurm job 4711"))
    assert calls(log) == ["site-bob scancel --full 4711"]


async def test_a_bookings_reservation_is_made_through_the_prefix_as_the_reservation_account(prefix):
    script, log = prefix
    config = Config()
    config.GPUSlurmSpawner.update(exec_prefix=f"{script} {{username}}", slurm_reservation_user="slurm-ops",
                                  create_system_users=True, system_user_prefix="site-")
    config.GPUSpawnerMixin.gpu_hub_id = "hub7"
    keeper = GPUSlurmSpawner.booking_keeper(config)
    start = time.time() + 3600
    b = Booking(id="b-1a2b3c", user="ann", booked_by="ann", model="a100-sxm4-80gb", count=2, start=start,
                end=start + 3600)
    assert await keeper.reserve(b) == "whole node vm (2 GPUs)"
    made = calls(log)[-1].split()
    assert made[:5] == ["slurm-ops", "scontrol", "create", "reservation", "ReservationName=jupyterhub-hub7-b-1a2b3c-0"]
    assert made[-2:] == ["Users=site-ann", "Nodes=vm"]
    assert {line.split()[0] for line in calls(log)} == {"slurm-ops"}


async def test_a_prefix_that_cannot_be_filled_in_reads_as_unknown_with_the_reason():
    ann = spawner_of("ann", exec_prefix="ssh {login_node}")
    reading = await (await ann.slurm()).nodes()
    assert reading.value == () and reading.unknown.startswith("exec_prefix cannot be filled in for ann: KeyError"), \
        reading
