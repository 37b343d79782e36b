"""``scripts/bench hub_scale --small`` runs a real hub at scale and prints every figure issue 30 asks for.

The figures themselves are not judged here (no timed assertions): the benchmark must run, leave
nothing behind, and print p50/p99 of each kind of request, the estimate's time, the hub's CPU per
spawn in gpuspawner and the goals beside them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"  # people run: scripts/bench hub_scale
FIGURES = r"p50 [\d.]+ ms, p99 [\d.]+ ms, max [\d.]+ ms \((\d+)\)"


def test_the_small_run_prints_each_figure_and_the_goals():
    proc = subprocess.run([str(BENCH), "hub_scale", "--small"], capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-8000:] + "\n--- stderr ---\n" + proc.stderr[-2000:]  # the hub's log is in out
    assert "100 users, 1000 GPUs on 125 hosts" in out
    counts = {}
    for label in ("POST answer", r"form \(GET /hub/spawn\)", "GET /hub/api/gpus", "stop/spawn answer",
                  r"queue estimate \(in the hub, \d+ waiting\)"):
        found = re.search(label + r"\s+" + FIGURES, out)
        assert found, f"no figures for {label}:\n{out}"
        counts[label] = int(found.group(1))
    # every request was answered and counted: 20 GPU spawns + 12 queued; 60 forms; 40 reads; 8 stops + 8 spawns
    assert list(counts.values())[:4] == [32, 60, 40, 16], counts
    assert counts[r"queue estimate \(in the hub, \d+ waiting\)"] > 0  # 4 of the 12 T4 spawns wait (8 T4s)
    assert re.search(r"statuses \[201, 202\]", out), out  # started, and queued (answered after 10 s)
    assert re.search(r"hub CPU per spawn [\d.]+ ms \(profiled\), of it in gpuspawner's own code \d+%", out), out
    assert out.count("top gpuspawner functions:") == 2 and re.search(r"ms cum .* calls  \S+\.py:\d+ ", out), out
    assert re.search(r"goals: form p99 [\d.]+ ms (met|NOT met); /hub/api/gpus p99 [\d.]+ ms (met|NOT met); "
                     r"estimate p99 [\d.]+ ms (met|NOT met)", out), out
    folder = re.search(r"removed (\S+)", out).group(1)
    assert not Path(folder).exists()
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if folder.encode() in _read(p)]
    assert left == [], left  # no mock server, hub or proxy of the run is left


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""  # gone meanwhile
