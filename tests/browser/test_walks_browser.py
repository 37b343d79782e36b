"""The first hour (issue 29), in real Chromium: a new user's walk and a new admin's.

The repository's jupyterhub_config.py as ``scripts/hub`` runs it on a machine
without GPUs (gpu-local, 2 x A100 + 2 x T4 simulated through the stand-in NVML,
each user's server as their own account): the hub of test_default_config.py,
one for this module. Each walk goes through the pages a person would, in
Chromium, clicking what they would click, and leaves a screenshot of every step
in test-artifacts/ (walk-user-01-login.png, ..., walk-admin-05-usage.png).

Steps marked "issue 29" check what that issue added: the form's free/total on
each card and counts that never fit, a refusal that names the queued profile,
the queue's estimate (its form part; issue 30: the wait estimate's sentence on the progress page);
the navbar links, the admin page's GPU
section (JupyterHub's admin app has no place for a column: a section below it),
each user's own usage view and end reasons in words (its pages part). Each walk
fails where one of them is missing.
"""

from __future__ import annotations

import pwd
import re
import time
from pathlib import Path

import pytest
import requests

from chromium import ARTIFACTS, NEEDS_BROWSER, playwright_sync_api
from hub import login
from jobnotebooks import write
from test_default_config import default_hub, server_envs  # noqa: F401  (default_hub: this module's hub)
from test_ops_overview import user_token

pytestmark = [pytest.mark.integration, *NEEDS_BROWSER]

sync_api = playwright_sync_api()
expect = sync_api.expect

PASSWORD = "test-password"  # the default hub's (GPUSPAWNER_PASSWORD in test_default_config.py)
QUEUED = "GPU notebook, wait for a GPU"  # jupyterhub_config.py's profile gpu-queued


def shot(page, walk: str, step: int, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"walk-{walk}-{step:02d}-{name}.png"), full_page=True)


def open_login(browser, url: str, name: str):
    """A browser context of its own (its own cookies) at the hub's login page, the form filled in."""
    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.set_default_timeout(60_000)
    page.goto(url + "/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    return page


def choose(page, profile: str, model: str | None = None, count: int | None = None) -> None:
    """In the spawn form: a profile's card, and on it a model (by slug prefix) and a count."""
    page.check(f"input[name=profile][value={profile}]")
    if model is not None:
        select = page.locator(f"select[name=gpu_model-{profile}]")
        values = select.locator("option").evaluate_all("os => os.map(o => o.value)")
        select.select_option(next(v for v in values if v.startswith(model)))
    if count is not None:
        page.locator(f"select[name=gpus-{profile}]").select_option(str(count))


def wait_for(predicate, failure: str, hub=None, timeout: float = 90):
    """Wait until ``predicate()`` holds; else fail saying ``failure`` (and the end of ``hub``'s log)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, failure + (f":\n{hub.log()}" if hub else "")
        time.sleep(0.3)
    return value


class Someone:
    """Another person on the hub, acting through the REST API with a token of their own."""

    def __init__(self, hub, state: Path, name: str) -> None:
        self.hub, self.name = hub, name
        self.auth = {"Authorization": f"token {user_token(hub, login(hub, name), name)}"}
        self.api = f"{hub.url}/hub/api/users/{name}"
        self.account = hub.env["GPUSPAWNER_ACCOUNT_PREFIX"] + name
        self.homes = state / "users"

    def call(self, method: str, path: str = "", **kwargs) -> requests.Response:
        return requests.request(method, self.api + path, headers=self.auth, timeout=60, **kwargs)

    def start(self, options: dict) -> None:
        r = self.call("POST", "/server", json=options)
        assert r.status_code in (201, 202), r.text
        wait_for(lambda: self.call("GET").json()["servers"].get("", {}).get("ready"),
                 f"{self.name}'s server did not start", self.hub)
        server_envs(self.hub, self.name)  # its pids, for the hub's close

    def stop(self) -> None:
        self.call("DELETE", "/server")
        wait_for(lambda: "" not in self.call("GET").json()["servers"], f"{self.name}'s server did not stop", self.hub)

    def run_job(self, options: dict, *cells: str) -> str:
        """A notebook GPU job of ``cells``, running: its id."""
        from gpuspawner.accounts import ensure_account

        home = Path(ensure_account(self.name, self.hub.env["GPUSPAWNER_ACCOUNT_PREFIX"], self.homes).pw_dir)
        write(home / "work.ipynb", *cells)
        r = self.call("POST", "/gpu-jobs", json={**options, "notebook": "work.ipynb"})
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        wait_for(lambda: self.call("GET", f"/gpu-jobs/{job}").json()["state"] == "running",
                 f"{self.name}'s job did not run", self.hub)
        return job

    def cancel_job(self, job: str) -> None:
        assert self.call("DELETE", f"/gpu-jobs/{job}").status_code == 200


@pytest.fixture(autouse=True)
def patient_expect():
    """Each expectation waits up to a minute (JupyterLab opens a notebook in seconds, on a busy machine in more)."""
    expect.set_options(timeout=60_000)
    yield
    expect.set_options(timeout=5_000)  # Playwright's default, for the other modules


@pytest.fixture(scope="module")
def walk_hub(default_hub):  # noqa: F811  (the imported fixture)
    return default_hub


def test_new_user_gets_gpus_is_pointed_to_the_queue_runs_a_job_and_reads_their_usage(walk_hub, browser):
    hub, state = walk_hub
    # someone else's notebook job holds both T4s (a job has a time limit: the queue can say when one frees)
    bob = Someone(hub, state, "bob")
    bobs_job = bob.run_job({"profile": "gpu", "gpus": 2, "gpu_model": "t4"}, "import time\ntime.sleep(600)")

    # 1. Ada logs in
    ada = open_login(browser, hub.url, "ada")
    shot(ada, "user", 1, "login")
    ada.click("#login_submit")

    # 2. the spawn form: what is free of each model, on the profile's own card
    form = ada.locator("#gpuspawner-form")
    expect(form).to_contain_text("Simulated GPUs")
    card = form.locator("[data-profile=gpu]")
    # issue 29: free/total on the card itself, and a count that never fits says so and why
    expect(card.locator(".gs-free")).to_have_text("NVIDIA A100-SXM4-80GB: 2 of 2 free · Tesla T4: 0 of 2 free")
    expect(card.locator("select[name=gpus-gpu] option[value='4']")).to_contain_text(
        "never fits here: needs 4 GPUs on one host; the largest here has 2")
    choose(ada, "gpu", "a100", 2)
    shot(ada, "user", 2, "form")
    ada.click("#spawn_form button[type=submit]")

    # 3. JupyterLab opens on her two A100s; the status bar and the GPU panel show them
    ada.wait_for_url(re.compile(r"/user/ada/lab"), timeout=120_000)
    status = ada.locator("[data-gpuspawner=status]")
    expect(status).to_have_text(re.compile(r"^2 GPUs \d+% \| [\d.]+ / 160\.0 GiB$"))
    expect(ada.locator("#jupyterlab-splash")).to_have_count(0)
    status.click()
    cards = ada.locator(".jp-gpuspawner-Card")
    expect(cards).to_have_count(2)
    for i in range(2):
        expect(cards.nth(i)).to_contain_text("NVIDIA A100-SXM4-80GB")
    shot(ada, "user", 3, "lab-gpus")

    # 4. a second server: no GPU is free, and the refusal names the profile that would queue her
    more = ada.context.new_page()
    more.set_default_timeout(60_000)
    more.goto(hub.url + "/hub/spawn/ada/more")
    choose(more, "gpu", "any")
    more.click("#spawn_form button[type=submit]")
    refusal = more.locator(".spawn-error-msg")
    expect(refusal).to_contain_text("No GPU is free right now: 0 of 4 free. Try again later.")
    # issue 29: pointed to the queued profile
    expect(refusal).to_contain_text(f'Pick "{QUEUED}" to wait in the queue instead.')
    shot(more, "user", 4, "refused")

    # 5. she picks that profile: her server waits in the queue, and its progress says for how long
    more.locator(".gs-profile", has_text=QUEUED).locator("input[name=profile]").check()
    more.click("#spawn_form button[type=submit]")
    more.wait_for_url(re.compile(r"/hub/spawn-pending/ada/more"))
    message = more.locator("#progress-message")
    expect(message).to_contain_text("Waiting for a free GPU: number 1 in the queue")
    # issue 29: an estimate, and what it rests on, instead of "no estimate yet"; issue 30: the wait
    # estimate's sentence (no session has ended yet: bob's job's time limit is what bounds the wait)
    clock = r"(\d{4}-\d\d-\d\d )?\d\d:\d\d UTC"
    expect(message).to_contain_text(re.compile(
        rf"4 of 4 GPUs held\. About {clock}(, likely between {clock} and {clock})?\. No session has ended on this hub "
        rf"yet, so nothing tells how long sessions last; 1 of the 2 holders must give their GPUs back by a known "
        rf"time, the first by {clock} \(a notebook job's time limit\)\."))
    shot(more, "user", 5, "queued")
    bob.cancel_job(bobs_job)  # bob's job ends: her queued server gets a T4
    more.wait_for_url(re.compile(r"/user/ada/more/"), timeout=120_000)
    more.close()

    # 6. a notebook job from JupyterLab's Create Job dialog, on the last free GPU
    account = pwd.getpwnam(hub.env["GPUSPAWNER_ACCOUNT_PREFIX"] + "ada")
    write(Path(account.pw_dir) / "train.ipynb",
          "import os\nprint('GPUS=' + os.environ.get('CUDA_VISIBLE_DEVICES', ''))")
    ada.goto(hub.url + "/user/ada/lab/tree/train.ipynb")
    notebook = ada.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    expect(notebook.locator(".jp-Cell")).to_have_count(1)
    notebook.locator(".jp-Cell").first.click()
    ada.locator("[data-command='scheduling:create-from-notebook']").click()
    expect(ada.get_by_text("Create Job", exact=True)).to_be_visible()
    ada.locator("[aria-labelledby*=computeType], div[role=combobox]").first.click()
    t4 = ada.locator("[role=option]").filter(has_text="1 x Tesla T4 - 1 of 2 free")
    expect(t4).to_have_count(1)
    t4.click()
    shot(ada, "user", 6, "create-job")
    ada.get_by_role("button", name="Create").click()
    table = ada.locator("table.MuiTable-root")
    for _ in range(90):
        ada.get_by_role("button", name="Reload").click()
        if re.search(r"Completed|Failed", table.inner_text()):
            break
        ada.wait_for_timeout(1000)
    expect(table).to_contain_text("Completed")
    shot(ada, "user", 7, "job-completed")

    # 7. her own usage: the navbar's GPU usage link (issue 29), her GPU-hours, how each ended
    ada.goto(hub.url + "/hub/home")
    ada.locator("#gpuspawner-nav-usage").click()
    expect(ada.locator("h1")).to_have_text("Your GPU usage")
    expect(ada.locator("#gpuspawner-usage-total")).to_contain_text(re.compile(r"Total: [\d.]+ GPU-hours"))
    hours = re.compile(r"\d+\.\d\d")
    servers = ada.locator(".gpuspawner-usage-server tbody tr")
    for what in ("default server", "server more", "job "):
        expect(servers.filter(has_text=what)).to_contain_text(hours)
    history = ada.locator(".gpuspawner-usage-history tbody tr")
    expect(history.filter(has_text="default server")).to_contain_text("2 x NVIDIA A100-SXM4-80GB")
    expect(history.filter(has_text="default server").locator("[data-field=how]")).to_have_text("Running")
    job_row = history.filter(has_text="job ")
    expect(job_row).to_contain_text("1 x Tesla T4")
    expect(job_row.locator("[data-field=how]")).to_have_text("Completed")
    expect(ada.locator("#gpuspawner-usage")).not_to_contain_text("bob")
    shot(ada, "user", 8, "usage")


def test_admin_finds_the_overview_the_admin_page_gpus_and_usage_with_end_reasons(walk_hub, browser):
    hub, state = walk_hub
    carol = Someone(hub, state, "carol")
    carol.start({"profile": "gpu", "gpus": 1, "gpu_model": "any"})

    # 1. the admin logs in
    admin = open_login(browser, hub.url, "admin")
    shot(admin, "admin", 1, "login")
    admin.click("#login_submit")
    admin.wait_for_url(lambda url: "/hub/login" not in url)

    # 2. issue 29: the navbar links the GPU overview, on whatever hub page they land
    link = admin.locator("#gpuspawner-nav-gpus")
    expect(link).to_have_text("GPUs")
    shot(admin, "admin", 2, "navbar")
    link.click()

    # 3. the overview: who holds which GPU
    admin.wait_for_url(re.compile(r"/hub/gpus$"))
    expect(admin.locator("h1")).to_have_text("GPUs")
    held = admin.locator("#gpuspawner-gpu-table [data-field=holder]", has_text="carol")
    expect(held).to_have_count(1)
    expect(held).to_contain_text("running")
    shot(admin, "admin", 3, "overview")

    # 4. JupyterHub's admin page (its navbar link) lists carol, and (issue 29) the GPUs she holds
    admin.get_by_role("link", name="Admin", exact=True).click()
    admin.wait_for_url(re.compile(r"/hub/admin"))
    expect(admin.locator("#react-admin-hook")).to_contain_text("carol")
    row = admin.locator("#gpuspawner-admin-gpus tr[data-owner='carol/']")
    expect(row.locator("[data-field=gpus]")).to_have_text(re.compile(r"^1 x (NVIDIA A100-SXM4-80GB|Tesla T4)$"))
    expect(row).to_contain_text("default server")
    shot(admin, "admin", 4, "admin-page")

    # 5. carol stops her server; issue 29: the usage page says how each start ended
    carol.stop()
    admin.locator("#gpuspawner-nav-usage").click()
    expect(admin.locator("h1")).to_have_text("GPU usage")
    stopped = admin.locator(".gpuspawner-usage-history tr[data-owner='carol/']")
    expect(stopped.locator("[data-field=how]")).to_have_text("Stopped")
    expect(admin.locator(".gpuspawner-usage-user")).to_contain_text("carol")
    shot(admin, "admin", 5, "usage")
