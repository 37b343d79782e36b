"""The spawn form's cards say which of their models' GPUs are booked soon, and for whom."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from test_form import A100, HELD, PROFILES, READING, T4, render

from gpuspawner.bookings import Booking
from gpuspawner.form import booked_soon, form_context

NOW = datetime(2026, 11, 26, 8, 0, tzinfo=timezone.utc).timestamp()
HOUR = 3600.0


def booking(model: str, count: int, start: float, hours: float = 2, **kw) -> Booking:
    fields = {"id": f"b-{model}{count}", "booked_by": "admin", "model": model, "count": count, "start": start,
              "end": start + hours * HOUR, "group": "class-ml"} | kw
    return Booking(**fields)


def card(html: str, slug: str) -> str:
    found = re.search(rf'data-profile="{slug}".*?(?=data-profile=|$)', html, re.S)
    return found.group(0)


def test_bookings_soon_are_on_the_cards_of_the_profiles_that_offer_their_model():
    bookings = [
        booking(A100, 2, NOW + 2 * HOUR),  # 10:00-12:00 today
        booking(A100, 1, NOW + 5 * HOUR, user="bob", group=""),
        booking(T4, 1, NOW + 30 * HOUR),  # tomorrow afternoon: not soon
        booking(T4, 1, NOW - HOUR, state="cancelled"),  # holds nothing
    ]
    context = form_context(PROFILES, READING, HELD, bookings=bookings, now=NOW)
    html = render(context)
    gpu_card = card(html, "gpu")
    assert ('<div class="gs-note gs-booked">Booked: NVIDIA A100-SXM4-80GB: 2 of 5 booked 2026-11-26 10:00-12:00 '
            'UTC by group class-ml; 1 of 5 booked 2026-11-26 13:00-15:00 UTC by bob</div>') in gpu_card
    assert "Tesla T4: " not in re.search(r"gs-booked\">(.*?)</div>", gpu_card).group(1)
    assert "gs-booked" not in card(html, "hopper")  # no A100 offered there
    assert "gs-booked" not in card(html, "cpu")
    assert "gs-booked" not in render(form_context(PROFILES, READING, HELD))  # no bookings: no line


def test_a_window_on_now_counts_and_an_any_model_booking_names_all_gpus():
    models = form_context(PROFILES, READING, HELD)["profiles"][1]["models"]  # in service: 5 A100s, 1 T4
    on_now = booking(T4, 1, NOW - HOUR, user="ada", group="")
    released = booking(A100, 2, NOW - HOUR, state="released", released_at=NOW - HOUR / 2)
    any_model = booking("any", 3, NOW + HOUR, hours=1)
    assert booked_soon([on_now, released, any_model], models, NOW) == {
        T4: "1 of 1 booked 2026-11-26 07:00-09:00 UTC by ada",
        "any": "3 of 6 booked 2026-11-26 09:00-10:00 UTC by group class-ml",
    }
    html = render(form_context(PROFILES, READING, HELD, bookings=[any_model], now=NOW))
    assert "Booked: Any model: 3 of 6 booked" in card(html, "gpu")
