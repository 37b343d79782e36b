"""A data scientist's notebook job in real Chromium: jupyter-scheduler's Create Job on the hub's GPUs.

A real JupyterHub (gpu-local, the stand-in NVML's 2 A100 + 2 T4), the user's real
JupyterLab with jupyter-scheduler, driven through its own dialog and job list.
Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import time

import pytest

import fakenvml
from chromium import ARTIFACTS, NEEDS_BROWSER, hub_login, playwright_sync_api
from gpuspawner.simulation import simulated_config
from hub import Hub, process_env
from jobnotebooks import GPU_REPORT, JOBS_CONFIG, PROFILES, holders, write

pytestmark = [pytest.mark.integration, *NEEDS_BROWSER]

sync_api = playwright_sync_api()


@pytest.fixture
def hub(tmp_path, fakenvml_libdir):
    config_path = tmp_path / "gpus.json"
    fakenvml.write_config(config_path, simulated_config(a100=2, t4=2))
    hub = Hub(tmp_path / "hub", fakenvml.env(fakenvml_libdir, config_path), PROFILES, extra_config=JOBS_CONFIG)
    hub.start()
    try:
        yield hub
    finally:
        hub.close()


def test_create_job_from_the_benchmark_notebook(hub, browser):
    ARTIFACTS.mkdir(exist_ok=True)
    hub.add_users("dana")
    write(hub.home("dana") / "bench.ipynb", GPU_REPORT, parameters="seconds = 0")
    page = hub_login(browser, hub.url, "dana")
    r = hub.spawn("dana", {"profile": "cpu", "gpus": 0})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("dana")
    page.goto(hub.url + "/user/dana/lab/tree/bench.ipynb")
    page.wait_for_selector(".jp-Notebook")

    # Create Job, from the notebook's toolbar: the hub's GPU choices are the compute types
    sync_api.expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(2)
    page.locator(".jp-Notebook .jp-Cell").first.click()  # the notebook is the current document
    page.locator("[data-command='scheduling:create-from-notebook']").click()
    sync_api.expect(page.get_by_text("Create Job", exact=True)).to_be_visible()
    sync_api.expect(page.locator("input[name=inputFile]")).to_have_value("bench.ipynb")
    page.locator("[aria-labelledby*=computeType], div[role=combobox]").first.click()
    options = page.locator("[role=option]")
    sync_api.expect(options.filter(has_text="1 x Tesla T4 - 2 of 2 free")).to_have_count(1)
    sync_api.expect(options.filter(has_text="CPU only")).to_have_count(1)
    options.filter(has_text="1 x Tesla T4").click()
    page.locator("button:below(:text('Parameters'))").first.click()
    page.locator("input[name=parameter-0-name]").press_sequentially("seconds")
    page.locator("input[name=parameter-0-value]").press_sequentially("4")
    page.locator("input[name=parameter-0-value]").press("Tab")
    page.screenshot(path=str(ARTIFACTS / "jobs-create.png"))
    page.get_by_role("button", name="Create").click()

    # while it runs, the job's process holds exactly the T4 the hub gave it
    deadline = time.monotonic() + 60
    jobs = []
    while time.monotonic() < deadline and not (jobs and jobs[0]["state"] == "running"):
        jobs = hub.api("GET", "/users/dana/gpu-jobs").json()["jobs"]
        time.sleep(0.2)
    assert jobs and jobs[0]["state"] == "running", hub.log()
    uuid = jobs[0]["gpus"][0]["uuid"]
    assert jobs[0]["gpus"][0]["name"] == "Tesla T4"
    pids = [p for p in hub.marked_pids() if process_env(p).get("GPUSPAWNER_SPAWN") == jobs[0]["id"]]
    assert pids and {process_env(p)["CUDA_VISIBLE_DEVICES"] for p in pids} == {uuid}

    # the job list: it completes
    table = page.locator("table")
    for _ in range(60):
        page.get_by_role("button", name="Reload").click()
        if "Completed" in table.inner_text() or "Failed" in table.inner_text():
            break
        page.wait_for_timeout(1000)
    sync_api.expect(table).to_contain_text("Completed")
    assert uuid not in holders(hub), "the GPU is free again"

    # its output files, then the executed notebook with what the benchmark printed
    page.locator("table button[aria-label=download]").first.click()
    for _ in range(30):
        page.get_by_role("button", name="Reload").click()
        if page.locator("table a", has_text="Notebook").count():
            break
        page.wait_for_timeout(1000)
    page.screenshot(path=str(ARTIFACTS / "jobs-list.png"))
    page.locator("table a", has_text="Notebook").first.click()
    output = page.locator(".jp-OutputArea-output").filter(has_text="GPUS=")
    sync_api.expect(output).to_contain_text(f"GPUS={uuid}")
    sync_api.expect(output).to_contain_text("slept 4")
    page.screenshot(path=str(ARTIFACTS / "jobs-output.png"))

    # the job's detail view names the GPU it ran on and how it ended
    page.locator(".lm-TabBar-tab", has_text="Jobs").click()
    page.locator("table a", has_text="bench").first.click()
    detail = page.locator("text=Job Detail").locator("..")
    sync_api.expect(detail).to_contain_text(f"GPU: Tesla T4 {uuid}")
    sync_api.expect(detail).to_contain_text("ended: completed")
