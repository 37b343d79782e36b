"""A data scientist's whole journey, in real Chromium, against the README's run command.

``scripts/hub`` (the README's first command) starts the runnable default
jupyterhub_config.py; a private dockerd answers on DOCKER_HOST, so it picks
gpu-docker, with the TensorFlow notebook image (GPUSPAWNER_IMAGE) on the
simulated 2 x A100 + 2 x T4. Three users in three browser contexts: the first
asks for 2 x A100, follows the progress page, lands in JupyterLab, sees 2 GPUs
in the status bar and runs the benchmark notebook; the second gets the other
GPUs; the third is told why there is none left. Screenshots of each step go
to test-artifacts/journey-*.png.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

import fakenvml
from chromium import ARTIFACTS, NEEDS_BROWSER, playwright_sync_api
from gpuspawner.simulation import simulated_config
from hub import free_port

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "journey-password"

pytestmark = [
    pytest.mark.docker,
    *NEEDS_BROWSER,
]

sync_api = playwright_sync_api()
expect = sync_api.expect


@pytest.fixture
def readme_hub(engine, tensorflow_image, container_libdir, tmp_path):
    """``scripts/hub`` on the private engine; yields its URL and state dir; stopped by pid."""
    state = engine.dir / f"journey-{tmp_path.name}"  # engine.dir is ours and short
    state.mkdir()
    config = simulated_config(2, 2)
    fakenvml.write_config(state / "simulated-gpus.json", config)  # what the hub and containers read
    fakenvml.write_config(engine.gpus_path, config)  # what the engine's NVIDIA hook checks against
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUSPAWNER_", "FAKENVML_"))},
        **engine.env(),
        "GPUSPAWNER_IMAGE": tensorflow_image,
        "GPUSPAWNER_STATE_DIR": str(state),
        "GPUSPAWNER_FAKENVML_DIR": str(container_libdir),
        "GPUSPAWNER_BIND_URL": f"http://127.0.0.1:{port}",
        "GPUSPAWNER_HUB_PORT": str(free_port()),
        "GPUSPAWNER_PROXY_API_URL": f"http://127.0.0.1:{free_port()}",
        "GPUSPAWNER_DOCKER_NETWORK": engine.network,
        "GPUSPAWNER_DEVICE_REQUESTS": "1",
        "GPUSPAWNER_PASSWORD": PASSWORD,
    }
    env.pop("LD_LIBRARY_PATH", None)
    log = open(state / "hub.log", "wb")
    proc = subprocess.Popen([str(ROOT / "scripts" / "hub")], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # scripts/hub runs scripts/setup first
        while True:
            if proc.poll() is not None:
                pytest.fail(f"scripts/hub exited with {proc.returncode}:\n{(state / 'hub.log').read_text()[-4000:]}")
            try:
                if requests.get(url + "/hub/api/", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (state / "hub.log").read_text()[-4000:]
            time.sleep(0.5)
        yield url, state
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # scripts/hub execs jupyterhub: this pid is the hub
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        engine.remove_containers()




def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"journey-{name}.png"))


def log_in(browser, url: str, name: str):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(300_000)
    page.goto(url + "/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    return page


def choose(page, model_prefix: str, count: int) -> None:
    """In the spawn form: the GPU notebook profile, the model whose value starts with the prefix."""
    page.check("input[name=profile][value=gpu]")
    select = page.locator("select[name=gpu_model-gpu]")
    values = select.locator("option").evaluate_all("os => os.map(o => o.value)")
    value = next(v for v in values if v.startswith(model_prefix))
    select.select_option(value)
    page.locator("select[name=gpus-gpu]").select_option(str(count))


def gpus_of(engine, user: str) -> tuple[set[str], str]:
    """The GPUs the engine gave ``user``'s container (its DeviceRequest) and their model label."""
    [container] = [c for c in engine.containers() if c.labels.get("org.gpuspawner.owner") == f"{user}/"]
    [request] = [r for r in container.attrs["HostConfig"]["DeviceRequests"] or [] if r.get("Driver") == "nvidia"]
    return set(request["DeviceIDs"]), container.labels.get("org.gpuspawner.gpu-name", "")


def test_log_in_choose_two_a100_run_the_benchmark_second_user_other_gpus_third_refused(engine, readme_hub, browser):
    url, state = readme_hub
    names = {d["uuid"]: d["name"] for d in json.loads((state / "simulated-gpus.json").read_text())["devices"]}

    # 1. Ada logs in and sees the spawn form with the simulated GPUs
    ada = log_in(browser, url, "ada")
    shot(ada, "1-login")
    ada.click("#login_submit")
    expect(ada.locator("#gpuspawner-form")).to_be_visible()
    expect(ada.locator(".gs-simulated")).to_contain_text("Simulated GPUs")
    choose(ada, "a100", 2)
    shot(ada, "2-form")
    ada.click("#spawn_form button[type=submit]")

    # 2. the progress page (JupyterHub shows it when a start takes over 10 s) says what happens,
    #    then JupyterLab opens
    ada.wait_for_url(re.compile(r"/hub/spawn-pending/ada|/user/ada/lab"), timeout=300_000)
    if "/spawn-pending/" in ada.url:
        ada.click("#progress-details summary")
        expect(ada.locator("#progress-log")).to_contain_text("NVIDIA A100-SXM4-80GB")
        shot(ada, "3-progress")
    ada.wait_for_url(re.compile(r"/user/ada/lab"), timeout=300_000)
    status = ada.locator("[data-gpuspawner=status]")
    expect(status).to_have_text(re.compile(r"^2 GPUs \d+% \| [\d.]+ / 160\.0 GiB$"), timeout=120_000)
    assert status.get_attribute("title").count("NVIDIA A100-SXM4-80GB") == 2
    ada_gpus, _ = gpus_of(engine, "ada")
    assert {names[u] for u in ada_gpus} == {"NVIDIA A100-SXM4-80GB"} and len(ada_gpus) == 2
    expect(ada.locator("#jupyterlab-splash")).to_have_count(0)
    news = ada.get_by_role("button", name="No", exact=True)  # JupyterLab's "official Jupyter news?" toast
    if news.is_visible():
        news.click()
    status.click()  # the GPU panel: one card per GPU of this server
    expect(ada.locator(".jp-gpuspawner-Card")).to_have_count(2)
    expect(ada.locator(".jp-gpuspawner-Card").first).to_contain_text("NVIDIA A100-SXM4-80GB")
    ada.wait_for_timeout(2000)  # a few points on the charts
    shot(ada, "4-lab")

    # 3. the benchmark notebook from ~/examples: run its cells one by one (Shift+Enter)
    ada.goto(url + "/user/ada/lab/tree/examples/gpu-benchmark.ipynb")
    expect(ada.locator("#jupyterlab-splash")).to_have_count(0)
    notebook = ada.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    expect(notebook.locator(".jp-Cell")).to_have_count(3)
    # the kernel is connected: cells run at once (a cell run before that may be lost)
    kernel_idle = ada.locator(".jp-StatusBar-Widget").filter(has_text="Python 3 (ipykernel) | Idle")
    expect(kernel_idle).to_have_count(1, timeout=120_000)
    notebook.locator(".jp-Cell").first.click()
    for _ in range(3):
        ada.keyboard.press("Shift+Enter")
    outputs = notebook.locator(".jp-OutputArea-output")
    expect(outputs.filter(has_text="No GPU visible to TensorFlow: ran on CPU only")).to_be_visible(timeout=300_000)
    printed = "\n".join(outputs.all_inner_texts())
    assert re.search(r"CPU: \d+\.\d{4} s", printed), printed
    assert "4000 x 4000 float32 matrix product, best of 3" in printed, printed
    notebook_gpus = re.search(r"NVIDIA_VISIBLE_DEVICES\): (\S+)", printed).group(1).split(",")
    assert ",".join(sorted(ada_gpus)) == ",".join(sorted(notebook_gpus))
    assert notebook.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
    shot(ada, "5-benchmark")

    # 4. Grace, in another browser context, asks for 2 of any model: she gets the two T4s
    grace = log_in(browser, url, "grace")
    grace.click("#login_submit")
    expect(grace.locator("#gpuspawner-form")).to_contain_text("0 of 2 free")
    choose(grace, "any", 2)
    grace.click("#spawn_form button[type=submit]")
    grace.wait_for_url(re.compile(r"/user/grace/lab"), timeout=300_000)
    g_status = grace.locator("[data-gpuspawner=status]")
    expect(g_status).to_have_text(re.compile(r"^2 GPUs \d+% \| [\d.]+ / [\d.]+ GiB$"), timeout=300_000)
    assert g_status.get_attribute("title").count("Tesla T4") == 2
    grace_gpus, _ = gpus_of(engine, "grace")
    assert grace_gpus.isdisjoint(ada_gpus) and {names[u] for u in grace_gpus} == {"Tesla T4"}
    expect(grace.locator("#jupyterlab-splash")).to_have_count(0)
    g_status.click()
    expect(grace.locator(".jp-gpuspawner-Card")).to_have_count(2)
    expect(grace.locator(".jp-gpuspawner-Card").first).to_contain_text("Tesla T4")
    shot(grace, "6-second-user")

    # 5. Hopper sees that nothing is free, starts anyway, and is told why not
    hopper = log_in(browser, url, "hopper")
    hopper.click("#login_submit")
    form = hopper.locator("#gpuspawner-form")
    expect(form).to_contain_text("NVIDIA A100-SXM4-80GB - 0 of 2 free")
    expect(form).to_contain_text("Tesla T4 - 0 of 2 free")
    expect(form.locator("select[name=gpus-gpu]")).to_contain_text("(not free now)")
    hopper.click("#spawn_form button[type=submit]")
    expect(hopper.locator("body")).to_contain_text("No GPU is free right now: 0 of 4 free", timeout=300_000)
    shot(hopper, "7-third-user-refused")
    assert not [c for c in engine.containers() if c.labels.get("org.gpuspawner.owner") == "hopper/"]
