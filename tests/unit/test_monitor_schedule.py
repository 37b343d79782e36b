"""The monitor's sampling schedule (gpuspawner/monitor/schedule.py), on a simulated clock.

What it must give: NVML calls that never exceed jupyterlab-nvdashboard's at any number of watchers
(nvdashboard's "GPU Utilization" and "GPU Memory" widgets: 3 calls per GPU per second for each
watcher, none without one), a joining watcher's fresh sample at once, and the GPU culler's samples
between its reads.
"""

from __future__ import annotations

import math

from gpuspawner.monitor.schedule import CORE, FULL, UTILIZATION, Schedule

#: NVML calls per GPU of each reading on a GPU without NVLink or MIG (reading.py, counted by
#: benchmarks/monitor.py): utilisation; + memory; + temperature, power, 3 clocks, 2 PCIe
#: throughputs, 3 for the process lists (compute: its size, then the list, when there are any).
CALLS = {UTILIZATION: 1, CORE: 2, FULL: 12}
NVDASHBOARD_PER_WATCHER = 3  # calls per GPU per second (measured: 12/s for 4 GPUs, one watcher)


def run(schedule: Schedule, start: float, end: float, events: dict[float, callable] | None = None) -> list:
    """The readings [(time, kind)] the sampler takes from ``start`` to ``end``; ``events`` (time ->
    action on the schedule) happen at their times and wake the sampler, as requests do."""
    events = dict(sorted((events or {}).items()))
    readings, now = [], start
    while now < end:
        for at in [t for t in events if t <= now]:
            events.pop(at)(schedule, at)
        reads, wait = schedule.next(now)
        if reads is not None:
            readings.append((now, reads))
            schedule.taken(reads, now)
            continue
        woken = min([t for t in events if t > now], default=math.inf)
        now = min(now + wait, woken, end)
    return readings


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def calls_per_second(readings: list, seconds: float) -> float:
    return sum(CALLS[kind] for _, kind in readings) / seconds


def watch(schedule: Schedule, now: float) -> None:
    """A stream opens: the handler subscribes, then asks for a fresh complete sample."""
    schedule.streams += 1
    schedule.want_full()


def leave(schedule: Schedule, now: float) -> None:
    schedule.streams -= 1
    schedule.snapshot(now)


def test_nobody_asking_reads_nothing():
    assert run(Schedule(), 0, 3600) == []


def test_a_watcher_costs_less_than_nvdashboards_and_watchers_cost_the_same_as_one():
    one = Schedule()
    readings = run(one, 0, 600, {0: watch})
    assert readings[0] == (0, FULL)  # the joining watcher's first sample reads everything
    assert calls_per_second(readings, 600) < NVDASHBOARD_PER_WATCHER
    times = [t for t, _ in readings]
    assert max(gaps(times)) <= one.interval  # the charts' pace is kept
    fulls = [t for t, kind in readings if kind == FULL]
    assert max(gaps(fulls)) <= one.detail_interval

    hundred = Schedule()
    assert run(hundred, 0, 600, {0: lambda s, t: [watch(s, t) for _ in range(100)]}) == readings


def test_the_pace_slows_after_the_last_watcher_and_stops_without_a_culler():
    schedule = Schedule(idle_pause=30)
    readings = run(schedule, 0, 3600, {0: watch, 100: leave})
    assert readings[-1][0] <= 100 + schedule.idle_pause
    assert schedule.paused(3600)


def test_a_watcher_joining_after_a_quiet_hour_gets_everything_read_at_once():
    schedule = Schedule()
    readings = run(schedule, 0, 3601, {0: watch, 10: leave, 3600: watch})
    assert (3600, FULL) in readings
    assert [r for r in readings if 10 + schedule.idle_pause < r[0] < 3600] == []


def culler(period: float, window: float, start: float, end: float) -> dict:
    """The GPU culler's reads: api/gpus?history=WINDOW every PERIOD (a complete sample each)."""
    def read(schedule: Schedule, now: float) -> None:
        schedule.history_read(now, window)
        schedule.want_full()
    return {start + n * period: read for n in range(int((end - start) / period) + 1)}


def test_the_culler_finds_utilisation_samples_between_its_reads_and_little_else():
    schedule = Schedule(idle_interval=5)
    period = 60
    readings = run(schedule, 0, 3600, culler(period, 3 * period, 0, 3600))
    times = [t for t, _ in readings]
    assert times[0] == 0 and times[-1] >= 3600 - schedule.idle_interval
    assert max(gaps(times)) <= schedule.idle_interval
    assert {kind for _, kind in readings} == {UTILIZATION, FULL}
    assert [t for t, kind in readings if kind == FULL] == [n * period for n in range(60)]
    # what the culler costs: a utilisation reading every idle_interval, one complete sample a round
    assert calls_per_second(readings, 3600) <= 1 / schedule.idle_interval + CALLS[FULL] / period + 0.01


def test_history_readers_keep_sampling_only_as_long_as_the_history_they_asked_for():
    schedule = Schedule(idle_interval=5, history_seconds=600)
    readings = run(schedule, 0, 3600, {0: lambda s, t: s.history_read(t, 120),
                                       1000: lambda s, t: s.history_read(t, None)})
    times = [t for t, _ in readings]
    assert max(t for t in times if t < 1000) <= 120
    assert max(times) <= 1000 + 600  # "all" is the kept history, at most
    assert min(t for t in times if t >= 1000) == 1000


def test_a_snapshot_during_a_watch_costs_nothing_extra_and_a_snapshot_alone_keeps_the_pace_a_while():
    watched = run(Schedule(), 0, 60, {0: watch, 30: lambda s, t: s.snapshot(t)})
    assert watched == run(Schedule(), 0, 60, {0: watch})
    schedule = Schedule(idle_pause=30)
    readings = run(schedule, 0, 600, {0: lambda s, t: (s.snapshot(t), s.want_full())})
    assert readings[0] == (0, FULL) and 25 <= len(readings) <= 32


def test_a_gpu_panel_on_screen_gets_everything_every_interval_and_the_status_bar_pace_after_it_closes():
    schedule = Schedule()

    def panel(s: Schedule, now: float) -> None:
        watch(s, now)
        s.panels += 1

    def close(s: Schedule, now: float) -> None:
        s.panels -= 1

    readings = run(schedule, 0, 120, {0: panel, 60: close})
    assert {kind for t, kind in readings if t < 60} == {FULL} and len([t for t, _ in readings if t < 60]) == 60
    after = [kind for t, kind in readings if t >= 60]
    assert after.count(FULL) <= 60 / schedule.detail_interval + 1 and CORE in after
