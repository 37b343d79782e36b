"""Where the development cluster's built binaries are kept: one rule for the control plane and Kueue."""

from __future__ import annotations

from gpuspawner.backends.kube.dev import build, kueue


def test_the_control_plane_and_kueue_are_cached_by_one_rule(monkeypatch, tmp_path):
    for name in ("GPUSPAWNER_KUBE_CACHE", "GPUSPAWNER_KUEUE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert build.bin_dir("v1.34.4") == tmp_path / "gpuspawner" / "kube" / "v1.34.4" / "bin"
    assert kueue.binary("v0.15.2") == tmp_path / "gpuspawner" / "kueue" / "v0.15.2" / "bin" / "kueue"
    assert not build.built("v1.34.4") and not kueue.built("v0.15.2")  # an empty cache holds nothing

    monkeypatch.setenv("GPUSPAWNER_KUEUE_CACHE", str(tmp_path / "mine"))  # each tool's own setting
    assert kueue.version_dir("v0.15.2") == tmp_path / "mine" / "v0.15.2"
    assert build.bin_dir("v1.34.4") == tmp_path / "gpuspawner" / "kube" / "v1.34.4" / "bin"
    monkeypatch.setenv("GPUSPAWNER_KUBE_CACHE", str(tmp_path / "planes"))
    assert build.bin_dir("v1.34.4") == tmp_path / "planes" / "v1.34.4" / "bin"
