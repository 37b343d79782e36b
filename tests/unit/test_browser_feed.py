"""The ``browser`` channel's feed (gpuspawner.hub.browser_feed): each user's own recent notifications,
bounded, with ids that only grow; the ``since`` argument; the ready event's GPUs in words."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st
from traitlets.config import Config

from gpuspawner.gpu import GPU
from gpuspawner.hub.browser_feed import BrowserFeed, gpu_words, parse_since, ready_event_gpus
from gpuspawner.hub.setup import configure


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_user_reads_only_their_own_oldest_first_the_last_kept_and_what_is_new_since():
    clock = Clock()
    feed = BrowserFeed(keep=3, clock=clock)
    asyncio.run(feed.send("ada", "job", "Job 3 ended", "done", None))
    asyncio.run(feed.send("bob", "job", "Job 4 ended", "failed", "http://hub/x"))
    for n in range(3):
        feed.add("ada", "cull", f"cull {n}", "text")
    ada = feed.read("ada")
    assert [i["title"] for i in ada["items"]] == ["cull 0", "cull 1", "cull 2"]  # the oldest fell out
    assert [i["title"] for i in feed.read("bob")["items"]] == ["Job 4 ended"]
    assert feed.read("carol") == {"items": [], "last": 0}
    assert feed.read("ada", since=ada["items"][1]["id"])["items"] == [ada["items"][2]]
    assert feed.read("ada", since=ada["last"]) == {"items": [], "last": ada["last"]}


def test_ids_grow_with_time_and_never_repeat_and_old_items_are_no_news():
    clock = Clock()
    feed = BrowserFeed(max_age=3600, clock=clock)
    ids = [feed.add("ada", "job", "t", "x")["id"] for _ in range(3)]
    assert ids == sorted(set(ids)) and ids[0] == int(clock.now * 1000)
    clock.now += 3601
    assert feed.read("ada", since=0)["items"] == []
    restarted = BrowserFeed(clock=clock)  # a restarted hub: a page's since stays below the new ids
    assert restarted.add("ada", "job", "t", "x")["id"] > ids[-1]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=25))
def test_since_is_absent_or_a_whole_number(raw):
    if raw == "":
        assert parse_since(raw) is None
    elif raw.isascii() and raw.isdigit() and len(raw) <= 18:
        assert parse_since(raw) == int(raw)
    else:
        with pytest.raises(ValueError, match="since must be the id of a notification"):
            parse_since(raw)


def _gpu(index: int, name: str) -> GPU:
    return GPU(host="h", index=index, uuid=f"GPU-{index}", name=name)


def test_the_ready_event_names_the_servers_gpus():
    held = SimpleNamespace(gpu_allocation=(_gpu(0, "Tesla T4"), _gpu(1, "NVIDIA A100"), _gpu(2, "NVIDIA A100")))
    assert gpu_words(held) == "2 x NVIDIA A100, 1 x Tesla T4"
    asked = SimpleNamespace(gpu_allocation=(), gpu_choice=SimpleNamespace(gpus=2, gpu_model="a100"))
    assert gpu_words(asked) == "2 x a100"
    cpu = SimpleNamespace(gpu_allocation=(), gpu_choice=SimpleNamespace(gpus=0, gpu_model="any"))
    event = {"ready": True, "message": "Server ready at /user/ada/"}
    assert asyncio.run(ready_event_gpus(cpu, event)) == {**event, "gpus": "no GPU"}
    assert asyncio.run(ready_event_gpus(SimpleNamespace(), event)) == event  # not gpuspawner's spawner


def test_configure_names_the_gpus_in_the_ready_event_unless_the_site_has_its_own_hook():
    c = Config()
    configure(c)
    assert c.Spawner.progress_ready_hook is ready_event_gpus
    own = Config()
    own.Spawner.progress_ready_hook = print
    configure(own)
    assert own.Spawner.progress_ready_hook is print
