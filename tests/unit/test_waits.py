"""The hub's wait estimates (gpuspawner/waits.py): the history from the usage table, kept up to date by
releases, and a waiting request's estimate from the ledger's holders and the queue ahead."""

from __future__ import annotations

from gpuspawner.gpu import GPU
from gpuspawner.ledger import Ledger
from gpuspawner.placement import GPURequest
from gpuspawner.queue import GPUQueue
from gpuspawner.waits import WaitHistory, if_queued_now, queue_estimate, session_key

T4 = "Tesla T4"
HOUR = 3600.0
GPUS = tuple(GPU("h", i, f"GPU-t4-{i}", T4) for i in range(2))


def test_the_history_is_read_once_when_the_database_is_there_then_grows_with_each_release():
    reads = []
    table = [None, [(session_key("server", "tesla-t4"), "ann", HOUR)] * 12]

    def read():
        reads.append(1)
        return table[min(len(reads) - 1, 1)]

    now = [10 * HOUR]
    waits = WaitHistory(read, lambda uuid: "tesla-t4", clock=lambda: now[0])
    waits.observe("release", "bob/", ("GPU-t4-0",), 9 * HOUR)  # before the table is read: in it
    assert len(waits.current()) == 0 and not waits.loaded  # the hub's database is not attached yet
    assert len(waits.current()) == 12 and waits.loaded
    assert len(waits.current()) == 12 and len(reads) == 2  # not read again
    waits.observe("hold", "bob/", ("GPU-t4-0",), 9 * HOUR)
    waits.observe("release", "bob/", ("GPU-t4-0",), 8 * HOUR)
    assert len(waits.current()) == 13
    assert waits.current().lengths("server/tesla-t4", "bob", 0.0)[0][-1] == 2 * HOUR  # 8:00 to 10:00


def test_a_waiting_request_is_estimated_from_the_holders_time_limits_and_the_queue_ahead():
    now = 100 * HOUR  # 04:00 UTC
    ledger = Ledger()
    queue = GPUQueue()
    for owner, uuid in (("ann/job/7", "GPU-t4-0"), ("bob/", "GPU-t4-1")):
        ledger.reserve(tuple(g for g in GPUS if g.uuid == uuid), GPURequest(owner=owner, count=1))
    starts = {"ann/job/7": now - HOUR, "bob/": now - HOUR}
    first = queue.join("cy/", "cy", 1, ("t4",), "t4q")
    second = queue.join("dee/", "dee", 1, ("t4",), "t4q")
    first.joined = second.joined = now
    history = WaitHistory(list, lambda uuid: "")  # nothing has ended yet

    def estimate(waiter):
        return queue_estimate(waiter, GPUS, queue, ledger.allocations(), starts.get, history,
                              job_time_limit=2 * HOUR, queue_timeout=3 * HOUR, now=now)

    # the job reaches its time limit at 05:00; the server has none: the first in line gets the job's GPU
    est = estimate(first)
    assert (est.low, est.likely, est.high) == (now + HOUR,) * 3
    assert est.sentence(now) == (
        "About 05:00 UTC. No session has ended on this hub yet, so nothing tells how long sessions last; "
        "1 of the 2 holders must give their GPUs back by a known time, the first by 05:00 UTC "
        "(a notebook job's time limit).")
    # the second waits behind it: nothing bounds how long the first then holds it, nor the server
    behind = estimate(second)
    assert behind.likely is None and behind.basis.endswith("; 1 request ahead of yours; 1 of the 2 holders must "
                                                           "give their GPUs back by a known time, the first by "
                                                           "05:00 UTC (a notebook job's time limit)")
    # once the first gives up (its wait reaches the queue's limit) the second gets the GPU
    first.joined = now - 3 * HOUR + 1800
    assert estimate(second).likely == now + HOUR


def test_a_server_whose_gpus_the_culler_reported_idle_ends_by_the_culler_s_stop():
    now = 100 * HOUR  # 04:00 UTC
    ledger = Ledger()
    queue = GPUQueue()
    for owner, uuid in (("ann/", "GPU-t4-0"), ("bob/", "GPU-t4-1")):
        ledger.reserve(tuple(g for g in GPUS if g.uuid == uuid), GPURequest(owner=owner, count=1))
    waiter = queue.join("cy/", "cy", 1, ("t4",), "t4q")
    waits = WaitHistory(list, lambda uuid: "")
    # ann's GPU: busy, then below the threshold (5 %) since 03:30; bob's busy at the last sample
    waits.samples("ann/", [(now - 3600, 80.0), (now - 1800, 1.0), (now - 60, 0.0)], 5.0)
    waits.samples("bob/", [(now - 1800, 1.0), (now - 60, 50.0)], 5.0)
    assert waits.idle_since == {"ann/": now - 1800}

    def estimate(idle_timeout):
        return queue_estimate(waiter, GPUS, queue, ledger.allocations(), lambda owner: now - 2 * HOUR, waits,
                              job_time_limit=None, queue_timeout=HOUR, idle_timeout=idle_timeout, now=now)

    est = estimate(HOUR)  # the culler stops ann's server at 04:30
    assert (est.low, est.likely, est.high) == (now + 1800,) * 3
    assert est.basis.endswith("the first by 04:30 UTC (the idle culler stops GPUs left idle)")
    assert estimate(None).likely is None  # no culler: nothing bounds either server
    waits.observe("release", "ann/", ("GPU-t4-0",), now - 2 * HOUR)  # gone: nothing kept of it
    assert waits.idle_since == {}


# ----------------------------------------------------------------- where a user reads it


def test_a_queue_profiles_card_says_when_a_request_queued_now_would_likely_start():
    from jinja2 import Environment, PackageLoader

    from gpuspawner.estimate import Estimate
    from gpuspawner.form import form_context
    from gpuspawner.inventory import InventoryReading
    from gpuspawner.profiles import load_profiles

    now = 100 * HOUR
    line = if_queued_now(Estimate(now + HOUR, now + HOUR / 2, now + 2 * HOUR, "Going by 12 sessions"), now)
    assert line == ("If you queue now: about 05:00 UTC, likely between 04:30 UTC and 06:00 UTC. "
                    "Going by 12 sessions.")
    profiles = load_profiles([{"slug": "gpu", "display_name": "GPU", "gpu_counts": [1]},
                              {"slug": "q", "display_name": "GPU, queued", "gpu_counts": [1], "queue": True}])
    context = form_context(profiles, InventoryReading(gpus=GPUS), (), queue_estimates={"q": line})
    html = Environment(loader=PackageLoader("gpuspawner", "templates"), autoescape=True) \
        .get_template("form.html").render(**context)
    card = html[html.index('data-profile="q"'):]
    assert '<div class="gs-note gs-wait">If you queue now: about 05:00 UTC' in card
    assert "gs-wait" not in html[html.index('data-profile="gpu"'):html.index('data-profile="q"')]


def test_a_queued_job_shows_its_estimate_in_the_job_api_and_the_jupyterlab_job_list():
    from types import SimpleNamespace

    from gpuspawner.hub.jobs import job_json
    from gpuspawner.jobmodel.store import JobRecord
    from gpuspawner.labjobs.scheduler import GPUScheduler

    text = "About 05:00 UTC. Going by 12 sessions."
    estimates = {"ann/job/7f3e": {"likely": 1.0, "low": 1.0, "high": 1.0, "text": text, "basis": "Going by 12"}}
    queued = JobRecord("7f3e", "ann", "train", "queued", {}, 0.0)
    assert job_json(queued, estimates)["estimate"]["text"] == text
    assert job_json(queued.changed(state="running"), estimates)["estimate"] is None
    assert job_json(queued)["estimate"] is None  # not (or no longer) in the hub's queue

    job = SimpleNamespace(tags=[])
    GPUScheduler._apply(None, job, {**job_json(queued, estimates), "state": "queued"})
    assert job.status_message == f"waiting for GPUs in the hub's queue. {text}"
