"""The GPU idle culler lives and dies with its hub: real hubs, real signals, processes found by pid."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hub import pid_alive
from ops_hub import OpsHub
from test_ops_overview import wait_for

pytestmark = pytest.mark.integration

PROFILES = [{"slug": "gpu", "display_name": "GPU notebook", "gpu_models": ["any"], "gpu_counts": [1],
             "default_gpus": 1, "default": True}]
CULLER = {"period": 2, "idle_timeout": 600, "warn_before": 60}


def cullers(hub: OpsHub) -> list[int]:
    """Pids of every culler process of this hub (its own proxy URL is in the command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gpuspawner.hub.culler" in args and hub.url.encode() in args and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def ops_hub(tmp_path, fakenvml_libdir):
    hub = OpsHub(tmp_path, fakenvml_libdir, PROFILES, culler=CULLER)
    seen: set[int] = set()
    hub.seen_cullers = seen
    try:
        yield hub
    finally:
        hub.close()
        for pid in seen | set(cullers(hub)):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def the_culler(hub: OpsHub, starts: int = 1) -> int:
    """The one culler of the running hub, once the ``starts``-th culler of its log began its rounds."""
    assert wait_for(lambda: hub.log_path.read_text().count("GPU idle culler: every") >= starts, timeout=60), hub.log()
    found = wait_for(lambda: cullers(hub), timeout=30)
    assert len(found) == 1, (found, hub.log())
    hub.seen_cullers.update(found)
    return found[0]


def test_culler_exits_when_its_hub_is_killed_and_the_new_hub_has_exactly_one(ops_hub):
    hub = ops_hub
    hub.start()
    old = the_culler(hub)
    assert parent(old) == hub.proc.pid

    hub.stop(signal.SIGKILL)  # no cleanup at all: JupyterHub cannot stop its services
    assert wait_for(lambda: not pid_alive(old), timeout=15, interval=0.1), "the culler outlived its hub"
    assert f"stopped: the hub (pid {hub.proc.pid}) is gone" in hub.log_path.read_text()

    hub.start()  # same directory, same database
    new = the_culler(hub, starts=2)
    time.sleep(3)  # a second culler, were one started, would have shown up by now
    assert cullers(hub) == [new] and new != old and parent(new) == hub.proc.pid


def test_a_restarted_hub_stops_the_previous_culler_before_its_own_acts(ops_hub):
    hub = ops_hub
    hub.start()
    old = the_culler(hub)
    os.kill(old, signal.SIGSTOP)  # the old culler has not noticed yet that its hub is gone
    hub.stop(signal.SIGKILL)
    hub.start()

    assert wait_for(lambda: not pid_alive(old), timeout=30, interval=0.1), hub.log()
    new = the_culler(hub, starts=2)
    assert new != old and parent(new) == hub.proc.pid
    log = hub.log_path.read_text()
    takeover = log.index(f"the culler of a previous hub (pid {old}) still runs; sending it SIGTERM")
    assert log.index("GPU idle culler: every", takeover) > takeover  # its rounds began after the takeover
    assert log.count("GPU idle culler: every") == 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopping_a_background_hub_stops_its_culler_at_the_first_signal(ops_hub, sig):
    # As `scripts/hub &` in a script: SIGINT ignored, which the culler inherits (the hub handles
    # SIGINT itself, but installs its handler after starting its services). JupyterHub stops a
    # service with SIGINT and sends SIGTERM only 30 s later: the culler must not wait for that.
    hub = ops_hub
    hub.start(background_job=True)
    culler = the_culler(hub)
    proxy = int((hub.dir / "proxy.pid").read_text())
    hub.proc.send_signal(sig)
    assert hub.proc.wait(60) == 0
    assert wait_for(lambda: not pid_alive(culler) and not pid_alive(proxy), timeout=10, interval=0.1)
    log = hub.log_path.read_text()
    assert "gpu-culler] stopped: received SIGINT" in log, log[-3000:]
