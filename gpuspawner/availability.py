"""Free/total per GPU model: the one count the form, refusals, the admin overview and gpu-kube show.

What "1 of 2 free" means, everywhere:

- **total**: the GPUs of that model *in service*, held or not: healthy GPUs (on
  Kubernetes: what Ready, uncordoned nodes advertise). A user reading "1 of 2
  free" takes the other one to be in someone's hands and due back, so a GPU
  that is out of service is not part of it;
- **free**: the GPUs in service that nobody holds;
- **unavailable**: the GPUs of that model out of service (unhealthy, or on a
  node that is not Ready or is cordoned), said apart: "1 more is unavailable";
- **largest**: the most free GPUs of that model on one host or node, the
  biggest request that fits now;
- **most_on_one_host**: the most GPUs of that model on one host or node, in
  service or not, the biggest request that could ever fit.

Pure: :class:`Tally` adds up any source (GPU records, Kubernetes node pools);
:func:`model_availability` does it for GPU records and held UUIDs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Set as AbstractSet
from dataclasses import dataclass, replace

from .gpu import GPU, model_slug, per_gpus

__all__ = ["ModelAvailability", "Tally", "by_model", "model_availability"]


@dataclass(frozen=True)
class ModelAvailability:
    """Free/total of one GPU model; see the module docstring for what each count means."""

    slug: str
    name: str
    free: int
    total: int
    largest: int = 0
    unavailable: int = 0
    most_on_one_host: int = 0
    note: str = ""  # e.g. "shared, no memory isolation"
    known: bool = True  # False: the counts could not be read just now

    @property
    def label(self) -> str:
        """How the spawn form's model menu names this model: ``"Tesla T4 - 1 of 2 free"``."""
        return f"{self.full_name} - {self.counts}"

    @property
    def card(self) -> str:
        """How a profile card of the spawn form names it, beside the others: ``"Tesla T4: 1 of 2 free"``,
        ``"Tesla T4: 1 of 1 free, 1 Tesla T4 out of service"``."""
        if self.known and self.unavailable:
            now = f"{self.free} of {self.total} free" if self.total else "none usable"
            return f"{self.full_name}: {now}, {self.unavailable} {self.name} out of service"
        return f"{self.full_name}: {self.counts}"

    @property
    def full_name(self) -> str:
        return f"{self.name} ({self.note})" if self.note else self.name

    @property
    def counts(self) -> str:
        """``"1 of 2 free"``, ``"1 of 2 free, 1 more unavailable"``, ``"availability unknown"``."""
        if not self.known:
            return "availability unknown"
        if self.total == 0 and self.unavailable:
            return f"none usable: {self.unavailable} of {self.unavailable} unavailable"
        more = f", {self.unavailable} more unavailable" if self.unavailable else ""
        return f"{self.free} of {self.total} free{more}"


class Tally:
    """Adds GPUs up per model, then gives each model's :class:`ModelAvailability`."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._free: Counter[str] = Counter()
        self._total: Counter[str] = Counter()
        self._unavailable: Counter[str] = Counter()
        self._free_at: Counter[tuple[str, str]] = Counter()
        self._all_at: Counter[tuple[str, str]] = Counter()

    def add(self, slug: str, name: str, where: str, count: int = 1, free: int = 0, in_service: bool = True) -> None:
        """``count`` GPUs of model ``slug`` on host (or node) ``where``, ``free`` of them free.

        GPUs out of service count as unavailable, never as free nor in the
        total. When spellings of one slug differ, the alphabetically first
        name is kept, so the result does not depend on the order of adding.
        """
        known = self._names.get(slug)
        if known is None or name < known:
            self._names[slug] = name
        self._all_at[(slug, where)] += count
        if in_service:
            self._total[slug] += count
            self._free[slug] += free
            self._free_at[(slug, where)] += free
        else:
            self._unavailable[slug] += count

    def models(self) -> dict[str, ModelAvailability]:
        """Slug -> availability, sorted by slug; a model with nothing in service is still there."""
        largest: Counter[str] = Counter()
        most: Counter[str] = Counter()
        for per_place, best in ((self._free_at, largest), (self._all_at, most)):
            for (slug, _where), n in per_place.items():
                best[slug] = max(best[slug], n)
        return {
            slug: ModelAvailability(
                slug, self._names[slug], self._free[slug], self._total[slug], largest[slug],
                self._unavailable[slug], most[slug],
            )
            for slug in sorted(self._names)
        }


_Place = tuple[str, str]  # (model slug, host)


class _Groups:
    """The counts of GPU records with nothing held, tallied once (one add per (name, host, in service)
    group, not per GPU: 10,000 GPUs on 1,250 hosts, 8x fewer), and where each UUID in service is: a
    count for what is held takes the held GPUs off their places, so that it costs the GPUs held, not
    every GPU."""

    def __init__(self, gpus: Iterable[GPU]) -> None:
        counts: Counter[tuple[str, str, bool]] = Counter()
        self.places: dict[str, list[_Place]] = {}  # uuid -> the places of its records in service
        for gpu in gpus:
            counts[(gpu.name, gpu.host, gpu.healthy)] += 1
            if gpu.healthy:
                self.places.setdefault(gpu.uuid, []).append((model_slug(gpu.name), gpu.host))
        tally = Tally()
        self.free_at: Counter[_Place] = Counter()  # GPUs in service per place, nothing held
        for (name, host, healthy), count in counts.items():
            tally.add(model_slug(name), name, host, count, count if healthy else 0, in_service=healthy)
            if healthy:
                self.free_at[(model_slug(name), host)] += count
        self.none_held = tally.models()
        self.most_free: dict[str, list[tuple[int, str]]] = {}  # slug -> (GPUs in service, host), most first
        for (slug, host), count in self.free_at.items():
            self.most_free.setdefault(slug, []).append((count, host))
        for places in self.most_free.values():
            places.sort(reverse=True)

    def models(self, held: AbstractSet[str]) -> dict[str, ModelAvailability]:
        taken: Counter[_Place] = Counter()
        for uuid in held if len(held) < len(self.places) else self.places.keys() & held:
            for place in self.places.get(uuid, ()):
                taken[place] += 1
        per_model: Counter[str] = Counter()
        for (slug, _), count in taken.items():
            per_model[slug] += count
        return {slug: replace(counts, free=counts.free - per_model[slug], largest=self._largest(slug, taken))
                if slug in per_model else counts for slug, counts in self.none_held.items()}

    def _largest(self, slug: str, taken: Counter[_Place]) -> int:
        """The most free GPUs of ``slug`` on one host, ``taken`` held off their places."""
        best = max((self.free_at[place] - count for place, count in taken.items() if place[0] == slug), default=0)
        for free, host in self.most_free.get(slug, ()):
            if free <= best:
                break
            if (slug, host) not in taken:
                return free
        return best


def by_model(gpus: Iterable[GPU], held: Collection[str]) -> dict[str, ModelAvailability]:
    """Slug -> availability of GPU records, given the UUIDs held (UUIDs not in ``gpus`` are ignored)."""
    return per_gpus(gpus, _Groups, _Groups).models(held if isinstance(held, AbstractSet) else frozenset(held))


def model_availability(gpus: Iterable[GPU], held: Collection[str]) -> list[ModelAvailability]:
    """:func:`by_model` as a list in the order people read it (by name)."""
    return sorted(by_model(gpus, held).values(), key=lambda a: (a.name, a.slug))
