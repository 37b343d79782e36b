"""How the stand-in's answers compare with a real GPU's: pure functions over two probe records.

Both records come from ``benchmarks/real_gpu_probe.py``: one on a real GPU host (kept in
``recorded/``), one on the stand-in configured as that host (:func:`fakenvml.recorded_host`).
Each ``*_differences`` function returns sentences naming what differs (empty: nothing); the
fidelity test (tests/unit/test_fakenvml_fidelity.py) asserts they are empty.

What is compared:

- NVML answers (``nvml``, ``nvml_errors``): exactly, value or error, for every call; a field of
  ``nvmlDeviceGetFieldValues`` that failed has no value type to compare (the real driver leaves
  whatever was there). The calls' times are not compared.
- gpuspawner's readings (``gpuspawner``, ``load``, ``server``): the same fields with the same
  JSON types and the same reasons for what is not available; the GPU's fixed facts (identity,
  memory total, limits, maximum clocks, topology) exactly; live values (utilisation, memory used,
  temperature, power, clocks, throughput) by their units' plausible ranges (:func:`implausible`),
  which the real recording must meet too; processes by their shape and their kernel attribution;
  the Prometheus families by name, type, labels and number of samples.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Plausible ranges per unit of the monitor's per-GPU fields (gpuspawner.monitor.reading.FIELDS).
#: "bytes" is checked against the GPU's own memory total; bytes/s up to a PCIe 6 x16 link.
UNIT_RANGES = {"%": (0, 100), "C": (0, 120), "W": (1, 2000), "MHz": (100, 5000), "bytes/s": (0, 256e9)}

#: A sample's per-GPU keys whose values are the GPU's fixed facts: equal on both sides.
FIXED = ("index", "cuda_index", "uuid", "name", "mig_mode", "links", "numa_node", "cpus", "nvlink_links",
         "memory_total", "power_limit", "max_clock_sm", "max_clock_memory", "max_clock_graphics", "mig")


#: Top-level sample keys gpuspawner's monitor added after a recording was made (its code, not what NVML
#: answers): compared only where the recording has them. ``detail_time``: the monitor's sampling pace (issue 32).
NEWER_THAN_RECORDINGS = frozenset({"detail_time"})


def shape(value: Any) -> Any:
    """A JSON value's type skeleton: dicts by key, lists by the set of their items' shapes."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return ["list", sorted({json.dumps(shape(v), sort_keys=True) for v in value})]
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return type(value).__name__.replace("NoneType", "null")


def _answer(answer: Any) -> Any:
    """An NVML answer without its time."""
    if isinstance(answer, list):
        return [_answer(a) for a in answer]
    if isinstance(answer, dict):
        return {k: v for k, v in answer.items() if k != "us"}
    return answer


def _fields(answer: dict) -> Any:
    if "value" not in answer:
        return answer
    return [{k: v for k, v in f.items() if f["nvmlReturn"] == 0 or k != "valueType"} for f in answer["value"]]


def nvml_differences(real: Mapping[str, Any], standin: Mapping[str, Any]) -> list[str]:
    """Every NVML call whose answer (value or error) differs; calls only one side made."""
    out = []
    for label in sorted(set(real) | set(standin)):
        if label not in real or label not in standin:
            out.append(f"{label}: asked of {'the real driver' if label in real else 'the stand-in'} only")
            continue
        a, b = _answer(real[label]), _answer(standin[label])
        if label == "nvmlDeviceGetFieldValues":
            a, b = _fields(a), _fields(b)
        if a != b:
            out.append(f"{label}: real {json.dumps(a)[:300]}, stand-in {json.dumps(b)[:300]}")
    return out


def implausible(gpu: Mapping[str, Any], units: Mapping[str, str]) -> list[str]:
    """The monitor's per-GPU fields whose values are outside their unit's range (None is fine)."""
    out = []
    total = gpu.get("memory_total")
    if total is not None and not 2**30 <= total <= 2**40:
        out.append(f"memory_total {total} bytes is not between 1 GiB and 1 TiB")
    for key, unit in units.items():
        value = gpu.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            out.append(f"{key}: {value!r} is not a number of {unit}")
            continue
        low, high = (0, total) if unit == "bytes" and total else UNIT_RANGES.get(unit, (0, float("inf")))
        if not low <= value <= high:
            out.append(f"{key}: {value} {unit} is outside {low}..{high}")
    if gpu.get("power") is not None and gpu.get("power_limit") and gpu["power"] > 1.2 * gpu["power_limit"]:
        out.append(f"power {gpu['power']} W is far above the limit {gpu['power_limit']} W")
    return out


def _process_differences(where: str, real: list[dict], standin: list[dict]) -> list[str]:
    out = []
    if len(real) != len(standin):
        return [f"{where}: {len(real)} processes on the real GPU, {len(standin)} on the stand-in"]
    for r, s in zip(real, standin, strict=True):
        if shape(r) != shape(s):
            out.append(f"{where}: process shapes differ: real {shape(r)}, stand-in {shape(s)}")
        for side, p in (("real", r), ("stand-in", s)):
            if p.get("type") != "C":
                out.append(f"{where}: {side} process type {p.get('type')!r}, not a compute process 'C'")
        rk, sk = r.get("kernel") or {}, s.get("kernel") or {}
        notes = (r.get("note"), s.get("note"))
        if (rk.get("via_child") is None) != (sk.get("via_child") is None) or notes != (None, None):
            out.append(f"{where}: kernel attribution differs: real {rk} {notes[0]!r}, stand-in {sk} {notes[1]!r}")
    return out


def gpu_differences(where: str, real: Mapping[str, Any], standin: Mapping[str, Any],
                    units: Mapping[str, str]) -> list[str]:
    """One GPU of two monitor samples: keys, types, reasons, fixed facts, ranges, processes."""
    out = []
    if set(real) != set(standin):
        out.append(f"{where}: keys differ: real only {sorted(set(real) - set(standin))}, "
                   f"stand-in only {sorted(set(standin) - set(real))}")
    for key in sorted(set(real) & set(standin)):
        if key in ("processes", "na"):
            continue
        if key in FIXED and real[key] != standin[key]:
            out.append(f"{where}.{key}: real {real[key]!r}, stand-in {standin[key]!r}")
        elif shape(real[key]) != shape(standin[key]):
            out.append(f"{where}.{key}: real {real[key]!r} ({shape(real[key])}), "
                       f"stand-in {standin[key]!r} ({shape(standin[key])})")
    if real.get("na") != standin.get("na"):
        out.append(f"{where}.na: real {real.get('na')}, stand-in {standin.get('na')}")
    for side, gpu in (("real", real), ("stand-in", standin)):
        out += [f"{where} ({side}): {problem}" for problem in implausible(gpu, units)]
        used = sum(p["used_memory"] or 0 for p in gpu.get("processes", []))
        if gpu.get("memory_used") is not None and used > gpu["memory_used"]:
            out.append(f"{where} ({side}): processes use {used} bytes, more than the GPU's {gpu['memory_used']}")
    return out + _process_differences(where, real.get("processes", []), standin.get("processes", []))


def sample_differences(where: str, real: Mapping[str, Any], standin: Mapping[str, Any],
                       units: Mapping[str, str]) -> list[str]:
    """Two monitor samples (api/gpus bodies): top-level keys and values, then GPU by GPU."""
    out = []
    differ = (set(real) ^ set(standin)) - (NEWER_THAN_RECORDINGS - set(real))
    if differ:
        out.append(f"{where}: keys differ: {sorted(differ)}")
    for key in ("status", "detail", "driver_version", "cuda_driver_version", "interval"):
        if real.get(key) != standin.get(key):
            out.append(f"{where}.{key}: real {real.get(key)!r}, stand-in {standin.get(key)!r}")
    if len(real.get("gpus", [])) != len(standin.get("gpus", [])):
        return out + [f"{where}: {len(real['gpus'])} GPUs on the real host, {len(standin['gpus'])} on the stand-in"]
    for n, (r, s) in enumerate(zip(real["gpus"], standin["gpus"], strict=True)):
        out += gpu_differences(f"{where}.gpus[{n}]", r, s, units)
    return out


def metrics_differences(real: Mapping[str, Any], standin: Mapping[str, Any]) -> list[str]:
    """Prometheus families (as the probe parses them): names, types, label names, sample counts."""
    out = []
    if set(real) != set(standin):
        out.append(f"metric families differ: real only {sorted(set(real) - set(standin))}, "
                   f"stand-in only {sorted(set(standin) - set(real))}")
    for name in sorted(set(real) & set(standin)):
        r, s = real[name], standin[name]
        for key in ("type", "labels"):
            if r[key] != s[key]:
                out.append(f"{name}.{key}: real {r[key]}, stand-in {s[key]}")
        if len(r["samples"]) != len(s["samples"]):
            out.append(f"{name}: {len(r['samples'])} samples on the real host, {len(s['samples'])} on the stand-in")
    return out
