"""Who a gpu-local server runs as: account names, making accounts, and whether they can run the server."""

from __future__ import annotations

import os
import pwd
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from gpuspawner.accounts import (
    ANYONE,
    MARK,
    AccountError,
    account_name,
    check_prefix,
    ensure_account,
    interpreters,
    package_problem,
    unreachable,
)
from needs import missing

SYSTEM_NAME = re.compile(r"[a-z_][a-z0-9_-]*")  # what useradd takes by default, at most 32 long
PREFIXES = st.sampled_from(["jupyter-", "t1a2b3c-", "gpu_", "x"])


@settings(max_examples=300, deadline=None)
@given(names=st.lists(st.text(min_size=1, max_size=60).filter(lambda n: "/" not in n), min_size=2, max_size=6,
                      unique=True), prefix=PREFIXES)
def test_every_hub_user_gets_an_account_of_their_own_with_a_valid_name(names, prefix):
    accounts = [account_name(n, prefix) for n in names]
    assert len(set(accounts)) == len(accounts), "two hub users would share an account"
    for name, account in zip(names, accounts, strict=True):
        assert account.startswith(prefix) and len(account) <= 32 and SYSTEM_NAME.fullmatch(account), account
        if re.fullmatch(r"[a-z][a-z0-9_]*", name) and len(prefix + name) <= 32:
            assert account == prefix + name  # a plain name stays readable


def test_names_that_are_not_plain_are_escaped_and_prefixes_are_checked():
    assert account_name("ada", "jupyter-") == "jupyter-ada"
    assert account_name("root", "jupyter-") == "jupyter-root"  # never root itself
    assert re.fullmatch(r"jupyter-ada_lovelace-[0-9a-f]{8}", account_name("ada.lovelace", "jupyter-"))
    long = account_name("ada.lovelace@uni.edu", "jupyter-")  # cut to useradd's 32 characters
    assert re.fullmatch(r"jupyter-ada_lovelace_un-[0-9a-f]{8}", long) and len(long) == 32
    assert check_prefix("jupyter-") is None
    assert "empty" in check_prefix("") and "lowercase" in check_prefix("Jupyter-")
    assert "longer" in check_prefix("a" * 30)


def test_a_folder_only_root_may_enter_stops_every_other_user(tmp_path):
    private = tmp_path / "root-only"
    (private / "bin").mkdir(parents=True)
    python = private / "bin" / "python3"
    python.write_text("")
    python.chmod(0o755)
    private.chmod(0o700)
    open_dir = tmp_path / "venv" / "bin"
    open_dir.mkdir(parents=True)
    (tmp_path / "venv").chmod(0o755)
    link = open_dir / "python"
    link.symlink_to(python)  # a virtualenv's python pointing into the private folder
    tmp_path.chmod(0o711)
    reason = unreachable(link, *ANYONE)
    assert reason is not None and reason.startswith(f"{private} (mode 0700") and "may not be entered" in reason
    assert unreachable(link, os.geteuid(), os.getgroups()) is None  # its owner may
    private.chmod(0o711)
    assert unreachable(link, *ANYONE) is None
    script = open_dir / "tool"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o711)  # executable but not readable: its interpreter could not read it
    assert unreachable(script, *ANYONE) is None
    assert "not readable" in unreachable(script, *ANYONE, read=True)


def test_a_checkout_other_users_may_enter_but_not_list_cannot_give_them_gpuspawner(tmp_path):
    """An editable install in a ``mktemp -d`` checkout: Python lists the folder it imports from, so a
    checkout made only passable (0701) still hides gpuspawner from the servers' accounts."""
    checkout = tmp_path / "tmp.abc"
    package = checkout / "gpuspawner"
    package.mkdir(parents=True)
    tmp_path.chmod(0o755)
    checkout.chmod(0o701)
    problem = package_problem(*ANYONE, "accounts the hub makes", package)
    assert problem.startswith(f"servers run as accounts the hub makes, which cannot import gpuspawner from {checkout}: "
                              f"{checkout} (mode 0701) is not readable for it")
    assert "chmod o+rx" in problem
    checkout.chmod(0o705)
    assert package_problem(*ANYONE, "accounts the hub makes", package) is None
    assert package_problem(*ANYONE, "accounts the hub makes") is None  # this checkout, as scripts/setup leaves it


def test_the_chain_of_a_script_reaches_the_virtualenvs_base_interpreter(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /opt/base/bin\n")
    python = venv / "bin" / "python"
    python.symlink_to(sys.executable)
    tool = venv / "bin" / "jupyterhub-singleuser"
    tool.write_text(f"#!{python}\nprint()\n")
    tool.chmod(0o755)
    assert interpreters(tool) == [(tool, True), (python, False), (Path("/opt/base/bin"), False)]


@pytest.fixture
def prefix():
    if os.geteuid() != 0:
        missing("making system accounts needs root")
    prefix = "u" + secrets.token_hex(3) + "-"
    yield prefix
    for entry in pwd.getpwall():
        if entry.pw_name.startswith(prefix):
            subprocess.run(["userdel", "--remove", entry.pw_name], capture_output=True, timeout=60)


def test_an_account_is_made_once_with_a_private_home_and_never_taken_over(tmp_path, prefix):
    homes = tmp_path / "homes"
    entry = ensure_account("ada", prefix, homes)
    assert entry.pw_name == prefix + "ada" and entry.pw_uid != 0 and entry.pw_gecos == f"{MARK} ada"
    home = Path(entry.pw_dir)
    assert home.parent == homes and home.stat().st_uid == entry.pw_uid and oct(home.stat().st_mode & 0o777) == "0o700"
    assert ensure_account("ada", prefix, homes) == entry  # the second start finds it
    # an account of that name the hub did not make is someone else's: refused, not used
    subprocess.run(["useradd", "--no-create-home", prefix + "bob"], check=True, capture_output=True)
    with pytest.raises(AccountError, match=f"{prefix}bob exists but this hub did not make it"):
        ensure_account("bob", prefix, homes)
