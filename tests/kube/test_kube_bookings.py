"""gpu-kube consults the hub's bookings: real GPUKubeSpawners on the real control plane (the recorded
cluster: 16 A100s, 3 of them free, at most 2 on one node; the real scheduler binds the new pods), and a
real JupyterHub with gpu-kube on it taking bookings over REST and on its bookings page.

The bookings are in the hub's bookings table as the REST API would have written them; the rule counts
the cluster's free A100s (the capacity reader's), so other tenants' pods count as held.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
import requests
from sqlalchemy import create_engine
from tornado.web import HTTPError

from chromium import NEEDS_BROWSER, hub_login, playwright_sync_api
from gpuspawner.bookings import Booking
from gpuspawner.db import BookingStore
from gpuspawner.ledger import cluster_holdings
from hub import BASE_HUB_CONFIG, Hub, login
from jobnotebooks import submit, wait_state
from kubefixtures import hub_account, load, load_pods, namespace_of_its_own, until
from profiles import A100, MIG_1G, PROFILES

HOUR = 3600.0
#: what a booking of 2 A100s holds on this hub, in words
HOLDS_2 = "2 of the cluster's a100-sxm4-80gb GPUs, as counted by this hub; other tenants are not held back"


def gpus(n: int) -> dict:
    return {"profile": "gpu", "gpus": n, "gpu_model": A100}


async def start(spawner, options: dict) -> str:
    spawner.user_options = options
    await spawner._run_apply_user_options(options)
    return await asyncio.wait_for(spawner.start(), 60)


def messages(spawner) -> list[str]:
    return [e["message"] for e in getattr(spawner, "_gpu_events", [])]


def book(spawner, tmp_path, user: str, count: int, start: float, end: float) -> BookingStore:
    store = spawner.hub_state.cache(BookingStore, lambda: BookingStore(create_engine(f"sqlite:///{tmp_path}/b.db")))
    store.save(Booking(id=f"b-{user}", user=user, group="", booked_by=user, model=A100, count=count,
                       start=start, end=end, created=time.time()))
    return store


def bound(cluster, spawner) -> None:
    """The scheduler has put ``spawner``'s pod on a node (from then the capacity reader counts it)."""
    until(lambda: (cluster.pod(spawner.pod_name) or {}).get("spec", {}).get("nodeName"), f"{spawner.pod_name} bound")


async def refused(spawner, options: dict) -> str:
    with pytest.raises(HTTPError) as e:
        await start(spawner, options)
    assert e.value.status_code == 409
    return e.value.jupyterhub_message


async def test_in_a_window_others_get_only_the_free_gpus_nobody_booked_and_the_booker_gets_hers(
        cluster, make_spawner, tmp_path):
    settings = {"gpu_profiles": PROFILES, "gpu_inventory_ttl": 0}
    ivan = make_spawner("ivan", **settings)
    store = book(ivan, tmp_path, "ann", 1, time.time() - 60, time.time() + HOUR)

    # 3 free, 1 booked for ann: ivan may take 2
    await start(ivan, gpus(2))
    bound(cluster, ivan)

    # 1 free, and it is ann's: jack is refused with the booking's sentence, nothing made or counted
    jack = make_spawner("jack", **settings)
    said = await refused(jack, gpus(1))
    assert said.startswith("1 a100-sxm4-80gb GPU is booked ")
    assert "for ann (booked by ann). Only 0 of 1 a100-sxm4-80gb GPU" in said and "Pick another model" in said
    assert cluster.made_pods() == [ivan.pod_name] and "jack/" not in jack.ledger.allocations()

    # ann gets hers, on an A100
    ann = make_spawner("ann", **settings)
    await start(ann, gpus(1))
    bound(cluster, ann)
    assert cluster.pod(ann.pod_name)["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert cluster_holdings(ann.ledger.allocations()["ann/"]) == {"nvidia.com/gpu": 1}

    # ann's GPU used inside her booking: still no room for jack, but her booking is all it holds
    assert "booked" in await refused(make_spawner("jack", **settings), gpus(1))
    store.change(store.get("b-ann"), state="cancelled")
    await ivan.stop(now=True)
    until(lambda: cluster.pod(ivan.pod_name) is None, f"{ivan.pod_name} gone")
    kim = make_spawner("kim", **settings)  # the booking cancelled: ivan's 2 are free for anyone
    await start(kim, gpus(1))
    for spawner in (ann, kim):
        await spawner.stop(now=True)


async def test_before_a_window_a_server_is_admitted_until_it_and_told_and_a_job_only_if_it_ends_before(
        cluster, make_spawner, tmp_path):
    settings = {"gpu_profiles": PROFILES, "gpu_inventory_ttl": 0, "gpu_job_time_limit": 4 * HOUR}
    soon = time.time() + HOUR
    ivan = make_spawner("ivan", **settings)
    store = book(ivan, tmp_path, "ann", 3, soon, soon + HOUR)

    # 3 free, all 3 booked from in an hour: ivan may hold 2 until then
    await start(ivan, gpus(2))
    bound(cluster, ivan)
    assert store.admitted["ivan/"][1] == "b-ann"
    assert any("will be stopped" in m and "booked" in m for m in messages(ivan)), messages(ivan)

    # a job that may run for the hub's limit (4 h) would run into the window (ivan's 2 and the free 1 are
    # ann's then): refused
    long_job = make_spawner("zoe", **settings)
    long_job.gpu_owner_override = "zoe/job/long"
    await long_job.apply_job_options(gpus(1))
    with pytest.raises(HTTPError) as e:
        await long_job.reserve_gpus()
    assert e.value.status_code == 409 and "booked" in e.value.jupyterhub_message
    assert "zoe/job/long" not in long_job.ledger.allocations()

    # the same job with its own time limit of 30 minutes ends before the window: admitted
    short_job = make_spawner("zoe", **settings)
    short_job.gpu_owner_override = "zoe/job/short"
    short_job.gpu_job_own_limit = HOUR / 2
    await short_job.apply_job_options(gpus(1))
    await short_job.reserve_gpus()
    assert cluster_holdings(short_job.ledger.allocations()["zoe/job/short"]) == {"nvidia.com/gpu": 1}
    short_job.release_gpus()
    await ivan.stop(now=True)
    assert "ivan/" not in store.admitted


def hub_settings(spawner) -> dict:
    """What the hub's bookings code reads of the hub's tornado settings, for ``spawner``'s hub."""
    from gpuspawner.backends.kube.spawner import GPUKubeSpawner

    return {"gpuspawner_hub_state": spawner.hub_state, "config": spawner.config, "spawner_class": GPUKubeSpawner,
            "db": None}


async def test_the_keeper_offers_the_clusters_models_and_says_what_a_booking_holds(cluster, make_spawner):
    from gpuspawner.hub import booking_keeper as keeping

    settings = hub_settings(make_spawner("ivan", gpu_profiles=PROFILES, gpu_inventory_ttl=0))
    models = {m["model"]: m for m in await keeping.models(settings)}
    assert models[A100]["total"] == 16 and models[A100]["name"] == "NVIDIA-A100-SXM4-80GB"
    b = Booking(id="b-1", user="ann", group="", booked_by="ann", model=A100, count=2, start=time.time() + HOUR,
                end=time.time() + 2 * HOUR, created=time.time())
    keeper = keeping.keeper_of(settings)
    assert await keeping.reserve_then_save(keeper, b, lambda _: None) == HOLDS_2
    assert await keeping.holds(settings, [b]) == {"b-1": HOLDS_2}
    assert cluster.made_pods() == []  # nothing is made on the cluster for a booking


async def test_a_booking_in_use_on_the_cluster_is_not_released_and_an_unused_one_is(cluster, make_spawner, tmp_path):
    from gpuspawner.hub.bookings import release_unused

    ann = make_spawner("ann", gpu_profiles=PROFILES, gpu_inventory_ttl=0, gpu_booking_grace=30)
    store = book(ann, tmp_path, "ann", 1, time.time() - 60, time.time() + HOUR)  # began a minute ago
    settings = hub_settings(ann)
    await start(ann, gpus(1))
    bound(cluster, ann)
    # ann's pod holds an A100, the booked model: her window is in use (the ledger's token says only
    # nvidia.com/gpu; the model is the one her pod asked for)
    assert release_unused(settings) == []
    assert store.get("b-ann").state != "released"

    # the hub restarts: it counts ann's pod again and finds its model on the node the pod runs on
    make_spawner.restart()
    again = make_spawner("ann")
    again.hub_state.cache(BookingStore, lambda: store)
    await again.ensure_reconciled()
    assert release_unused(hub_settings(again)) == [] and store.get("b-ann").state != "released"

    await again.stop(now=True)
    [released] = release_unused(hub_settings(again))  # no GPU of hers any more: released, and recorded
    assert released.id == "b-ann" and store.get("b-ann").state == "released" and store.get("b-ann").released_at


KUBE_BOOKINGS_CONFIG = BASE_HUB_CONFIG + """
from gpuspawner.hub.setup import configure
c.JupyterHub.spawner_class = "gpu-kube"
c.KubeSpawner.namespace = settings["namespace"]
c.KubeSpawner.k8s_api_host = settings["k8s"]
c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]
c.GPUSpawnerMixin.gpu_inventory_ttl = 0.5
c.GPUSpawnerMixin.gpu_profiles = settings["profiles"]
c.GPUSpawnerMixin.gpu_job_time_limit = 600
c.GPUSpawnerMixin.gpu_booking_grace = 2  # an unused window is released 2 seconds after it starts
configure(c)
"""


@pytest.fixture(scope="module")
def kube_hub(tmp_path_factory, kube_cluster):
    """A real JupyterHub with gpu-kube, as its ServiceAccount in a namespace of its own holding the recorded
    pods; ``ann`` logged in (``hub.ann``: her browser-like session)."""
    with namespace_of_its_own(kube_cluster) as namespace:
        load_pods(kube_cluster, namespace, load("pods.json"))
        hub = Hub(tmp_path_factory.mktemp("kube-bookings") / "hub",
                  {"KUBECONFIG": hub_account(kube_cluster, namespace)}, PROFILES)
        hub.settings.update(k8s=kube_cluster.server, namespace=namespace)
        hub.env["GPUSPAWNER_TEST_HUB"] = json.dumps(hub.settings)
        hub.config_file.write_text(KUBE_BOOKINGS_CONFIG)
        hub.start()
        try:
            hub.add_users("ann")
            hub.ann = login(hub, "ann")
            yield hub
        finally:
            hub.stop()


def as_ann(hub, method: str, path: str = "", **kwargs) -> requests.Response:
    """The bookings API as ann, from her logged-in session (cookie and XSRF token, as the page sends)."""
    xsrf = hub.ann.cookies.get("_xsrf", path="/hub/")
    return hub.ann.request(method, f"{hub.url}/hub/api/gpus/bookings{path}", timeout=90,
                           headers={"X-XSRFToken": xsrf, "Referer": hub.url + "/hub/gpus/bookings"}, **kwargs)


@pytest.mark.integration
def test_a_user_books_the_clusters_gpus_over_rest_and_a_bad_count_is_a_400(kube_hub):
    start_at = time.time() + 2 * HOUR
    r = as_ann(kube_hub, "POST", json={"model": "a100", "count": 2, "start": start_at, "end": start_at + HOUR})
    assert r.status_code == 201, r.text
    b = r.json()
    assert b["model"] == A100 and b["count"] == 2 and b["user"] == "ann" and b["status"] == "upcoming"
    assert b["holds"] == HOLDS_2
    listed = {x["id"]: x for x in as_ann(kube_hub, "GET").json()["bookings"]}
    assert listed[b["id"]]["holds"] == b["holds"]

    # more than the cluster has of the model (16 A100s), or no whole number: 400 naming the field, nothing booked
    for count, words in ((17, "count"), ("two", "count")):
        r = as_ann(kube_hub, "POST", json={"model": "a100", "count": count, "start": start_at, "end": start_at + HOUR})
        assert r.status_code == 400 and words in r.json()["message"], r.text
    assert {x["id"] for x in as_ann(kube_hub, "GET").json()["bookings"]} == set(listed)
    assert as_ann(kube_hub, "DELETE", f"/{b['id']}").status_code == 204


@pytest.mark.integration
def test_the_bookings_page_offers_the_clusters_models(kube_hub):
    page = kube_hub.ann.get(kube_hub.url + "/hub/gpus/bookings", timeout=90)
    assert page.status_code == 200, page.text
    assert f'<option value="{A100}" data-name="NVIDIA-A100-SXM4-80GB">NVIDIA-A100-SXM4-80GB (16)</option>' in page.text


def held_now(page: str, model: str) -> str:
    """What the bookings page's timeline says is held now of ``model``."""
    found = re.search(rf'data-model="{re.escape(model)}".*?data-field="held">(.*?)</span>', page, re.S)
    assert found, page
    return " ".join(found[1].split())


@pytest.mark.integration
def test_a_booked_users_job_on_the_cluster_keeps_her_window_and_the_page_shows_it_under_the_model(kube_hub):
    r = submit(kube_hub, "ann", {"profile": "gpu", "gpus": 1, "gpu_model": A100, "notebook": "train.ipynb"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    try:
        wait_state(kube_hub, "ann", job_id, ("running",))
        page = kube_hub.ann.get(kube_hub.url + "/hub/gpus/bookings", timeout=90).content.decode()
        assert held_now(page, A100) == f"held now: ann/job/{job_id} 1 · 16 in all"

        # two windows on since a minute ago (grace: 2 s): her job holds an A100, no MIG slice of hers
        now = time.time()
        ids = {}
        for model in (A100, MIG_1G):
            r = as_ann(kube_hub, "POST", json={"model": model, "count": 1, "start": now - 60, "end": now + HOUR})
            assert r.status_code == 201, r.text
            ids[model] = r.json()["id"]
        until(lambda: as_ann(kube_hub, "GET", f"/{ids[MIG_1G]}").json()["status"] == "released",
              "the unused MIG window is released")
        assert as_ann(kube_hub, "GET", f"/{ids[A100]}").json()["status"] == "active"  # in use: kept
    finally:
        kube_hub.api("DELETE", f"/users/ann/gpu-jobs/{job_id}")
    until(lambda: as_ann(kube_hub, "GET", f"/{ids[A100]}").json()["status"] == "released",
          "the A100 window is released once her job is gone")


@NEEDS_BROWSER[0]
@NEEDS_BROWSER[1]
@pytest.mark.integration
def test_the_bookings_page_books_the_clusters_a100s_and_says_what_that_holds_on_kubernetes(kube_hub, browser):
    expect = playwright_sync_api().expect
    page = hub_login(browser, kube_hub.url, "ann")
    page.goto(kube_hub.url + "/hub/gpus/bookings")
    page.select_option("#booking-model", A100)
    page.fill("#booking-count", "2")  # the page's window: the next full hour, for two hours
    page.click("#booking-submit")
    told = page.locator("#gpuspawner-booking-done")
    expect(told).to_contain_text(f"; it holds {HOLDS_2}.")
    booking = told.text_content().split()[1].rstrip(":")  # "Booked b-3f9a2c: 2 x ..."
    listed = page.locator(f"#gpuspawner-bookings-table tr[data-booking='{booking}']")
    expect(listed.locator("[data-field=gpus]")).to_have_text(f"2 x NVIDIA-A100-SXM4-80GB (holds {HOLDS_2})")
    listed.locator(".gs-cancel").click()
    expect(listed.locator("[data-field=status]")).to_have_text("cancelled")
