"""A missing real part (dockerd, Chromium, Playwright) skips a test outside CI and fails it in CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from needs import missing, module

ROOT = Path(__file__).resolve().parents[2]


def test_outside_ci_a_missing_part_skips_saying_why(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="dockerd is not installed"):
        missing("dockerd is not installed")


@pytest.mark.parametrize("value", ["", "0", "false", "False"])
def test_ci_unset_or_false_still_skips(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception):
        missing("no chromium")


@pytest.mark.parametrize("value", ["true", "True", "1"])
def test_in_ci_a_missing_part_fails_saying_why(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="no chromium"):
        missing("no chromium")


def test_module_imports_what_is_installed_and_fails_in_ci_on_what_is_not(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert module("json", "needs json") is json
    with pytest.raises(pytest.fail.Exception, match="needs gpuspawner_no_such_module"):
        module("gpuspawner_no_such_module", "needs gpuspawner_no_such_module")


def run_docker_test_without_dockerd(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    """Collect and run one Docker test with nothing on PATH (so no dockerd), as a user of the suite would."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(tmp_path)  # empty: no dockerd, containerd, runc or mmdebstrap
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs",
         "tests/docker/test_notebook_images.py::test_tensorflow_image_follows_docker_stacks_and_declares_cuda"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def test_docker_test_without_dockerd_skips_outside_ci_and_fails_in_ci(tmp_path):
    outside = run_docker_test_without_dockerd(tmp_path, None)
    assert outside.returncode == 0, outside.stdout + outside.stderr
    assert "1 skipped" in outside.stdout and "no Docker engine can run here" in outside.stdout

    in_ci = run_docker_test_without_dockerd(tmp_path, "true")
    assert in_ci.returncode == 1, in_ci.stdout + in_ci.stderr
    assert "1 error" in in_ci.stdout and "skipped" not in in_ci.stdout
    assert "no Docker engine can run here" in in_ci.stdout and "CI is set" in in_ci.stdout
