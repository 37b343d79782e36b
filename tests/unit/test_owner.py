"""Owner: one parse and one format of the "user/server" and "user/job/ID" strings running hubs store."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gpuspawner.owner import Owner, OwnerError, user_of

# what JupyterHub lets through as user and server names: anything but "/" (and empty for a server)
_part = st.text(st.characters(blacklist_characters="/", blacklist_categories=("Cs",)), max_size=12)
users = _part.filter(bool)
servers = _part
job_ids = _part.filter(bool)
valid = st.one_of(
    st.builds(lambda u, s: f"{u}/{s}", users, servers.filter(lambda s: not s.startswith("job/"))),
    st.builds(lambda u, j: f"{u}/job/{j}", users, job_ids),
)


@settings(max_examples=200, deadline=None)
@given(valid)
def test_format_of_parse_is_the_stored_string_byte_for_byte(text):
    owner = Owner.parse(text)
    assert str(owner) == text
    assert str(owner).encode() == text.encode()
    assert Owner.parse(str(owner)) == owner
    assert user_of(text) == owner.user == text.split("/", 1)[0]  # what the hand splits read


@settings(max_examples=100, deadline=None)
@given(users, servers, job_ids)
def test_servers_and_jobs_never_collide(user, server, job):
    as_server, as_job = Owner.of_server(user, server), Owner.of_job(user, job)
    assert str(as_job) == f"{user}/job/{job}" and Owner.parse(str(as_job)).job == job
    assert str(as_server) == f"{user}/{server}" and Owner.parse(str(as_server)) == as_server
    assert not as_server.is_job and as_job.is_job and as_job.kind == "job" and as_server.kind == "server"
    assert as_server != as_job


@settings(max_examples=100, deadline=None)
@given(users, servers, job_ids, st.text("0123456789abcdef-", min_size=1, max_size=12))
def test_a_leftover_start_is_an_owner_of_the_same_user_apart_from_the_live_one(user, server, job, start):
    for live in (Owner.of_server(user, server), Owner.of_job(user, job)):
        leftover = live.leftover(start)
        assert Owner.parse(str(leftover)) == leftover  # every ledger reader can parse it
        assert user_of(str(leftover)) == user and leftover.kind == live.kind
        assert leftover != live and str(leftover).endswith(f"~stopping-{start}")


def test_the_forms_running_hubs_hold():
    assert Owner.parse("ann/") == Owner("ann") and Owner.parse("ann/").label == ""  # the default server
    assert Owner.parse("ann/big") == Owner.of_server("ann", "big")
    assert Owner.of_server("ann", None) == Owner("ann", "")  # JupyterHub's default server name in its database
    assert Owner.parse("ann/job") == Owner.of_server("ann", "job")  # a server called "job"
    job = Owner.parse("ann/job/7f3e")
    assert (job.user, job.job, job.label, job.kind) == ("ann", "7f3e", "job/7f3e", "job")
    assert Owner.from_parts("ann", "job/7f3e") == job and Owner.from_parts("ann", "") == Owner("ann")


@pytest.mark.parametrize(("text", "words"), [
    ("ann", "no '/'"),
    ("", "no '/'"),
    ("/big", "needs a user name"),
    ("/job/7f3e", "needs a user name"),
    ("ann/a/b", "a server name holds no '/'"),
    ("ann/job/", "one job id without '/'"),
    ("ann/job/7f/3e", "one job id without '/'"),
    (None, "is a string"),
    (42, "is a string"),
])
def test_bad_strings_are_refused_with_what_is_wrong(text, words):
    with pytest.raises(OwnerError, match=words) as caught:
        Owner.parse(text)
    assert isinstance(caught.value, ValueError)
    assert repr(text) in str(caught.value) or text in ("/big", "/job/7f3e")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=20))
def test_any_string_parses_to_one_that_formats_back_or_is_refused(text):
    try:
        owner = Owner.parse(text)
    except OwnerError:
        return
    assert str(owner) == text


def test_bad_parts_are_refused_when_built():
    with pytest.raises(OwnerError, match="user name must be a string without '/'"):
        Owner.of_server("a/b", "x")
    with pytest.raises(OwnerError, match="server name must be a string without '/'"):
        Owner.of_server("ann", "x/y")
    with pytest.raises(OwnerError, match="needs a user name"):
        Owner.of_job("", "7f")
    with pytest.raises(OwnerError, match="job id and no server name"):
        Owner("ann", "big", "7f")
    with pytest.raises(OwnerError, match="job id and no server name"):
        Owner.of_job("ann", "")
