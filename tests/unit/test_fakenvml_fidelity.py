"""The stand-in, configured as a recorded real GPU host, reads as the real driver did.

``benchmarks/real_gpu_probe.py`` recorded real GPU hosts into tests/fakenvml/recorded/ (an H100
on driver 580.159.04: NVML's answers, gpuspawner's readings, a PyTorch process under load
attributed to its kernel, the monitor's API on a real jupyter_server). Here the same probe runs
on the stand-in configured as that host (``fakenvml.recorded_host``), once per recording, and
tests/fakenvml/fidelity.py compares the two records: the same NVML answers and errors, and the
same fields, types, units and reasons through the same gpuspawner code. No GPU is needed.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

import fakenvml
from fakenvml import fidelity
from gpuspawner.monitor.reading import FIELDS

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"  # people run: scripts/bench real_gpu_probe
RECORDINGS = sorted(fakenvml.RECORDED.glob("*.json"))
SECTIONS = ("meta", "nvml", "nvml_errors", "gpuspawner", "load", "server")


@pytest.fixture(scope="module", params=RECORDINGS, ids=lambda p: p.stem)
def records(request, fakenvml_libdir, tmp_path_factory) -> tuple[dict, dict]:
    """(the real recording, the probe's record of the stand-in configured as that host)."""
    recording = request.param
    out = tmp_path_factory.mktemp("fidelity") / "standin.json"
    proc = subprocess.run(
        [str(BENCH), "real_gpu_probe", "--standin", "--standin-lib", str(fakenvml_libdir), "--like", str(recording),
         "--sections", "meta,nvml,gpuspawner,load,server", "--rounds", "3", "--load-seconds", "1.5",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(recording.read_text()), json.loads(out.read_text())


def test_the_recording_is_of_a_real_gpu_and_both_records_are_whole(records):
    real, standin = records
    assert real["meta"]["backend"] == "real" and standin["meta"]["backend"] == "standin"
    assert real["nvml"]["nvmlSystemGetDriverVersion"]["value"] and real["meta"]["date"]
    for record in (real, standin):
        for section in SECTIONS:
            assert "error" not in record[section], (section, record[section].get("error"))


def test_nvml_answers_and_errors_are_the_real_drivers(records):
    real, standin = records
    assert fidelity.nvml_differences(real["nvml"], standin["nvml"]) == []
    assert fidelity.nvml_differences(real["nvml_errors"], standin["nvml_errors"]) == []


def test_gpuspawner_reads_the_same_gpus_topology_and_sample(records):
    real, standin = records
    r, s = real["gpuspawner"], standin["gpuspawner"]
    for key in ("devices", "inventory", "topology", "memory_info", "static_all", "server_env"):
        assert r[key] == s[key], key
    assert fidelity.sample_differences("sample", r["sample"], s["sample"], FIELDS) == []
    assert fidelity.sample_differences("sampler", r["sampler_sample"], s["sampler_sample"], FIELDS) == []


def test_a_process_under_load_reads_the_same_and_is_attributed_to_its_kernel(records):
    real, standin = records
    for record in (real, standin):
        load = record["load"]
        assert load["nvml_pids"] == [load["worker"]["pid"]]  # NVML names the worker's own pid
        [process] = load["samples"][-1]["gpus"][0]["processes"]
        assert process["kernel"]["via_child"] == load["worker"]["pid"]  # the "kernel" is its parent
        assert load["after"]["gpus"][0]["processes"] == [] and load["after"]["gpus"][0]["memory_used"] == 0
    r, s = real["load"], standin["load"]
    assert fidelity.sample_differences("load", r["samples"][-1], s["samples"][-1], FIELDS) == []
    assert fidelity.sample_differences("after", r["after"], s["after"], FIELDS) == []


def test_the_monitor_api_answers_the_same(records):
    real, standin = records
    r, s = real["server"], standin["server"]
    assert (r["unauthenticated"], s["unauthenticated"]) == (403, 403)
    for record in (r, s):
        [process] = record["api_gpus"]["gpus"][0]["processes"]
        assert process["kernel"]["id"] == record["kernel"]["id"] and process["pid"] == record["kernel"]["pid"]
    assert fidelity.sample_differences("api/gpus", r["api_gpus"], s["api_gpus"], FIELDS) == []
    for key in ("status", "content_type", "events"):
        assert r["stream"][key] == s["stream"][key], key
    for n, (a, b) in enumerate(zip(r["stream"]["samples"], s["stream"]["samples"], strict=True)):
        assert fidelity.sample_differences(f"stream[{n}]", a, b, FIELDS) == []
    assert (r["metrics"]["status"], r["metrics"]["content_type"]) == (s["metrics"]["status"],
                                                                       s["metrics"]["content_type"])
    assert fidelity.metrics_differences(r["metrics"]["families"], s["metrics"]["families"]) == []


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda p: p.stem)
def test_the_comparison_notices_what_a_wrong_stand_in_would_do(recording):
    """Each way the stand-in could be wrong is reported (the recording against a spoilt copy of itself)."""
    real = json.loads(recording.read_text())
    assert fidelity.nvml_differences(real["nvml"], real["nvml"]) == []
    assert fidelity.sample_differences("s", real["server"]["api_gpus"], real["server"]["api_gpus"], FIELDS) == []

    spoilt = copy.deepcopy(real)
    spoilt["nvml"]["nvmlDeviceGetTopologyCommonAncestor(self)"] = {"value": 0, "py": "int"}  # an invented answer
    spoilt["nvml"]["nvmlDeviceGetPowerUsage"]["value"] += 1
    assert [d.split(":")[0] for d in fidelity.nvml_differences(real["nvml"], spoilt["nvml"])] == [
        "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTopologyCommonAncestor(self)"]

    sample = real["server"]["api_gpus"]
    spoilt = copy.deepcopy(sample)
    gpu = spoilt["gpus"][0]
    gpu["power"] *= 1000  # milliwatts where watts belong
    gpu["temperature"] = str(gpu["temperature"])  # a string where a number belongs
    gpu["na"]["clock_sm"] = "not supported by this GPU or driver"  # a reason the real GPU did not give
    del gpu["processes"][0]["note"]  # a process entry of another shape
    found = "\n".join(fidelity.sample_differences("s", sample, spoilt, FIELDS))
    for expected in ("power", "temperature", "na", "process shapes differ"):
        assert expected in found, expected

    families = copy.deepcopy(real["server"]["metrics"]["families"])
    families.pop("gpuspawner_gpu_power_watts")
    families["gpuspawner_gpu_clock_hertz"]["labels"].remove("clock")
    assert len(fidelity.metrics_differences(real["server"]["metrics"]["families"], families)) == 2
