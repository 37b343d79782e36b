"""Settings of the jupyterhub-idle-culler hook that a site gets wrong stop the culler, naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuspawner.hub.arbiter import GPUCullArbiter


@pytest.mark.parametrize(("setting", "value"), [
    ("threshold", 0), ("threshold", 101), ("threshold", "5"), ("threshold", True),
    ("warn_before", -1), ("warn_before", float("nan")), ("warn_before", None),
    ("kernel_activity", "on"), ("kernel_activity", 1),
])
def test_bad_settings_are_refused_naming_the_setting(setting, value):
    with pytest.raises(SystemExit, match=rf"GPUCullArbiter\({setting}="):
        GPUCullArbiter("http://127.0.0.1:8000", **{setting: value})


def test_the_proxy_url_defaults_to_the_public_url(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_PUBLIC_URL", "https://hub.example.org/")
    assert GPUCullArbiter().url == "https://hub.example.org"
    monkeypatch.delenv("JUPYTERHUB_PUBLIC_URL")
    assert GPUCullArbiter(threshold=100, warn_before=0).url == "http://127.0.0.1:8000"


def run_culler(tmp_path, hook: str, *args: str) -> subprocess.CompletedProcess:
    """The real jupyterhub-idle-culler with ``hook`` in its configuration file, its hub nowhere (port 1): it
    loads its configuration before it first calls the hub."""
    config = tmp_path / "idle_culler_config.py"
    config.write_text(f"from gpuspawner.hub.arbiter import GPUCullArbiter\nc.IdleCuller.cull_arbiter_hook = {hook}\n")
    return subprocess.run([sys.executable, "-m", "jupyterhub_idle_culler", "--url=http://127.0.0.1:1/hub/api",
                           *args, f"--config={config}"], env={**os.environ, "JUPYTERHUB_API_TOKEN": "unused"},
                          capture_output=True, text=True, timeout=120)


def test_the_real_idle_culler_stops_at_start_on_a_bad_setting_instead_of_culling_by_its_own_rule(tmp_path):
    done = run_culler(tmp_path, "GPUCullArbiter(threshold=500)")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().endswith("gpuspawner: GPUCullArbiter(threshold=500): must be a GPU utilisation "
                                        "in percent, above 0 and at most 100"), done.stderr


def test_the_real_idle_culler_stops_at_start_when_the_warning_would_not_come_before_its_timeout(tmp_path):
    done = run_culler(tmp_path, "GPUCullArbiter(warn_before=600)", "--timeout=300")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().endswith("gpuspawner: GPUCullArbiter(warn_before=600): must be less than the idle "
                                        "culler's --timeout (300)"), done.stderr
