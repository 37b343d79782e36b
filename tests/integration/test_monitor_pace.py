"""The monitor's pace on a real jupyter_server with the stand-in NVML: what nobody watching costs, what
the GPU culler still finds, and what a watcher joining after a quiet stretch sees (schedule.py)."""

from __future__ import annotations

import json
import time

import pytest

import fakenvml
from gpuspawner.monitor.reading import NOT_WATCHED
from jupyter_server_proc import JupyterServer, SSEClient

pytestmark = pytest.mark.monitor

UTILIZATION = "nvmlDeviceGetUtilizationRates"


@pytest.fixture
def stand_in(tmp_path, fakenvml_libdir, monkeypatch):
    """(device file, its config, counts file, env) for 2 simulated A100s."""
    for key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    path, counts = tmp_path / "gpus.json", tmp_path / "counts"
    config = {"devices": [fakenvml.make_device(i, utilization_gpu=0, temperature=40 + i) for i in range(2)]}
    fakenvml.write_config(path, config)
    return path, config, counts, fakenvml.env(fakenvml_libdir, path, counts)


def change(path, config, **values) -> dict:
    changed = json.loads(json.dumps(config))
    changed["devices"][0].update(values)
    fakenvml.write_config(path, changed)
    return changed


def wait_counts(counts, predicate, what: str, timeout: float = 60) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = fakenvml.read_counts(counts)
        if predicate(now):
            return now
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen within {timeout} s: {fakenvml.read_counts(counts)}")


def test_nobody_watching_the_culler_still_finds_utilisation_between_its_reads(tmp_path, stand_in):
    path, config, counts, env = stand_in
    args = ["--GPUMonitor.interval=0.5", "--GPUMonitor.idle_pause=1", "--GPUMonitor.idle_interval=1"]
    with JupyterServer(tmp_path / "server", env, args) as server:
        first = server.gpus(history="60")  # what the culler asks each round
        assert first["gpus"][0]["temperature"] == 40 and first["detail_time"] == first["time"]
        # nobody watches: a utilisation reading a second and nothing else
        after_read = wait_counts(counts, lambda c: c.get(UTILIZATION, 0) >= 2 * 3 + 2,
                                 "utilisation samples while nobody watches")
        change(path, config, utilization_gpu=97)  # the user's job runs between two culler rounds
        busy = wait_counts(counts, lambda c: c[UTILIZATION] >= after_read[UTILIZATION] + 2 * 3, "3 more samples")
        assert {f: n for f, n in busy.items() if f != UTILIZATION} == {
            f: n for f, n in after_read.items() if f != UTILIZATION}  # only utilisation was read meanwhile
        second = server.gpus(history="60")
        between = [s for s in second["history"] if first["time"] < s["time"] < second["time"]]
        assert any(s["gpus"][0]["utilization_gpu"] == 97 for s in between)
        kept = [s for s in between if s["detail_time"] is None]
        assert kept, "no utilisation-only sample between the reads"
        gpu = kept[-1]["gpus"][0]
        assert gpu["memory_used"] is None and gpu["temperature"] is None and gpu["processes"] == []
        assert gpu["na"]["memory_used"] == gpu["na"]["processes"] == NOT_WATCHED
        assert gpu["memory_total"] == config["devices"][0]["memory_total"]
        assert second["detail_time"] == second["time"]  # the answer itself is complete
        assert second["gpus"][0]["memory_used"] == config["devices"][0]["memory_used"]


def test_without_a_history_reader_sampling_stops(tmp_path, stand_in):
    path, config, counts, env = stand_in
    args = ["--GPUMonitor.interval=0.5", "--GPUMonitor.idle_pause=1", "--GPUMonitor.idle_interval=1"]
    with JupyterServer(tmp_path / "server", env, args) as server:
        stream = SSEClient(server, {"history": "600"})  # a watcher (its history does not make it a reader)
        stream.wait_for(lambda s: True)
        stream.close()
        server.gpus()
        last, still = fakenvml.read_counts(counts), 0
        while still < 3:  # three 2-second looks without a new call: it stopped
            time.sleep(2)
            now = fakenvml.read_counts(counts)
            still, last = (still + 1, last) if now == last else (0, now)


def test_a_watcher_joining_after_a_quiet_stretch_gets_everything_fresh_at_once(tmp_path, stand_in):
    path, config, counts, env = stand_in
    # utilisation-only samples an hour apart: a joining watcher who waited for the pace would wait an hour
    args = ["--GPUMonitor.interval=0.5", "--GPUMonitor.idle_pause=1", "--GPUMonitor.idle_interval=3600"]
    with JupyterServer(tmp_path / "server", env, args) as server:
        server.gpus(history="600")  # a complete sample, then the next reading an hour later
        time.sleep(2)  # the newest sample is now older than what a watcher takes (2 intervals)
        change(path, config, temperature=71, utilization_gpu=55, memory_used=9 * 2**30)
        joined = time.time()
        assert server.get("api/gpus/stream", params={"view": "chart"}).status_code == 400
        stream = SSEClient(server)
        try:
            first = stream.wait_for(lambda s: True)
            assert first is stream.samples[0] and first["time"] >= joined
            gpu = first["gpus"][0]
            assert (gpu["temperature"], gpu["utilization_gpu"], gpu["memory_used"]) == (71, 55, 9 * 2**30)
            assert first["detail_time"] == first["time"]
            # and the watched pace goes on: utilisation and memory every interval, everything every detail_interval
            second = stream.wait_for(lambda s: s["time"] > first["time"])
            assert second["gpus"][0]["temperature"] == 71
            assert second["detail_time"] == first["time"]  # carried (detail_interval is 15 s)
            panel = SSEClient(server, {"view": "panel"})  # a GPU panel opens: everything, every sample
            try:
                change(path, config, temperature=72)
                seen = panel.wait_for(lambda s: s["gpus"][0]["temperature"] == 72)
                assert seen["detail_time"] == seen["time"]
                after = panel.wait_for(lambda s: s["time"] > seen["time"])
                assert after["detail_time"] == after["time"]
            finally:
                panel.close()
        finally:
            stream.close()
