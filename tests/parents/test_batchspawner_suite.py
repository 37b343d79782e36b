"""batchspawner 1.3.0's own tests, unmodified, with GPUSlurmSpawner in SlurmSpawner's place (issue 26).

Their folder (``../shared/parents/batchspawner-1.3.0/batchspawner/tests``) runs in a
pytest subprocess per mode (:func:`parentsuite.run_suite`): ``parent`` (SlurmSpawner
itself, the baseline), ``cpu`` (GPUSlurmSpawner with one CPU-only GPU profile) and
``default`` (GPUSlurmSpawner with gpuspawner's default profiles, whose default choice
is one GPU of any model). Their tests mock every batch command (their ``run_command``
checks each command line and the batch script, and answers), so no Slurm is needed:
gpu-slurm's own ``sinfo``/``squeue`` reads find no cluster there and say "unknown".
What their layout and JupyterHub >= 5 need is adapted by :mod:`batchparent` and the
import mode, never by editing their files: their tests import the spawners relatively
(``from .. import SlurmSpawner``) from a folder that holds only ``batchspawner/tests``,
and their conftest imports an ``event_loop`` fixture JupyterHub no longer has.
All 17 must pass in every mode; a failure that is only a test artefact would have to
be listed in docs/compatibility.md.
"""

from __future__ import annotations

import pytest

from parentsuite import MODES, finish_suite, parent_tests, start_suite, unexpected

SECTION = "batchspawner's SlurmSpawner (gpu-slurm)"
TITLE = "batchspawner 1.3.0"
TESTS = 17


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three modes, started at once (their suite spends most of its 20 s sleeping in batchspawner's polls)."""
    suite = parent_tests("batchspawner-1.3.0", "batchspawner/tests")
    started = {mode: start_suite(
        TITLE, suite, mode,
        targets=[("batchspawner", "SlurmSpawner")],
        gpu_class="gpuspawner.backends.slurm.spawner:GPUSlurmSpawner",
        extra_plugins=("batchparent",),
        # their tests are the installed batchspawner's subpackage (batchparent); found as such by importlib
        args=("--import-mode=importlib", "-o", "consider_namespace_packages=true"),
        workdir=tmp_path_factory.mktemp(f"batchspawner-{mode}"),
        timeout=300,
    ) for mode in MODES}
    yield started
    for running in started.values():  # a test that failed early leaves none running
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait()


@pytest.mark.parametrize("mode", MODES)
def test_batchspawner_suite(runs, mode):
    result = finish_suite(runs[mode])
    failures = unexpected(result, SECTION)
    assert failures == [], "\n".join(failures) + "\n\n" + result.output
    assert (len(result.passed), result.total) == (TESTS, TESTS), result.output
