"""What the spawn form shows: profiles, GPU models with live free/total, counts.

Free/total come from :mod:`gpuspawner.availability`, which says what they mean.

Pure: from the profiles, an inventory reading and the held GPU UUIDs to a
plain dict the Jinja2 template renders. No I/O here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from .availability import ModelAvailability, model_availability
from .bookings import ANY, Booking, held_windows, span
from .inventory import InventoryReading
from .profiles import OfferedImages, Profile, default_profile, without_gpus
from .refusals import amount, words


def _count_notes(
    profile: Profile, offered: list[ModelAvailability], largest: Mapping[str, int], host: str, unknown: bool,
) -> dict[str, dict[int, str]]:
    """Model slug (or "any") -> GPU count -> why that count is offered disabled ("" where it is not).

    A count more than any one host has of a model never fits here and says why; one that fits a
    host but not the free GPUs now is "not free now" (a wait would cure it).
    """
    most = {"any": max((m.most_on_one_host for m in offered), default=0)}
    most.update({m.slug: m.most_on_one_host for m in offered})
    names = {"any": "GPU"} | {m.slug: m.name for m in offered}
    notes: dict[str, dict[int, str]] = {}
    for slug, fits in largest.items():
        notes[slug] = {}
        for n in profile.gpu_counts:
            if unknown or n <= fits:
                note = ""
            elif n > most[slug]:
                note = words("form_never_fits", amount=amount(n, names[slug]), host=host, most=most[slug] or "none")
            else:
                note = words("form_not_free")
            notes[slug][n] = note
    return notes


#: how far ahead a booking shows on the spawn form's cards (seconds)
BOOKED_SOON = 24 * 3600.0


def booked_soon(bookings: Iterable[Booking], models: list[ModelAvailability], now: float,
                within: float = BOOKED_SOON) -> dict[str, str]:
    """Model slug (or "any") -> its bookings on now or starting within ``within``, in words, the
    nearest first: ``"2 of 8 booked 2026-11-27 10:00-12:00 UTC by group class-ml"``."""
    totals = {m.slug: m.total for m in models}
    totals[ANY] = sum(totals.values())
    found: dict[str, list[tuple[float, str]]] = {}
    for b in bookings:
        held = [(s, e) for s, e in held_windows(b, now, now + within) if e > now]  # released: ends earlier
        if held and b.model in totals:
            s, e = held[0]
            found.setdefault(b.model, []).append(
                (s, f"{b.count} of {totals[b.model]} booked {span(s, e)} by {b.holder}"))
    return {slug: "; ".join(words for _, words in sorted(found[slug])) for slug in found}


def _profile_context(
    profile: Profile, models: list[ModelAvailability], chosen: Mapping[str, Any], unknown: bool = False,
    waits: bool = False, offered_images: OfferedImages = None, default_image: str | None = None, host: str = "host",
    booked: Mapping[str, str] | None = None,
) -> dict:
    offered = [m for m in models if profile.allows_model(m.slug)]
    booked = booked or {}
    # the most GPUs one request may ask for: free on one host now, or (waits) on one host ever
    fits = (lambda m: m.most_on_one_host) if waits else (lambda m: m.largest)
    largest = {"any": max((fits(m) for m in offered), default=0)}
    largest.update({m.slug: fits(m) for m in offered})
    if unknown:  # nothing known: let every count through; the scheduler decides
        largest = dict.fromkeys(largest, profile.max_gpus)
    notes = _count_notes(profile, offered, largest, host, unknown)
    selected_model = chosen.get("gpu_model")
    if not isinstance(selected_model, str) or selected_model not in largest:
        selected_model = "any"
    selected_gpus = chosen.get("gpus")
    if type(selected_gpus) is not int or selected_gpus not in profile.gpu_counts:
        selected_gpus = profile.default_gpus
    if selected_gpus > largest[selected_model]:
        # not free now: preselect the largest GPU count that is; never switch to "no GPU" silently
        fits = [n for n in profile.gpu_counts if 0 < n <= largest[selected_model]]
        selected_gpus = max(fits, default=selected_gpus)
    counts = [
        {
            "value": n,
            "label": "no GPU" if n == 0 else f"{n} GPU" + ("s" if n > 1 else ""),
            "disabled": n > largest[selected_model],
            "note": notes[selected_model][n],
            "selected": n == selected_gpus,
        }
        for n in profile.gpu_counts
    ]
    # the profile's images, else the backend's (DockerSpawner shows its picker for two or more,
    # the one that is the spawner's configured image preselected)
    images, preselected = list(profile.images), None
    if not images and isinstance(offered_images, Mapping) and len(offered_images) > 1:
        images = list(offered_images)
        preselected = next((name for name, image in offered_images.items() if image == default_image), None)
    return {
        "profile": profile,
        # form field names (gpu-kube uses KubeSpawner's profile-option-<slug>--<name> instead)
        "fields": {key: f"{key}-{profile.slug}" for key in ("gpus", "gpu_model", "image")},
        "options": [],  # KubeSpawner profile_options (gpu-kube)
        "gpu_choice": profile.max_gpus > 0,
        "models": offered,
        # free/total of each model the profile can use, shown on its card without opening a menu
        "free_line": " \u00b7 ".join(m.card for m in offered),
        # the bookings of those models soon (:func:`booked_soon`), on the card too
        "booked_line": " \u00b7 ".join([f"{m.full_name}: {booked[m.slug]}" for m in offered if m.slug in booked]
                                        + ([f"Any model: {booked[ANY]}"] if ANY in booked and offered else [])),
        "notes": notes,
        "selected_model": selected_model,
        "largest": largest,
        "counts": counts,
        "images": images,
        "selected_image": chosen["image"] if chosen.get("image") in images else (
            preselected or (images[0] if images else None)),
    }


def form_context(
    profiles: tuple[Profile, ...],
    reading: InventoryReading,
    held: Collection[str],
    previous: Mapping[str, Any] | None = None,
    *,
    availability: list[ModelAvailability] | None = None,
    unknown: str | None = None,
    waits: bool = False,
    offered_images: OfferedImages = None,
    default_image: str | None = None,
    host: str = "host",
    bookings: Iterable[Booking] = (),
    now: float = 0.0,
    queue_estimates: Mapping[str, str] | None = None,
) -> dict:
    """Everything form.html needs. ``previous`` pre-selects the user's last choice.

    Backends that do not place exact GPUs themselves (Kubernetes) pass
    ``availability`` (free/total per model, computed their way) instead of GPUs
    in ``reading``, and ``unknown`` (why) when availability could not be read.
    ``waits``: a request that does not fit now waits in the backend's queue (Slurm),
    so only counts no host could ever hold are disabled.
    ``offered_images``: the images a profile without ``images`` offers (gpu-docker:
    DockerSpawner's ``allowed_images``; a picker when there are two or more, preselecting
    the one that is ``default_image``, the spawner's configured image, as DockerSpawner's does).
    ``host``: what one place GPUs are on is called here ("host", "node"), in the words that say
    a GPU count never fits ("needs 4 GPUs on one host; the largest here has 2").
    ``bookings``: the hub's GPU bookings; each card says those of its models on at ``now`` or
    soon (:func:`booked_soon`).
    ``queue_estimates``: profile slug -> when a request of that ``queue: true`` profile would
    likely start if queued now ("If you queue now: about 10:40 UTC, ..."), shown on its card.

    Where no GPU was found at all (``no_gpus``), only the profiles that run without a
    GPU are shown, each with no GPU preselected (:func:`~gpuspawner.profiles.without_gpus`),
    and ``cpu_only`` says so (False when every profile was one without GPUs anyway);
    ``gpus_needed``: no GPU was found and every profile needs one.
    """
    previous = previous or {}
    models = availability if availability is not None else model_availability(reading.gpus, held)
    no_gpus = not models and unknown is None if availability is not None else not reading.gpus
    shown = without_gpus(profiles) if no_gpus else profiles
    slugs = {p.slug for p in shown}
    last = previous.get("profile")
    remembered = isinstance(last, str) and last in slugs
    selected = last if remembered else default_profile(shown).slug
    booked = booked_soon(bookings, models, now)
    return {
        "profiles": [
            {**_profile_context(p, models, previous if remembered and p.slug == last else {}, unknown is not None,
                                waits, offered_images, default_image, host, booked),
             "queue_estimate": (queue_estimates or {}).get(p.slug, "")}
            for p in shown
        ],
        "selected_profile": selected,
        "simulated": reading.simulated,
        "problems": list(reading.problems),
        "no_gpus": no_gpus,
        "cpu_only": no_gpus and shown != profiles and any(p.max_gpus for p in profiles),
        "gpus_needed": no_gpus and all(p.max_gpus for p in shown),  # no profile here runs without one
        "availability_unknown": unknown,
    }


def has_choices(context: Mapping[str, Any]) -> bool:
    """Whether a form of ``context`` offers a choice or a note; without one the hub shows no form.

    Nothing to choose: one profile, without GPUs, images or options to pick (a
    CPU-only hub: as its parent spawner does, the hub then starts servers without asking).
    """
    if len(context["profiles"]) != 1 or context["cpu_only"]:
        return True
    (only,) = context["profiles"]
    return bool(only["gpu_choice"] or len(only["counts"]) > 1 or only["images"] or only["options"]
                or only.get("kueue"))
