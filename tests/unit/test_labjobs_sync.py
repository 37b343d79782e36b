"""The JupyterLab job list's sync with the hub: never on the server's event loop, survives a hub away.

A real jupyter-scheduler ``GPUScheduler`` with its own SQLite database; the
hub's job API (``GET /hub/api/users/NAME/gpu-jobs/ID``) is a small HTTP server
on loopback in its own thread. It answers only once another coroutine of the
server's event loop has run after the request arrived (or gives up after 5 s
with 503): a scheduler that waited for the hub on the loop gets no answer.
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from jupyter_scheduler.models import DescribeJob, ListJobsQuery, Status
from jupyter_scheduler.orm import Job, create_tables

from gpuspawner.labjobs.scheduler import HUB_JOB_FILE, GPUEnvironments, GPUScheduler


class SlowHub(BaseHTTPRequestHandler):
    def do_GET(self):  # http.server's name
        self.server.arrived.set()
        if not self.server.loop_ran.wait(timeout=5):
            self.send_error(503, "the server's event loop never ran while the hub answered")
            return
        job_id = self.path.rsplit("/", 1)[-1]
        body = json.dumps({"id": job_id, "state": "running", "started": "2026-11-23T10:00:00Z", "ended": None,
                           "gpus": [{"name": "Tesla T4", "uuid": f"GPU-{job_id}"}], "reason": ""}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowHub)
    server.arrived, server.loop_ran = threading.Event(), threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hub/api", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def scheduler_with_jobs(tmp_path: Path, monkeypatch, api_url: str, count: int) -> GPUScheduler:
    monkeypatch.setenv("JUPYTERHUB_API_URL", api_url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "server-token")
    monkeypatch.setenv("JUPYTERHUB_USER", "dana")
    db_url = f"sqlite:///{tmp_path / 'scheduler.sqlite'}"
    create_tables(db_url)
    scheduler = GPUScheduler(root_dir=str(tmp_path), environments_manager=GPUEnvironments(), db_url=db_url)
    with scheduler.db_session() as session:
        for n in range(count):
            job = Job(name=f"train-{n}", input_filename="train.ipynb", runtime_environment_name="python3",
                      output_formats=["ipynb"], status=Status.QUEUED)
            session.add(job)
            session.commit()
            staging = Path(scheduler.get_staging_paths(DescribeJob.from_orm(job))["input"])
            staging.parent.mkdir(parents=True, exist_ok=True)
            (staging.parent / HUB_JOB_FILE).write_text(f"hubjob{n}")
    return scheduler


async def list_while_the_loop_runs(scheduler: GPUScheduler, hub=None):
    """The job list, made while another coroutine keeps running on the same loop.

    That coroutine tells the hub (if given) the loop ran after the hub's request arrived.
    """
    done = asyncio.Event()

    async def other_work():
        while not done.is_set():
            if hub is not None and hub.arrived.is_set():
                hub.loop_ran.set()
            await asyncio.sleep(0.01)

    task = asyncio.create_task(other_work())
    listed = await scheduler.list_jobs(ListJobsQuery())
    done.set()
    await task
    return listed


def test_the_job_list_asks_a_slow_hub_without_holding_the_event_loop(tmp_path, monkeypatch, slow_hub):
    url, hub = slow_hub
    scheduler = scheduler_with_jobs(tmp_path, monkeypatch, url, count=3)
    listed = asyncio.run(list_while_the_loop_runs(scheduler, hub))
    jobs = {j.name: j for j in listed.jobs}
    # the hub answered (so the loop ran while it was asked), and its "running" came back
    assert {j.status for j in jobs.values()} == {Status.IN_PROGRESS}
    assert jobs["train-1"].tags == ["GPU: Tesla T4 GPU-hubjob1"]


def test_the_job_list_keeps_what_it_knew_while_the_hub_is_out_of_reach(tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/hub/api"
    scheduler = scheduler_with_jobs(tmp_path, monkeypatch, closed, count=2)
    listed = asyncio.run(list_while_the_loop_runs(scheduler))
    assert sorted((j.name, j.status) for j in listed.jobs) == [("train-0", Status.QUEUED), ("train-1", Status.QUEUED)]
