"""The job executor on its own: exit status, status file, and the Kubernetes termination message."""

from __future__ import annotations

import json
import subprocess
import sys

from jobnotebooks import write


def execute(tmp_path, notebook: str, termination_log) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuspawner.jobs.execute", "--notebook", notebook, "--output", "ipynb=out.ipynb",
         "--status", "status.json", "--termination-log", str(termination_log)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )


def test_a_failing_notebook_writes_its_error_to_the_termination_log(tmp_path):
    write(tmp_path / "fail.ipynb", "raise RuntimeError('no convergence')")
    log = tmp_path / "termination-log"
    log.touch()  # Kubernetes makes the file; the executor only writes where it exists
    result = execute(tmp_path, "fail.ipynb", log)
    assert result.returncode == 1, result.stdout + result.stderr
    assert log.read_text() == "RuntimeError: no convergence"
    assert json.loads((tmp_path / "status.json").read_text())["error"] == "RuntimeError: no convergence"


def test_no_termination_log_is_made_outside_kubernetes(tmp_path):
    write(tmp_path / "ok.ipynb", "print('fine')")
    result = execute(tmp_path, "ok.ipynb", tmp_path / "absent")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "absent").exists()
    assert json.loads((tmp_path / "status.json").read_text())["outcome"] == "completed"
