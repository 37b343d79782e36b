"""In real Chromium, on a real hub and the private Slurm cluster: from the spawn form to JupyterLab.

Debian's Chromium (/usr/bin/chromium) through Playwright, as in tests/browser;
screenshots of the progress page and of JupyterLab go to test-artifacts/.
"""

from __future__ import annotations

import pytest

from chromium import ARTIFACTS, NEEDS_BROWSER, hub_login, playwright_sync_api
from slurmhub import add_user, job_gpus, job_id, monitor_uuids, running_hub

sync_api = playwright_sync_api()

pytestmark = [pytest.mark.integration, pytest.mark.slurm, *NEEDS_BROWSER]


@pytest.fixture
def lab_hub(slurm_cluster, slurm_gpus, tmp_path):
    # its own hub id: the jobs it owns, adopts or cancels are its own
    with running_hub(tmp_path / "hub", slurm_cluster, slurm_gpus,
                     'c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]\n'
                     'c.Spawner.default_url = "/lab"\n') as hub:
        yield hub


def test_pick_one_t4_follow_slurm_progress_and_land_in_jupyterlab_with_that_gpu(
        lab_hub, slurm_cluster, slurm_gpus, browser):
    hub = lab_hub
    add_user(hub, "tess")
    # both T4s are busy with another user's job: tess's job waits in Slurm's queue first
    blocker = slurm_cluster.run("sbatch", "--parsable", "--gres=gpu:t4:2", "-o", "/dev/null",
                                "--wrap", "sleep 600").stdout.strip()
    page = hub_login(browser, hub.url, "tess")
    page.wait_for_url("**/hub/spawn")
    sync_api.expect(page.locator("body")).to_contain_text("T4 (gpu:t4) - 0 of 2 free")

    page.check("input[name=profile][value=gpu]")
    page.select_option("select[name='gpu_model-gpu']", "t4")
    page.select_option("select[name='gpus-gpu']", "1")
    page.click("#spawn_form [type=submit]")
    page.wait_for_url("**/hub/spawn-pending/tess**")
    message = page.locator("#progress-message")
    sync_api.expect(message).to_contain_text("Waiting in Slurm's queue", timeout=60_000)
    sync_api.expect(message).to_contain_text("in use by other jobs")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "slurm-progress-waiting.png"))

    slurm_cluster.run("scancel", blocker)  # the T4s are released: Slurm starts tess's job
    page.wait_for_url("**/user/tess/lab**", timeout=180_000)
    [gpu] = job_gpus(slurm_cluster, job_id(hub, "tess"))
    assert gpu in (2, 3)  # a T4 (nvidia2, nvidia3)
    status = page.locator("[data-gpuspawner=status]")
    sync_api.expect(status).to_have_text("GPU 0% | 0.0 / 15.0 GiB", timeout=120_000)
    title = status.get_attribute("title")
    assert "Tesla T4" in title and "A100" not in title, title
    status.click()  # the GPU panel: that one GPU, by the UUID the stand-in NVML gives it
    card = page.locator(".jp-gpuspawner-Card")
    sync_api.expect(card).to_have_count(1)
    sync_api.expect(card.first).to_contain_text(f"GPU {gpu} (cuda:0) · Tesla T4")  # NVML's index, CUDA's
    page.screenshot(path=str(ARTIFACTS / "slurm-lab-t4.png"))
    assert monitor_uuids(hub, "tess") == [slurm_gpus["uuids"][gpu]]
