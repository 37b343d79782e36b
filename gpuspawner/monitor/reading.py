"""Read one sample of this server's GPUs through :func:`gpuspawner.nvml.query`.

Blocking; the sampler calls it from its own thread, never on the event loop.
Two steps: :func:`read_static` (slow-changing facts: which GPUs, their names,
UUIDs, memory totals, power limits, maximum clocks, MIG layout; re-read rarely)
and :func:`read_sample` (the live values, every interval). A sample is plain
JSON; the README's "Monitor API" section documents it. A value that cannot be
read is None, and its field name maps to the reason in the GPU's ``na`` dict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

from .. import nvml
from ..topology import format_cpus
from .schedule import CORE, FULL, UTILIZATION
from .visibility import Device, Visibility

# NVML enums (nvml.h), spelled here so this module does not import pynvml.
TEMPERATURE_GPU = 0
CLOCKS = {"graphics": 0, "sm": 1, "memory": 2}

#: Every per-GPU field that may be None, with its unit (used by docs and metrics). A None
#: value names its reason in the GPU's ``na``, except nvlink_tx/rx of a GPU without an
#: active NVLink link (``nvlink_links`` 0): there is nothing to measure.
FIELDS = {
    "utilization_gpu": "%",
    "utilization_memory": "%",
    "memory_used": "bytes",
    "memory_reserved": "bytes",
    "memory_total": "bytes",
    "temperature": "C",
    "power": "W",
    "power_limit": "W",
    "clock_sm": "MHz",
    "clock_memory": "MHz",
    "clock_graphics": "MHz",
    "max_clock_sm": "MHz",
    "max_clock_memory": "MHz",
    "max_clock_graphics": "MHz",
    "pcie_tx": "bytes/s",
    "pcie_rx": "bytes/s",
    "nvlink_tx": "bytes/s",
    "nvlink_rx": "bytes/s",
}

# nvmlPcieUtilCounter_t
PCIE_TX, PCIE_RX = 0, 1
FIRST_RATE = "a rate needs two samples: it comes with the next one"

MIG_NOT_REPORTED = "not reported by the driver while MIG is enabled"

#: The fields only a FULL reading reads (besides ``processes`` and the MIG devices' memory).
DETAIL_FIELDS = ("temperature", "power", "clock_sm", "clock_memory", "clock_graphics",
                 "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")
NOT_WATCHED = "not read while nobody watches (only utilisation is sampled then, for the idle culler)"


@dataclass
class StaticMIG:
    handle: Any
    uuid: str | None
    name: str | None
    memory_total: int | None
    cuda_index: int | None = None
    cuda_reason: str | None = None


@dataclass
class StaticGPU:
    index: int
    handle: Any
    uuid: str | None = None
    name: str | None = None
    cuda_index: int | None = None  # None: the reason is in na["cuda_index"]
    memory_total: int | None = None
    power_limit: float | None = None
    max_clocks: dict[str, int | None] = field(default_factory=dict)
    mig_mode: bool | None = None
    mig: list[StaticMIG] = field(default_factory=list)
    only_some_mig: bool = False  # the server sees only some MIG instances of this GPU
    na: dict[str, str] = field(default_factory=dict)
    # topology (nvml.topology): links to the other GPUs shown, NUMA node and its CPUs
    links: dict[int, str] = field(default_factory=dict)
    numa_node: int | None = None
    cpus: str | None = None
    active_links: tuple[int, ...] = ()
    nvlink_last: tuple[float, int, int] | None = None  # (monotonic time, KiB sent, KiB received)


@dataclass
class Static:
    status: str
    detail: str | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    gpus: list[StaticGPU] = field(default_factory=list)
    read_at: float = field(default_factory=time.monotonic)
    # nvml.topology of the listing, kept across re-reads while the GPUs stay the same: (key, topology)
    topology: tuple[tuple, dict] = ((), {})


def _mig_layout(handle: Any, na: dict[str, str]) -> tuple[bool | None, list[StaticMIG]]:
    """(MIG mode, its MIG devices). A GPU that cannot do MIG answers NOT_SUPPORTED: mode False."""
    mode = nvml.query("nvmlDeviceGetMigMode", handle)
    if mode.reason == nvml.NOT_SUPPORTED:
        return False, []
    if not mode.ok:
        na["mig_mode"] = mode.reason
        return None, []
    if not mode.value[0]:
        return False, []
    migs = []
    for mig in nvml.mig_devices(handle):
        memory = nvml.memory_info(mig.handle.value)
        migs.append(StaticMIG(
            handle=mig.handle.value,
            uuid=mig.uuid.value,
            name=mig.name.value,
            memory_total=memory.value.total if memory.ok else None,
        ))
    return True, migs


def read_static(visibility: Visibility, previous: Static | None = None) -> Static:
    """The GPUs this server may show, with the facts that rarely change.

    The topology is read once and taken from ``previous`` while the GPUs are the same.
    """
    listing = nvml.devices()
    if listing.reason is not None:
        detail = None if listing.started else "GPU statistics are not available on this server."
        return Static(status=listing.reason, detail=detail)
    driver, cuda = listing.driver_version, listing.cuda_driver_version
    gpus: list[StaticGPU] = []
    counters = {(g.index, g.uuid): g.nvlink_last for g in previous.gpus} if previous is not None else {}
    fenced = sum(d.handle.reason == nvml.DENIED for d in listing.devices)
    for device in listing.devices:
        if device.handle.reason == nvml.DENIED:
            continue  # the kernel refuses it to this server: not one of its GPUs, whatever the variables say
        if not device.handle.ok:
            gpus.append(StaticGPU(device.index, None, na={"gpu": device.handle.reason or "unknown"}))
            continue
        h = device.handle.value
        gpu = StaticGPU(device.index, h, uuid=device.uuid.value, name=device.name.value)
        gpu.nvlink_last = counters.get((gpu.index, gpu.uuid))  # a rate spans a re-read of the facts
        for key, r in (("uuid", device.uuid), ("name", device.name)):
            if not r.ok:
                gpu.na[key] = r.reason
        memory = nvml.memory_info(h)
        gpu.memory_total = memory.value.total if memory.ok else None
        limit = nvml.query("nvmlDeviceGetEnforcedPowerLimit", h)
        gpu.power_limit = limit.value / 1000 if limit.ok else None
        if not limit.ok:
            gpu.na["power_limit"] = limit.reason
        for clock, kind in CLOCKS.items():
            r = nvml.query("nvmlDeviceGetMaxClockInfo", h, kind)
            gpu.max_clocks[clock] = r.value
            if not r.ok:
                gpu.na[f"max_clock_{clock}"] = r.reason
        gpu.mig_mode, gpu.mig = _mig_layout(h, gpu.na)
        gpus.append(gpu)
    # (fenced GPUs are left out of gpus: CUDA_VISIBLE_DEVICES indexes count the others, see visibility.py)
    decisions = visibility.decide([Device(g.index, g.uuid, tuple(m.uuid for m in g.mig if m.uuid), g.mig_mode, g.name,
                                          ordinal=n)
                                   for n, g in enumerate(gpus)])
    key = tuple((d.index, d.uuid.value) for d in listing.devices)
    if previous is not None and previous.topology[0] == key:
        topology = previous.topology[1]
    else:
        topology = nvml.topology(listing)
    shown = []
    for gpu, decision in zip(gpus, decisions, strict=True):
        if not decision.visible:
            continue
        gpu.cuda_index = decision.cuda_index
        if decision.cuda_reason is not None:
            gpu.na["cuda_index"] = decision.cuda_reason
        if decision.mig_uuids is not None:
            gpu.only_some_mig = True
            gpu.mig = [m for m in gpu.mig if m.uuid in decision.mig_uuids]
        for m in gpu.mig:
            m.cuda_index = decision.mig_cuda.get(m.uuid) if m.uuid else None
            m.cuda_reason = decision.mig_cuda_reasons.get(m.uuid) if m.uuid else "the MIG device's UUID is not known"
        shown.append(gpu)
    own = {g.index for g in shown}
    for gpu in shown:
        where = topology.get(gpu.index)
        if where is not None:
            gpu.links = {peer: word for peer, word in where.links if peer in own}
            gpu.numa_node = where.numa_node
            gpu.cpus = format_cpus(where.cpus) if where.cpus else None
            gpu.active_links = where.active_links
    if not shown:
        if not listing.devices:
            detail = "NVML found no GPU on this machine."
        else:
            detail = (f"NVML found {len(listing.devices)} GPU(s); "
                      f"none is visible to this server ({visibility.describe()}).")
            if fenced:
                detail += f" {fenced} of them this server may not open: their device nodes are fenced off."
        return Static(status="no GPU visible", detail=detail, driver_version=driver, cuda_driver_version=cuda)
    return Static(status="ok", driver_version=driver, cuda_driver_version=cuda, gpus=shown, topology=(key, topology))


#: attribute(pid) -> (kernel dict or None, note or None); see kernels.py.
Attribution = Callable[[int], tuple[dict | None, str | None]]


def _no_attribution(pid: int) -> tuple[dict | None, str | None]:
    return None, None


def _processes(gpu: StaticGPU, na: dict[str, str], attribute: Attribution) -> list[dict]:
    """The GPU's processes, each pid once.

    A process with both a compute and a graphics context is listed by both NVML
    calls, each entry with ``usedGpuMemory`` being all of that process's memory on
    the device: it is one process of type ``"C+G"`` (as nvidia-smi and nvitop
    show it), its memory counted once. Only on different devices (MIG devices
    shown one by one) are a process's entries added up.
    """
    handles = [m.handle for m in gpu.mig] if gpu.only_some_mig else [gpu.handle]
    seen: dict[int, dict] = {}
    for handle in handles:
        on_device: dict[int, dict] = {}
        for fn, kind in (("nvmlDeviceGetComputeRunningProcesses", "C"), ("nvmlDeviceGetGraphicsRunningProcesses", "G")):
            r = nvml.query(fn, handle)
            if not r.ok:
                if kind == "C":
                    na["processes"] = r.reason
                continue
            for p in r.value:
                used = getattr(p, "usedGpuMemory", None)
                entry = on_device.setdefault(p.pid, {"used_memory": None, "type": ""})
                if kind not in entry["type"]:
                    entry["type"] = f"{entry['type']}+{kind}" if entry["type"] else kind
                if entry["used_memory"] is None:
                    entry["used_memory"] = used
        for pid, entry in on_device.items():
            process = seen.get(pid)
            if process is None:
                kernel, note = attribute(pid)
                seen[pid] = {"pid": pid, "type": entry["type"], "used_memory": entry["used_memory"],
                             "kernel": kernel, "note": note}
                continue
            if entry["used_memory"] is not None:  # the same process on another MIG device
                process["used_memory"] = (process["used_memory"] or 0) + entry["used_memory"]
            if entry["type"] != process["type"]:
                process["type"] = "C+G"
    return sorted(seen.values(), key=lambda e: -(e["used_memory"] or 0))


#: (TX, RX) PCIe throughput readings of one GPU, started before its other readings (see _start_pcie).
PCIe = tuple[Future, Future]


def _start_pcie(gpus: list[StaticGPU], pool: Executor | None) -> dict[int, PCIe]:
    """Start every GPU's two PCIe throughput reads on ``pool``, before anything else is read.

    nvmlDeviceGetPcieThroughput lasts a 20 ms window each ("querying a byte counter over a 20ms
    interval", nvml.h): read one after the other, TX and RX took 42 ms of a real H100's 42.1 ms
    sampler round. On a real H100 two calls from two threads overlap (22 ms for both), so they run
    side by side, beside the GPUs' other readings. Without a pool they are read in turn.
    """
    if pool is None:
        return {}
    return {gpu.index: (pool.submit(nvml.query, "nvmlDeviceGetPcieThroughput", gpu.handle, PCIE_TX),
                        pool.submit(nvml.query, "nvmlDeviceGetPcieThroughput", gpu.handle, PCIE_RX))
            for gpu in gpus if gpu.handle is not None}


def _throughput(gpu: StaticGPU, h: Any, values: dict[str, Any], na: dict[str, str], pcie: PCIe | None) -> None:
    """PCIe (NVML's KB/s) and NVLink (from the data counters, between two samples) in bytes/s."""
    for n, (key, counter) in enumerate((("pcie_tx", PCIE_TX), ("pcie_rx", PCIE_RX))):
        r = pcie[n].result() if pcie is not None else nvml.query("nvmlDeviceGetPcieThroughput", h, counter)
        values[key] = r.value * 1024 if r.ok else None
        if not r.ok:
            na[key] = r.reason
    if not gpu.active_links:
        return  # no NVLink to measure: null without a reason (nvlink_links says 0)
    data = nvml.nvlink_data(h, gpu.active_links)
    if not data.ok:
        na["nvlink_tx"] = na["nvlink_rx"] = data.reason or "unknown"
        return
    now, (sent, received) = time.monotonic(), data.value
    last, gpu.nvlink_last = gpu.nvlink_last, (now, sent, received)
    if last is None or now <= last[0]:
        na["nvlink_tx"] = na["nvlink_rx"] = FIRST_RATE
        return
    values["nvlink_tx"] = max(0, sent - last[1]) * 1024 / (now - last[0])
    values["nvlink_rx"] = max(0, received - last[2]) * 1024 / (now - last[0])


def _mig_memory(gpu: StaticGPU) -> list[dict]:
    mig = []
    for m in gpu.mig:
        mig_na: dict[str, str] = {}
        used = nvml.memory_info(m.handle)
        if not used.ok:
            mig_na["memory_used"] = mig_na["memory_reserved"] = used.reason
        elif used.value.reserved is None:
            mig_na["memory_reserved"] = nvml.MEMORY_V1_ONLY
        if m.cuda_reason is not None:
            mig_na["cuda_index"] = m.cuda_reason
        mig.append({
            "uuid": m.uuid,
            "name": m.name,
            "cuda_index": m.cuda_index,
            "memory_used": used.value.used if used.ok else None,
            "memory_reserved": used.value.reserved if used.ok else None,
            "memory_total": used.value.total if used.ok else m.memory_total,
            "na": mig_na,
        })
    return mig


def _detail(gpu: StaticGPU, values: dict[str, Any], na: dict[str, str], attribute: Attribution,
            pcie: PCIe | None) -> tuple[list[dict], list[dict]]:
    """The fields only a FULL reading reads (into ``values`` and ``na``): (processes, MIG devices)."""
    h = gpu.handle
    temp = nvml.query("nvmlDeviceGetTemperature", h, TEMPERATURE_GPU)
    values["temperature"] = temp.value
    if not temp.ok:
        na["temperature"] = temp.reason
    power = nvml.query("nvmlDeviceGetPowerUsage", h)
    values["power"] = power.value / 1000 if power.ok else None
    if not power.ok:
        na["power"] = power.reason
    for clock, kind in CLOCKS.items():
        r = nvml.query("nvmlDeviceGetClockInfo", h, kind)
        values[f"clock_{clock}"] = r.value
        if not r.ok:
            na[f"clock_{clock}"] = r.reason
    _throughput(gpu, h, values, na, pcie)
    mig = _mig_memory(gpu)
    return _processes(gpu, na, attribute), mig


def _carried(previous: dict, values: dict[str, Any], na: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """A CORE reading: the slower fields as the last FULL reading of the same GPU found them."""
    for key in (*DETAIL_FIELDS, "processes"):
        if key in DETAIL_FIELDS:
            values[key] = previous[key]
        if key in previous["na"]:
            na[key] = previous["na"][key]
    return previous["processes"], previous["mig"]


def _same_state(before: dict[str, str], now: dict[str, str]) -> bool:
    """Whether utilisation and memory read as they did in the last complete reading: fine, or failing
    for the same reasons. Otherwise (a GPU lost, a fault come or gone) everything is read again at once."""
    keys = ("utilization_gpu", "memory_used")
    return all(before.get(k) == now.get(k) for k in keys)


def _not_read(gpu: StaticGPU, values: dict[str, Any], na: dict[str, str]) -> list[dict]:
    """A UTILIZATION reading: every live value but utilisation is null, and says why; MIG devices too."""
    values["memory_total"] = gpu.memory_total
    na.update(dict.fromkeys(("memory_used", "memory_reserved", *DETAIL_FIELDS, "processes"), NOT_WATCHED))
    keys = ("memory_used", "memory_reserved")
    return [{"uuid": m.uuid, "name": m.name, "cuda_index": m.cuda_index, **dict.fromkeys(keys),
             "memory_total": m.memory_total, "na": dict.fromkeys(keys, NOT_WATCHED)} for m in gpu.mig]


def _gpu_sample(gpu: StaticGPU, attribute: Attribution, pcie: PCIe | None = None, reads: str = FULL,
                previous: dict | None = None) -> dict:
    """One GPU's entry. ``reads``: UTILIZATION, CORE or FULL (see schedule.py); a CORE reading
    carries the slower fields from ``previous`` (this GPU's entry of a complete sample), and
    reads them itself when there is none."""
    na: dict[str, str] = {}
    out: dict[str, Any] = {
        "index": gpu.index,
        "cuda_index": gpu.cuda_index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "mig_mode": gpu.mig_mode,
        "links": {str(peer): word for peer, word in sorted(gpu.links.items())},
        "numa_node": gpu.numa_node,
        "cpus": gpu.cpus,
        "nvlink_links": len(gpu.active_links),
    }
    values: dict[str, Any] = dict.fromkeys(FIELDS)
    if gpu.handle is None:  # no handle at all: the GPU is lost or unreadable
        reason = gpu.na.get("gpu", "unknown")
        na.update(dict.fromkeys(("uuid", "name", "mig_mode", *FIELDS, "processes"), reason))
        out.update(values, processes=[], mig=[], na=na)
        return out
    h = gpu.handle
    na.update(gpu.na)
    values["power_limit"] = gpu.power_limit
    for clock in CLOCKS:
        values[f"max_clock_{clock}"] = gpu.max_clocks.get(clock)

    util = nvml.query("nvmlDeviceGetUtilizationRates", h)
    if util.ok:
        values["utilization_gpu"], values["utilization_memory"] = util.value.gpu, util.value.memory
    else:
        reason = MIG_NOT_REPORTED if gpu.mig_mode and "not supported" in (util.reason or "") else util.reason
        na["utilization_gpu"] = na["utilization_memory"] = reason
    if reads == UTILIZATION:
        mig = _not_read(gpu, values, na)
        out.update(values, processes=[], mig=mig, na=na)
        return out
    memory = nvml.memory_info(h)
    if memory.ok:
        m = memory.value
        values["memory_used"], values["memory_reserved"], values["memory_total"] = m.used, m.reserved, m.total
        if m.reserved is None:
            na["memory_reserved"] = nvml.MEMORY_V1_ONLY
    else:
        na["memory_used"] = na["memory_reserved"] = memory.reason
        values["memory_total"] = gpu.memory_total
        if gpu.memory_total is None:
            na["memory_total"] = memory.reason
    if reads == CORE and previous is not None and _same_state(previous["na"], na):
        processes, mig = _carried(previous, values, na)
    else:
        processes, mig = _detail(gpu, values, na, attribute, pcie)
    out.update(values)
    out["processes"] = processes
    out["mig"] = mig
    out["na"] = na
    return out


def read_sample(static: Static, attribute: Attribution = _no_attribution, now: float | None = None,
                pool: Executor | None = None, reads: str = FULL, previous: dict | None = None) -> dict:
    """One sample: the live values of every GPU in ``static``, as plain JSON.

    ``pool``: threads that read the PCIe throughput (20 ms a call) side by side (:func:`_start_pcie`).
    ``reads``: UTILIZATION, CORE or FULL (schedule.py); a CORE reading carries the slower fields from
    ``previous``, the last complete sample (GPUs matched by index and UUID). ``detail_time`` says when
    those were read (null in a UTILIZATION reading, which has them null).
    """
    stamp = time.time() if now is None else now
    before = {(g["index"], g["uuid"]): g for g in previous["gpus"]} if previous is not None else {}
    if reads == CORE and any((g.index, g.uuid) not in before for g in static.gpus):
        reads = FULL  # a GPU not in the last complete sample: read everything
    pcie = _start_pcie(static.gpus, pool) if reads == FULL else {}
    detail_time = {FULL: stamp, CORE: (previous or {}).get("detail_time")}.get(reads)
    return {
        "time": stamp,
        "status": static.status,
        "detail": static.detail,
        "driver_version": static.driver_version,
        "cuda_driver_version": static.cuda_driver_version,
        "detail_time": detail_time,
        "gpus": [_gpu_sample(g, attribute, pcie.get(g.index), reads, before.get((g.index, g.uuid)))
                 for g in static.gpus],
    }
