"""Settings of the jupyterhub-idle-culler hook that a site gets wrong are refused, naming the setting."""

from __future__ import annotations

import pytest

from gpuspawner.hub.arbiter import GPUCullArbiter


@pytest.mark.parametrize(("setting", "value"), [
    ("threshold", 0), ("threshold", 101), ("threshold", "5"), ("threshold", True),
    ("warn_before", -1), ("warn_before", float("nan")), ("warn_before", None),
])
def test_bad_settings_are_refused_naming_the_setting(setting, value):
    with pytest.raises(ValueError, match=rf"GPUCullArbiter\({setting}="):
        GPUCullArbiter("http://127.0.0.1:8000", **{setting: value})


def test_the_proxy_url_defaults_to_the_public_url(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_PUBLIC_URL", "https://hub.example.org/")
    assert GPUCullArbiter().url == "https://hub.example.org"
    monkeypatch.delenv("JUPYTERHUB_PUBLIC_URL")
    assert GPUCullArbiter(threshold=100, warn_before=0).url == "http://127.0.0.1:8000"
