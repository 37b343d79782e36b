"""The stand-in NVML's health conditions, seen through the real nvidia-ml-py bindings.

XID events (``nvmlEventSetCreate`` / ``nvmlDeviceRegisterEvents`` / ``nvmlEventSetWait_v2``), double-bit
ECC events, row remapping (``nvmlDeviceGetRemappedRows``) and a GPU fallen off the bus, each injected by
rewriting the device file while a process watches, as the hub's health watcher does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import fakenvml

SCENARIO = r'''
import json, os, sys
import pynvml as N

def err(fn, *args):
    try:
        return fn(*args)
    except N.NVMLError as e:
        return type(e).__name__

def write(cfg):
    path = os.environ["FAKENVML_CONFIG"]
    with open(path + ".tmp", "w") as f:
        json.dump(cfg, f)
    os.replace(path + ".tmp", path)

cfg = json.load(open(os.environ["FAKENVML_CONFIG"]))
N.nvmlInit()
a100, t4 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
out = {}
out["rows_a100"] = list(N.nvmlDeviceGetRemappedRows(a100))
out["rows_t4"] = err(N.nvmlDeviceGetRemappedRows, t4)
out["supported"] = [N.nvmlDeviceGetSupportedEventTypes(a100), N.nvmlDeviceGetSupportedEventTypes(t4)]
cfg["devices"][0]["xid_events"] = [48]  # before registering: never delivered
write(cfg)
es = N.nvmlEventSetCreate()
N.nvmlDeviceRegisterEvents(a100, N.nvmlEventTypeXidCriticalError | N.nvmlEventTypeDoubleBitEccError, es)
N.nvmlDeviceRegisterEvents(t4, N.nvmlEventTypeXidCriticalError, es)
out["unsupported"] = err(N.nvmlDeviceRegisterEvents, t4, N.nvmlEventTypeDoubleBitEccError, es)
out["quiet"] = err(N.nvmlEventSetWait_v2, es, 50)
cfg["devices"][1]["xid_events"] = [13, 79]
cfg["devices"][0]["ecc_errors"]["uncorrected"] = 1
cfg["devices"][0]["remapped_rows"]["pending"] = True
write(cfg)
seen = []
for _ in range(4):
    e = err(N.nvmlEventSetWait_v2, es, 500)
    seen.append(e if isinstance(e, str) else
                [N.nvmlDeviceGetUUID(e.device), e.eventType, e.eventData, e.gpuInstanceId])
out["events"] = seen
out["rows_pending"] = list(N.nvmlDeviceGetRemappedRows(a100))
cfg["devices"][0]["faults"] = {"*": "GPU_IS_LOST"}
write(cfg)
out["lost"] = [err(N.nvmlDeviceGetRemappedRows, a100), err(N.nvmlDeviceGetHandleByIndex, 0)]
cfg["devices"][0]["xid_events"] = [48, 79]
write(cfg)
out["lost_wait"] = err(N.nvmlEventSetWait_v2, es, 50)  # a GPU off the bus raises nothing more
N.nvmlEventSetFree(es)
N.nvmlShutdown()
out["after_shutdown"] = err(N.nvmlEventSetCreate)
print(json.dumps(out))
'''


def test_health_conditions_arrive_as_the_real_library_gives_them(fakenvml_libdir, tmp_path):
    rows = {"correctable": 2, "uncorrectable": 0, "pending": False, "failure": False}
    a100 = fakenvml.make_device(0, ecc_errors={"corrected": 0, "uncorrected": 0}, remapped_rows=rows)
    t4 = fakenvml.make_device(1, "Tesla T4")
    t4.pop("ecc_errors", None)
    config = tmp_path / "gpus.json"
    fakenvml.write_config(config, {"devices": [a100, t4]})
    env = {**os.environ, **fakenvml.env(fakenvml_libdir, config)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCENARIO)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["rows_a100"] == [2, 0, 0, 0]
    assert out["rows_t4"] == "NVMLError_NotSupported"  # a T4 has no row remapper
    assert out["supported"] == [0xFF9F, 0xF19C]  # an H100's (driver 580); without ECC no memory-error events
    assert out["unsupported"] == "NVMLError_NotSupported"
    assert out["quiet"] == "NVMLError_Timeout"
    na = 0xFFFFFFFF
    assert out["events"] == [
        [a100["uuid"], 0x2, 0, na],  # the double-bit ECC error
        [t4["uuid"], 0x8, 13, na],  # every XID is delivered; which count is the listener's business
        [t4["uuid"], 0x8, 79, na],
        "NVMLError_Timeout",  # each once; XID 48 came before the registration
    ]
    assert out["rows_pending"] == [2, 0, 1, 0]
    assert out["lost"] == ["NVMLError_GpuIsLost", "NVMLError_GpuIsLost"]
    assert out["lost_wait"] == "NVMLError_Timeout"
    assert out["after_shutdown"] == "NVMLError_Uninitialized"


def test_a_bad_health_key_names_itself(fakenvml_libdir, tmp_path):
    config = tmp_path / "gpus.json"
    fakenvml.write_config(config, {"devices": [fakenvml.make_device(0, xid_events=[-1])]})
    env = {**os.environ, **fakenvml.env(fakenvml_libdir, config)}
    done = subprocess.run([sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "NVMLError_Unknown" in done.stderr
    assert "devices[0].xid_events must be a list of XID numbers" in done.stderr
