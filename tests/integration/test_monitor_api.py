"""The GPU monitor's HTTP API on a real jupyter_server with the stand-in NVML.

Each server is a separate process (the stand-in is found through
LD_LIBRARY_PATH at process start). Values are compared with the device file
the stand-in reads; faults are injected by rewriting that file (the stand-in
reloads it when it changes).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

import devcgroup
import fakenvml
from gpuspawner.monitor.kernels import NOT_VISIBLE
from gpuspawner.nvml import _REASONS
from jupyter_server_proc import JupyterServer, SSEClient, run_in_kernel

pytestmark = pytest.mark.monitor

ENDPOINTS = ["api/gpus", "api/gpus/stream", "api/gpus/metrics"]


def devices(n_a100: int = 2, n_t4: int = 2) -> list[dict]:
    out = [fakenvml.make_device(i, utilization_gpu=10 + i, utilization_memory=5 + i, memory_used=(i + 1) * 2**30,
                                temperature=40 + i, power_usage=100_000 + 1000 * i) for i in range(n_a100)]
    out += [fakenvml.make_device(n_a100 + i, "Tesla T4", utilization_gpu=50 + i, memory_used=3 * 2**30)
            for i in range(n_t4)]
    return out


@pytest.fixture
def gpu_file(tmp_path):
    path = tmp_path / "gpus.json"
    config = {"devices": devices()}
    fakenvml.write_config(path, config)
    return path, config


def start(tmp_path, fakenvml_libdir, gpu_file_path, extra_env=None, args=(), counts=None, static_refresh=1,
          **kw) -> JupyterServer:
    """A server on the stand-in (by default GPU facts are re-read every second, so injected faults show quickly)."""
    env = {**fakenvml.env(fakenvml_libdir, gpu_file_path, counts), **(extra_env or {})}
    return JupyterServer(tmp_path / "server", env, [f"--GPUMonitor.static_refresh={static_refresh}", *args], **kw)


def _env_without_visibility(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    # A100s and T4s: CUDA numbers different models in PCI bus order only with this
    # (its default puts the fastest first by a heuristic: cuda_index null, tested apart)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def expected_values(device: dict) -> dict:
    """What the API must say for a device entry of the stand-in's file."""
    return {
        "uuid": device["uuid"],
        "name": device["name"],
        "utilization_gpu": device["utilization_gpu"],
        "utilization_memory": device["utilization_memory"],
        "memory_used": device["memory_used"],
        "memory_total": device["memory_total"],
        "temperature": device["temperature"],
        "power": device["power_usage"] / 1000,
        "power_limit": device["power_limit"] / 1000,
        "clock_sm": device["clocks"]["sm"],
        "clock_memory": device["clocks"]["memory"],
        "clock_graphics": device["clocks"]["graphics"],
        "max_clock_sm": device["max_clocks"]["sm"],
        "max_clock_memory": device["max_clocks"]["memory"],
        "max_clock_graphics": device["max_clocks"]["graphics"],
    }


def test_snapshot_values_equal_the_stand_in(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    with start(tmp_path, fakenvml_libdir, path) as server:
        sample = server.gpus()
        assert sample["status"] == "ok"
        assert sample["driver_version"] == "550.54.15"
        assert [g["index"] for g in sample["gpus"]] == [0, 1, 2, 3]
        assert [g["cuda_index"] for g in sample["gpus"]] == [0, 1, 2, 3]
        for gpu, device in zip(sample["gpus"], config["devices"], strict=True):
            got = {k: gpu[k] for k in expected_values(device)}
            assert got == expected_values(device)
            assert gpu["na"] == {}
            assert gpu["processes"] == [] and gpu["mig"] == []

        metrics = server.get("api/gpus/metrics")
        assert metrics.status_code == 200 and metrics.headers["Content-Type"].startswith("text/plain")
        first = config["devices"][0]
        labels = f'{{index="0",name="{first["name"]}",uuid="{first["uuid"]}"}}'
        assert f"gpuspawner_gpu_memory_used_bytes{labels} {floatToGoString(first['memory_used'])}" in metrics.text
        assert f"gpuspawner_gpu_power_watts{labels} {floatToGoString(first['power_usage'] / 1000)}" in metrics.text
        assert f'gpuspawner_gpu_clock_hertz{{clock="sm",{labels[1:]} {floatToGoString(1410e6)}' in metrics.text
        # every family served is in the README's list (short names there: `_memory_used_bytes`)
        readme = (Path(__file__).parents[2] / "README.md").read_text()
        listed = next(line for line in readme.splitlines() if line.startswith("| `GET {base_url}api/gpus/metrics`"))
        for family in text_string_to_metric_families(metrics.text):
            short = family.name.removeprefix("gpuspawner_gpu")
            assert f"`{family.name}" in listed or f"`{short}" in listed, family.name


def test_history_on_request(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, _ = gpu_file
    with start(tmp_path, fakenvml_libdir, path, args=["--GPUMonitor.interval=0.5"]) as server:
        assert "history" not in server.gpus()
        sample = server.wait_for(lambda s: len(s.get("history", [])) >= 3, what="3 samples of history", history="1")
        times = [h["time"] for h in sample["history"]]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert len(server.gpus(history="0.6")["history"]) < len(server.gpus(history="600")["history"])
        for bad in ("abc", "-5", "nan"):
            r = server.get("api/gpus", params={"history": bad})
            assert r.status_code == 400 and "history" in r.json()["message"]


def test_no_credentials_is_forbidden(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    with start(tmp_path, fakenvml_libdir, path) as server:
        for endpoint in ENDPOINTS:
            for headers in ({}, {"Authorization": "token wrong-token"}):
                r = requests.get(server.url + endpoint, headers=headers, timeout=30, stream=True)
                # jupyter_server answers an unauthenticated API request with 403
                assert r.status_code == 403, (endpoint, r.status_code)
                body = r.raw.read(4096, decode_content=True).decode(errors="replace")
                assert config["devices"][0]["uuid"] not in body
                r.close()
            r = server.get(endpoint, stream=True)
            assert r.status_code == 200
            r.close()


FAULTS = [
    ("nvmlDeviceGetUtilizationRates", ["utilization_gpu", "utilization_memory"]),
    ("nvmlDeviceGetMemoryInfo", ["memory_used", "memory_reserved", "memory_total"]),
    ("nvmlDeviceGetTemperature", ["temperature"]),
    ("nvmlDeviceGetPowerUsage", ["power"]),
    ("nvmlDeviceGetEnforcedPowerLimit", ["power_limit"]),
    ("nvmlDeviceGetClockInfo", ["clock_sm", "clock_memory", "clock_graphics"]),
    ("nvmlDeviceGetMaxClockInfo", ["max_clock_sm", "max_clock_memory", "max_clock_graphics"]),
    ("nvmlDeviceGetComputeRunningProcesses", ["processes"]),
    ("nvmlDeviceGetPcieThroughput", ["pcie_tx", "pcie_rx"]),
]


def test_every_fault_is_na_with_its_reason(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    """Faults injected live, one NVML function at a time, on GPU 1 only; then a lost GPU."""
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    not_supported = _REASONS["NVMLError_NotSupported"]
    with start(tmp_path, fakenvml_libdir, path) as server:
        for function, fields in FAULTS:
            faulty = json.loads(json.dumps(config))
            faulty["devices"][1]["faults"] = {function: "NOT_SUPPORTED"}
            fakenvml.write_config(path, faulty)
            na = dict.fromkeys(fields, not_supported)
            sample = server.wait_for(
                # cached facts (power limit, maximum clocks) follow within static_refresh (1 s here)
                lambda s, na=na: s["gpus"][1]["na"] == na,
                what=f"N/A for {function} alone",
            )
            gpu = sample["gpus"][1]
            for field in fields:
                if field != "processes":
                    assert gpu[field] is None, field
            assert set(gpu["na"]) == set(fields), gpu["na"]
            assert sample["gpus"][0]["na"] == {}  # the other GPUs are untouched
            assert sample["status"] == "ok"
            r = server.get("api/gpus/metrics")
            assert r.status_code == 200

        lost = json.loads(json.dumps(config))
        lost["devices"][2]["faults"] = {"*": "GPU_IS_LOST"}
        fakenvml.write_config(path, lost)
        lost_reason = _REASONS["NVMLError_GpuIsLost"]
        sample = server.wait_for(lambda s: s["gpus"][2]["na"].get("memory_used") == lost_reason, what="lost GPU")
        gpu = sample["gpus"][2]
        assert gpu["utilization_gpu"] is None and gpu["memory_used"] is None and gpu["temperature"] is None
        assert sample["gpus"][3]["utilization_gpu"] == config["devices"][3]["utilization_gpu"]
        assert server.get("api/gpus/metrics").status_code == 200


def test_gpu_lost_before_start_is_listed_with_reason(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    config["devices"][0]["faults"] = {"*": "GPU_IS_LOST"}
    fakenvml.write_config(path, config)
    with start(tmp_path, fakenvml_libdir, path) as server:
        sample = server.gpus()
        assert sample["status"] == "ok"
        gpu = sample["gpus"][0]
        assert gpu["index"] == 0 and gpu["uuid"] is None
        assert gpu["na"]["memory_used"] == _REASONS["NVMLError_GpuIsLost"]
        assert sample["gpus"][1]["uuid"] == config["devices"][1]["uuid"]


@pytest.mark.parametrize("case", ["driver not loaded", "library missing", "init fault"])
def test_no_driver_says_so_and_server_runs(case, tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    if case == "driver not loaded":
        env = fakenvml.env(fakenvml_libdir, None)
        expected = _REASONS["NVMLError_DriverNotLoaded"]
    elif case == "library missing":
        env = {"LD_LIBRARY_PATH": "", "FAKENVML_CONFIG": str(path)}
        expected = _REASONS["NVMLError_LibraryNotFound"]
    else:
        config["faults"] = {"nvmlInit": "DRIVER_NOT_LOADED"}
        fakenvml.write_config(path, config)
        env = fakenvml.env(fakenvml_libdir, path)
        expected = _REASONS["NVMLError_DriverNotLoaded"]
    server = JupyterServer(tmp_path / "server", env)
    with server:
        r = server.get("api/gpus")
        assert r.status_code == 200
        sample = r.json()
        assert sample["status"] == expected
        assert sample["gpus"] == []
        assert sample["detail"]
        metrics = server.get("api/gpus/metrics")
        assert metrics.status_code == 200
        assert 'gpuspawner_gpu_monitor_up{status="' + expected + '"} 0.0' in metrics.text
        assert server.get("api/contents").status_code == 200  # the server itself works


def test_only_visible_gpus_by_uuid(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    uuids = [d["uuid"] for d in config["devices"]]
    shown = [uuids[3], uuids[1]]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(shown), "NVIDIA_VISIBLE_DEVICES": ",".join(shown)}
    with start(tmp_path, fakenvml_libdir, path, extra_env=env) as server:
        sample = server.gpus(history="1")
        assert [g["uuid"] for g in sample["gpus"]] == [uuids[1], uuids[3]]  # NVML order
        assert [g["cuda_index"] for g in sample["gpus"]] == [1, 0]  # CUDA order: as listed
        stream = SSEClient(server, {"history": "1"})
        try:
            stream.wait_for(lambda s: True)
        finally:
            stream.close()
        bodies = [server.get("api/gpus", params={"history": "1"}).text, server.get("api/gpus/metrics").text,
                  "".join(payload for _, payload in stream.events)]
        for body in bodies:
            assert uuids[1] in body
            for hidden in (uuids[0], uuids[2]):
                assert hidden not in body


def test_link_matrix_of_the_servers_own_gpus_and_link_throughput(tmp_path, fakenvml_libdir, monkeypatch):
    """The cube-mesh layout; the server has GPUs 0, 1, 3 and 5: the matrix among those, as nvidia-smi topo -m."""
    _env_without_visibility(monkeypatch)
    config = fakenvml.layout("cube-mesh-8")
    for device in config["devices"]:
        device["nvlink"]["tx_kibps"], device["nvlink"]["rx_kibps"] = 1000, 500
        device["pcie"]["tx_kbps"], device["pcie"]["rx_kbps"] = 2000, 3000
    path = tmp_path / "gpus.json"
    fakenvml.write_config(path, config)
    env = {"CUDA_VISIBLE_DEVICES": "0,1,3,5", "NVIDIA_VISIBLE_DEVICES": "0,1,3,5"}
    with start(tmp_path, fakenvml_libdir, path, extra_env=env) as server:
        sample = server.wait_for(lambda s: s["gpus"][0]["nvlink_tx"] is not None, what="an NVLink rate")
        links = {g["index"]: g["links"] for g in sample["gpus"]}
        assert links == {
            0: {"1": "NV1", "3": "NV2", "5": "SYS"},
            1: {"0": "NV1", "3": "NV1", "5": "NV2"},
            3: {"0": "NV2", "1": "NV1", "5": "SYS"},
            5: {"0": "SYS", "1": "NV2", "3": "SYS"},
        }
        gpu = sample["gpus"][0]
        assert (gpu["numa_node"], gpu["cpus"], gpu["nvlink_links"]) == (0, "0-31", 6)
        assert sample["gpus"][3]["numa_node"] == 1
        assert (gpu["pcie_tx"], gpu["pcie_rx"]) == (2000 * 1024, 3000 * 1024)
        # 6 links, each sending 1000 KiB/s and receiving 500 KiB/s (the stand-in's counters grow in real time)
        assert gpu["nvlink_tx"] == pytest.approx(6 * 1000 * 1024, rel=0.25)
        assert gpu["nvlink_rx"] == pytest.approx(6 * 500 * 1024, rel=0.25)
        assert "nvlink_tx" not in gpu["na"]


def test_only_visible_gpus_by_index_under_a_base_url(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    uuids = [d["uuid"] for d in config["devices"]]
    with start(tmp_path, fakenvml_libdir, path, extra_env={"CUDA_VISIBLE_DEVICES": "2,0"},
               base_url="/user/alice/") as server:
        assert server.url.endswith("/user/alice/")
        sample = server.gpus()
        assert [g["index"] for g in sample["gpus"]] == [0, 2]
        assert [g["cuda_index"] for g in sample["gpus"]] == [1, 0]
        assert uuids[1] not in json.dumps(sample) and uuids[3] not in json.dumps(sample)
        response = requests.get(f"http://127.0.0.1:{server.port}/api/gpus", headers=server.auth, timeout=30)
        assert response.status_code == 404


def test_cpu_only_server_says_no_gpu_visible(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    env = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}  # what every backend gives a CPU-only server
    with start(tmp_path, fakenvml_libdir, path, extra_env=env) as server:
        sample = server.gpus()
        assert sample["status"] == "no GPU visible"
        assert sample["gpus"] == []
        assert "CUDA_VISIBLE_DEVICES=''" in sample["detail"]
        assert config["devices"][0]["uuid"] not in server.get("api/gpus/metrics").text


def test_gpus_fenced_off_from_the_server_are_left_out(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    # No variable restricts this server; the kernel does. NVML counts every GPU but refuses a
    # handle for those whose device node the server's cgroup denies: they are not its GPUs.
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    uuids = [d["uuid"] for d in config["devices"]]
    with devcgroup.group("monitor") as fence:
        for device, node in zip(config["devices"], devcgroup.gpu_nodes(tmp_path / "dev", range(4)), strict=True):
            device["device_node"] = str(node)
        fakenvml.write_config(path, config)
        devcgroup.deny(fence, [1, 2, 3])
        with start(tmp_path, fakenvml_libdir, path) as server:
            devcgroup.join(fence, server.proc.pid)
            sample = server.wait_for(lambda s: len(s["gpus"]) == 1, what="only the GPU the server may open")
            assert sample["status"] == "ok"
            gpu = sample["gpus"][0]
            assert (gpu["index"], gpu["cuda_index"]) == (0, 0)
            assert {k: gpu[k] for k in expected_values(config["devices"][0])} == expected_values(config["devices"][0])
            assert gpu["na"] == {}
            bodies = [json.dumps(sample), server.get("api/gpus/metrics").text]
            for body in bodies:
                for other in uuids[1:]:
                    assert other not in body

            devcgroup.deny(fence, [0])  # now none is left to it
            sample = server.wait_for(lambda s: s["status"] == "no GPU visible", what="no GPU visible")
            assert sample["gpus"] == []
            assert "NVML found 4 GPU(s)" in sample["detail"]
            assert "4 of them this server may not open: their device nodes are fenced off." in sample["detail"]


def test_stream_delivers_new_values_and_nvml_calls_do_not_grow_with_clients(
    tmp_path, fakenvml_libdir, gpu_file, monkeypatch
):
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    counts = tmp_path / "counts"
    with start(tmp_path, fakenvml_libdir, path, counts=counts,  # every sample reads everything here
               args=["--GPUMonitor.interval=0.5", "--GPUMonitor.detail_interval=0.5"], static_refresh=3600) as server:
        first = SSEClient(server)
        assert first.status_code == 200 and first.content_type.startswith("text/event-stream")
        first.wait_for(lambda s: s["gpus"][0]["utilization_gpu"] == 10)

        changed = json.loads(json.dumps(config))
        changed["devices"][0]["utilization_gpu"] = 97
        changed["devices"][0]["memory_used"] = 33 * 2**30
        fakenvml.write_config(path, changed)
        sample = first.wait_for(lambda s: s["gpus"][0]["utilization_gpu"] == 97, what="the new utilisation")
        assert sample["gpus"][0]["memory_used"] == 33 * 2**30

        def calls_per_sample(client: SSEClient, n: int = 6) -> float:
            start_samples = len(client.samples)
            client.wait_for(lambda s: True, what="a sample")  # align with a sample boundary
            base_samples = len(client.samples)
            before = sum(fakenvml.read_counts(counts).values())
            client.wait_for(lambda s: len(client.samples) >= base_samples + n, what=f"{n} more samples")
            after = sum(fakenvml.read_counts(counts).values())
            got = len(client.samples) - base_samples
            assert got >= n and len(client.samples) > start_samples
            return (after - before) / got

        one_client = calls_per_sample(first)
        others = [SSEClient(server) for _ in range(19)]
        try:
            for other in others:
                other.wait_for(lambda s: s["gpus"][0]["utilization_gpu"] == 97)
            # snapshots and metrics while 20 streams are open: still no extra NVML calls
            for _ in range(10):
                server.get("api/gpus")
                server.get("api/gpus/metrics")
            twenty_clients = calls_per_sample(first)
            # every stream got the same samples
            last = first.samples[-1]["time"]
            for other in others:
                other.wait_for(lambda s: s["time"] >= last, what="the same sample on every stream")
        finally:
            for other in others:
                other.close()
            first.close()
        # one sample's worth of calls per sample, whatever the number of clients
        per_sample_floor = 4 * 9  # 4 GPUs x (utilisation, memory, temperature, power, 3 clocks, 2 process lists)
        assert one_client >= per_sample_floor * 0.9, one_client
        assert twenty_clients <= one_client * 1.25, (one_client, twenty_clients)


def test_sampling_pauses_when_nobody_asks(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    _env_without_visibility(monkeypatch)
    path, _ = gpu_file
    counts = tmp_path / "counts"
    with start(tmp_path, fakenvml_libdir, path, counts=counts,
               args=["--GPUMonitor.interval=0.2", "--GPUMonitor.idle_pause=1"]) as server:
        assert sum(fakenvml.read_counts(counts).values()) == 0  # nothing read before a client asks
        server.gpus()

        def settled(timeout: float = 60) -> int:
            deadline = time.monotonic() + timeout
            last = sum(fakenvml.read_counts(counts).values())
            while time.monotonic() < deadline:
                time.sleep(2.5)
                now = sum(fakenvml.read_counts(counts).values())
                if now == last:
                    return now
                last = now
            raise AssertionError("sampling did not pause")

        paused_at = settled()
        assert paused_at > 0
        sample = server.gpus()  # wakes the sampler
        assert sample["status"] == "ok"
        assert sum(fakenvml.read_counts(counts).values()) > paused_at


def test_gpu_memory_is_attributed_to_notebooks(tmp_path, fakenvml_libdir, gpu_file, monkeypatch):
    """A real kernel (and a child it started) appear on the GPU with the notebook's path."""
    _env_without_visibility(monkeypatch)
    path, config = gpu_file
    with start(tmp_path, fakenvml_libdir, path, args=["--GPUMonitor.interval=0.5"]) as server:
        r = requests.post(server.url + "api/sessions", headers=server.auth, timeout=120, json={
            "path": "work/train.ipynb", "name": "train.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
        assert r.status_code == 201, r.text
        kernel_id = r.json()["kernel"]["id"]
        printed = run_in_kernel(server, kernel_id, "import os, subprocess\n"
                                "w = subprocess.Popen(['sleep', '300'])\nprint(os.getpid(), w.pid)")
        kernel_pid, worker_pid = map(int, printed.split())
        hidden_pid = 4_000_000
        while os.path.exists(f"/proc/{hidden_pid}"):
            hidden_pid += 1
        try:
            busy = json.loads(json.dumps(config))
            busy["devices"][0]["processes"] = [
                {"pid": kernel_pid, "used_memory": 3 * 2**30},
                {"pid": worker_pid, "used_memory": 2**30},
                {"pid": hidden_pid, "used_memory": 2**29},
            ]
            fakenvml.write_config(path, busy)
            sample = server.wait_for(
                lambda s: any(p["kernel"] for p in s["gpus"][0]["processes"]), what="a process attributed to a kernel")
            sample = server.wait_for(lambda s: len([p for p in s["gpus"][0]["processes"] if p["kernel"]]) == 2,
                                     what="both processes attributed")
            procs = {p["pid"]: p for p in sample["gpus"][0]["processes"]}
            assert procs[kernel_pid]["used_memory"] == 3 * 2**30
            assert procs[kernel_pid]["kernel"] == {"id": kernel_id, "name": "python3", "path": "work/train.ipynb",
                                                   "pid": kernel_pid, "via_child": None}
            worker_kernel = procs[worker_pid]["kernel"]
            assert worker_kernel["id"] == kernel_id and worker_kernel["via_child"] == worker_pid
            assert procs[hidden_pid]["kernel"] is None and procs[hidden_pid]["note"] == NOT_VISIBLE
            assert [p["pid"] for p in sample["gpus"][0]["processes"]] == [kernel_pid, worker_pid, hidden_pid]
            assert sample["gpus"][1]["processes"] == []
            metrics = server.get("api/gpus/metrics").text
            assert (f'kernel_id="{kernel_id}",name="NVIDIA A100-SXM4-80GB",path="work/train.ipynb",'
                    f'pid="{kernel_pid}"') in metrics
        finally:
            try:
                os.kill(worker_pid, 9)
            except ProcessLookupError:
                pass
