"""The tests' and benchmarks' hub process (tests/integration/hub.py): stopped with its proxy, however it ends."""

from __future__ import annotations

import signal

from hub import BASE_HUB_CONFIG, Hub, pid_alive
from test_ops_overview import wait_for


def test_a_hub_that_died_leaves_no_proxy_running(tmp_path):
    """A hub killed (or crashed) cannot stop the configurable-http-proxy it started: closing the Hub stops it
    by pid (two proxies were once found running after benchmark runs)."""
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(BASE_HUB_CONFIG)
    hub = Hub(tmp_path / "hub", {}, config_file=config)
    hub.start()
    try:
        proxy = int((hub.dir / "proxy.pid").read_text())
        hub.proc.send_signal(signal.SIGKILL)
        hub.proc.wait()
        assert pid_alive(proxy), "the proxy outlives a killed hub"
    finally:
        hub.close()
    assert wait_for(lambda: not pid_alive(proxy), timeout=15, interval=0.1), "the proxy still runs"
