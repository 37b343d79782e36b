"""Bookings held as Slurm advance reservations, end to end (issue 30): a real JupyterHub running gpu-slurm
on the session's real slurmctld 22.05 (one node: 2 A100s, 2 T4s; whole-node reservations only). A
booking made over REST is a reservation ``scontrol`` lists; one the cluster cannot hold is refused with
the sentence and leaves nothing; cancelling removes it; the hub's reconciliation (at start and on its
timer) removes stray reservations of its own and makes missing ones again, or says in the booking why not."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
import requests

from chromium import NEEDS_BROWSER, hub_login, playwright_sync_api
from gpuspawner.backends.slurm.booking import SlurmBookingKeeper, wanted, window_names
from gpuspawner.backends.slurm.reservations import Reservation, SlurmReservations, read_reservations
from gpuspawner.bookings import WEEK, Booking
from gpuspawner.hub.booking_keeper import reserve_then_save
from hub import login
from slurmhub import OVERVIEW_CONFIG, add_user, running_hub

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
sync_api = playwright_sync_api()

H = 3600
#: the booked user: a hub user whose name is an account of this host (Slurm checks ``Users=``)
WHO = "nobody"


@pytest.fixture(scope="module")
def hub(slurm_cluster, slurm_gpus, tmp_path_factory):
    # an unused window is released 2 seconds after it starts
    config = OVERVIEW_CONFIG + ('c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]\n'
                                'c.GPUSpawnerMixin.gpu_booking_grace = 2\n')
    with running_hub(tmp_path_factory.mktemp("slurm-bookings"), slurm_cluster, slurm_gpus, config) as hub:
        add_user(hub, WHO)
        hub.user_token = user_token(hub, WHO)
        yield hub


def user_token(hub, name: str) -> str:
    session = login(hub, name)
    r = session.post(f"{hub.url}/hub/api/users/{name}/tokens", json={"note": "bookings"},
                     headers={"X-XSRFToken": session.cookies.get("_xsrf", path="/hub/"),
                              "Referer": hub.url + "/hub/token"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def call(hub, method: str, path: str = "", **kwargs) -> requests.Response:
    """The bookings API as the booked user."""
    return requests.request(method, f"{hub.url}/hub/api/gpus/bookings{path}", timeout=90,
                            headers={"Authorization": f"token {hub.user_token}"}, **kwargs)


@pytest.fixture(autouse=True)
def no_reservation_left(hub, slurm_cluster):
    """Whatever a test leaves reserved (a failed one) is deleted: the node is every Slurm test's."""
    yield
    for name in [*listed(slurm_cluster, hub), "maintenance-x"]:
        slurm_cluster.run("scontrol", "delete", f"ReservationName={name}", check=False)


def prefix(hub) -> str:
    return f"jupyterhub-{hub.settings['hub_id']}"


def listed(cluster, hub) -> dict[str, Reservation]:
    """This hub's reservations as ``scontrol show reservation -o`` lists them, by name."""
    out = read_reservations(cluster.run("scontrol", "show", "reservation", "-o").stdout)
    return {r.name: r for r in out if r.booking_id(prefix(hub)) is not None}


def book(hub, count: int, start: float, hours: float = 1, **more) -> requests.Response:
    return call(hub, "POST", json={"model": "a100", "count": count, "start": start, "end": start + hours * H, **more})


def bookings(hub) -> dict[str, dict]:
    r = call(hub, "GET")
    assert r.status_code == 200, r.text
    return {b["id"]: b for b in r.json()["bookings"]}


def wait_until(check, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"not seen within {timeout:g}s: {what}")


def test_a_booking_made_over_rest_is_a_slurm_reservation_until_cancelled(hub, slurm_cluster):
    start = time.time() + 2 * H
    r = book(hub, 2, start, note="deadline run")
    assert r.status_code == 201, r.text
    b = r.json()
    # the model as Slurm's GRES type offers it (the form's), not the hub host's NVML name (a100-sxm4-80gb)
    assert (b["model"], b["holds"]) == ("a100", f"whole node {slurm_cluster.host} (2 GPUs)")
    name = f"{prefix(hub)}-{b['id']}-0"
    reservation = listed(slurm_cluster, hub)[name]
    assert (reservation.users, reservation.nodes, reservation.end - reservation.start) == (
        (WHO,), (slurm_cluster.host,), H)
    assert abs(reservation.start - start) < 1
    assert bookings(hub)[b["id"]]["holds"] == f"whole node {slurm_cluster.host} (2 GPUs)"
    assert call(hub, "DELETE", f"/{b['id']}").status_code == 204
    assert name not in listed(slurm_cluster, hub)
    after = bookings(hub)[b["id"]]
    assert (after["status"], after["holds"]) == ("cancelled", "")


def test_a_booking_slurm_cannot_hold_is_refused_with_the_sentence_and_leaves_nothing(hub, slurm_cluster):
    before = set(bookings(hub))
    r = book(hub, 1, time.time() + 3 * H)  # one A100: the cluster has 2, but Slurm 22.05 reserves whole nodes
    assert r.status_code == 400, r.text
    assert r.json()["message"] == ("This Slurm cluster (Slurm 22.05) reserves whole nodes only, and no set of "
                                   "whole a100 nodes has exactly 1 GPUs: book 2 GPUs instead.")
    assert set(bookings(hub)) == before
    assert listed(slurm_cluster, hub) == {}


def test_a_booking_slurm_refuses_is_refused_with_slurms_words_and_leaves_nothing(hub, slurm_cluster):
    """A job whose time limit reaches into the window runs on the node: Slurm will not reserve it."""
    job = slurm_cluster.run("sbatch", "--parsable", "--gres=gpu:t4:1", "--time=10:00:00", "--output=/dev/null",
                            "--chdir=/tmp", "--wrap=sleep 300").stdout.strip()
    try:
        wait_until(lambda: slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING",
                   f"job {job} running")
        before = set(bookings(hub))
        r = book(hub, 2, time.time() + H)
        assert r.status_code == 400, r.text
        assert r.json()["message"].startswith("Slurm refused the reservation for booking b-"), r.text
        assert r.json()["message"].endswith(": Requested nodes are busy"), r.text
        assert set(bookings(hub)) == before
        assert listed(slurm_cluster, hub) == {}
    finally:
        slurm_cluster.run("scancel", job, check=False)


def test_the_hub_removes_its_stray_reservations_at_restart_and_makes_missing_ones_again(hub, slurm_cluster):
    r = book(hub, 2, time.time() + 4 * H, repeat_weeks=2)
    assert r.status_code == 201, r.text
    kept = r.json()["id"]
    names = {f"{prefix(hub)}-{kept}-{n}" for n in (0, 1)}
    assert names <= set(listed(slurm_cluster, hub))
    hub.stop()
    slurm = SlurmReservations(prefix(hub), env=slurm_cluster.env)
    try:
        # a hub killed between reserving a booking and saving it leaves a reservation no booking names
        at = time.time() + 6 * H
        slurm.reserve(Booking(id="b-never", user=WHO, booked_by=WHO, model="a100", count=2, start=at, end=at + H))
        # and one of the kept booking's reservations is deleted behind the hub's back
        slurm_cluster.run("scontrol", "delete", f"ReservationName={prefix(hub)}-{kept}-1")
        assert set(listed(slurm_cluster, hub)) == {f"{prefix(hub)}-b-never-0", f"{prefix(hub)}-{kept}-0"}
    finally:
        hub.start()
    wait_until(lambda: set(listed(slurm_cluster, hub)) == names, f"only {sorted(names)} listed")
    assert "removing Slurm reservation " + f"{prefix(hub)}-b-never-0" in hub.log_path.read_text()
    assert call(hub, "DELETE", f"/{kept}").status_code == 204
    assert listed(slurm_cluster, hub) == {}


def test_a_live_booking_slurm_cannot_hold_again_says_so_in_its_note_until_it_is_held(hub, slurm_cluster):
    r = book(hub, 2, time.time() + 8 * H, note="class")
    assert r.status_code == 201, r.text
    b = r.json()
    name = f"{prefix(hub)}-{b['id']}-0"
    # someone else reserves the node then, after the hub's reservation went away
    slurm_cluster.run("scontrol", "delete", f"ReservationName={name}")
    slurm_cluster.run("scontrol", "create", "reservation", "ReservationName=maintenance-x", "StartTime=now+7hours",
                      "Duration=180", "Users=root", f"Nodes={slurm_cluster.host}")
    try:
        note = wait_until(lambda: bookings(hub)[b["id"]]["note"] != "class" and bookings(hub)[b["id"]]["note"],
                          "the booking's note saying it is not held")
        assert note.startswith("class [not held by the cluster since ")
        assert note.endswith(": Every a100 node of this Slurm cluster is already reserved then "
                             "(maintenance-x): pick another time.]")
        assert bookings(hub)[b["id"]]["holds"] == ""
    finally:
        slurm_cluster.run("scontrol", "delete", "ReservationName=maintenance-x", check=False)
    wait_until(lambda: bookings(hub)[b["id"]]["note"] == "class", "the note as booked once it is held again")
    assert name in listed(slurm_cluster, hub)
    assert call(hub, "DELETE", f"/{b['id']}").status_code == 204


@NEEDS_BROWSER[0]
@NEEDS_BROWSER[1]
def test_the_bookings_page_books_and_says_what_the_booking_holds_on_slurm(hub, slurm_cluster, browser):
    page = hub_login(browser, hub.url, WHO)
    page.goto(hub.url + "/hub/gpus/bookings")
    page.select_option("#booking-model", "a100")
    page.fill("#booking-count", "2")  # start and end: the next full hour, for two hours
    page.click("#booking-submit")
    holds = f"whole node {slurm_cluster.host} (2 GPUs)"
    done = page.locator("#gpuspawner-booking-done")
    sync_api.expect(done).to_contain_text(f"; it holds {holds}.")
    booking = done.text_content().split()[1].rstrip(":")  # "Booked b-3f9a2c: 2 x ..."
    row = page.locator(f"#gpuspawner-bookings-table tr[data-booking='{booking}']")
    sync_api.expect(row.locator("[data-field=gpus]")).to_have_text(f"2 x A100 (gpu:a100) (holds {holds})")
    assert f"{prefix(hub)}-{booking}-0" in listed(slurm_cluster, hub)
    row.locator(".gs-cancel").click()
    sync_api.expect(row.locator("[data-field=status]")).to_have_text("cancelled")
    assert listed(slurm_cluster, hub) == {}


def test_a_window_released_unused_frees_the_node_in_slurm_and_later_windows_stay_reserved(hub, slurm_cluster):
    r = book(hub, 2, time.time(), hours=0.25, repeat_weeks=2)
    assert r.status_code == 201, r.text
    b = r.json()
    now, later = f"{prefix(hub)}-{b['id']}-0", f"{prefix(hub)}-{b['id']}-1"
    assert listed(slurm_cluster, hub)[now].state == "ACTIVE" and later in listed(slurm_cluster, hub)
    wait_until(lambda: bookings(hub)[b["id"]]["state"] == "released", "the unused window released")
    wait_until(lambda: now not in listed(slurm_cluster, hub), f"{now} removed")
    assert later in listed(slurm_cluster, hub)
    assert call(hub, "DELETE", f"/{b['id']}").status_code == 204
    assert listed(slurm_cluster, hub) == {}


def test_a_booking_whose_save_fails_leaves_no_reservation(slurm_cluster, monkeypatch):
    """The row is committed only after the reservation exists; where the commit fails, it is removed."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    keeper = SlurmBookingKeeper("jupyterhub-savefails")
    start = time.time() + 10 * H
    b = Booking(id="b-nosave", user=WHO, booked_by=WHO, model="a100", count=2, start=start, end=start + H)
    saved = []

    def save(booking: Booking) -> Booking:
        saved.append([r.name for r in read_reservations(slurm_cluster.run("scontrol", "show", "reservation",
                                                                           "-o").stdout)])
        raise OSError("database is locked")

    with pytest.raises(OSError):
        asyncio.run(reserve_then_save(keeper, b, save))
    assert saved == [["jupyterhub-savefails-b-nosave-0"]]  # reserved before the save was tried
    assert "jupyterhub-savefails" not in slurm_cluster.run("scontrol", "show", "reservation", "-o").stdout


def test_which_reservations_a_live_booking_wants():
    b = Booking(id="b-1", user="ada", booked_by="ada", model="a100", count=2, start=1000.0, end=1000.0 + H,
                repeat_weeks=3)
    now = 1000.0 + WEEK + 10  # its second window is on
    assert window_names(b, "p", now) == {"p-b-1-1", "p-b-1-2"}
    assert [wanted(b, Reservation(f"p-b-1-{n}", 0, 1), "p", now) for n in range(4)] == [False, True, True, False]
    released = replace(b, state="released", released_at=now)
    assert window_names(released, "p", now) == {"p-b-1-2"}
    assert not wanted(b, Reservation("p-b-10-1", 0, 1), "p", now)

