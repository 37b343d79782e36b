"""How long ``scripts/hub`` takes to stop, and what it leaves behind.

Starts the runnable default (``jupyterhub_config.py``, local servers on the
simulated GPUs) on free loopback ports with a private state directory, waits
until it answers, optionally starts single-user servers, then stops it in one
of two ways an operator does:

- ``term``: SIGTERM to the hub, started as a background job of a script
  (``scripts/hub &``), which runs it with SIGINT ignored, as shells do;
- ``ctrl-c``: Ctrl-C typed into the terminal the hub runs in (a pseudo-terminal
  here; the terminal sends SIGINT to its foreground process group).

It prints, per process the hub started (proxy, culler, servers), how long it
lived after the signal, and when the last one was gone. Leftovers are killed
by pid after ``--wait`` seconds and reported. ::

    scripts/bench hub_stop --servers 1
    scripts/bench hub_stop --how ctrl-c --servers 1
    scripts/bench hub_stop --direct    # skip scripts/setup (see below)

``--direct`` runs what ``scripts/hub`` execs after ``scripts/setup``
(``.venv/bin/jupyterhub -f jupyterhub_config.py``, same process, same signals),
for a checkout whose setup would reinstall (a worktree sharing another's .venv).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pwd
import secrets
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import requests

from gpuspawner.ports import free_port

REPO = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def name(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    for key, label in (("configurable-http-proxy", "proxy"), ("gpuspawner.hub.culler", "culler"),
                       ("jupyterhub-singleuser", "server")):
        if key in text:
            return label
    return text[:60]


def start_hub(how: str, direct: bool, env: dict, log_path: Path) -> tuple[subprocess.Popen, int | None]:
    """The hub's process, and for ``ctrl-c`` the pseudo-terminal's master end (output goes to the log)."""
    command = [str(REPO / ".venv/bin/jupyterhub"), "-f", "jupyterhub_config.py"] if direct else ["bash", "scripts/hub"]
    # (preexec_fn is safe here: this process has no other thread yet)
    if how == "term":
        def background_job() -> None:  # what `scripts/hub &` in a non-interactive shell gets
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGQUIT, signal.SIG_IGN)

        with open(log_path, "ab") as log:
            proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=background_job)
        return proc, None
    master, slave = os.openpty()

    def terminal_session() -> None:  # the hub leads a session whose controlling terminal is the pty
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=terminal_session)
    os.close(slave)

    def drain() -> None:  # until the master end is closed
        with open(log_path, "ab") as log:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    return
                if not data:
                    return
                log.write(data)
                log.flush()

    threading.Thread(target=drain, daemon=True).start()
    return proc, master


def wait_until_answers(proc: subprocess.Popen, url: str, log_path: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the hub exited with {proc.returncode}; see {log_path}")
        try:
            if requests.get(url + "/hub/api/", timeout=2).ok:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the hub did not answer; see {log_path}")
        time.sleep(0.3)


def login(url: str, user: str, password: str) -> requests.Session:
    web = requests.Session()
    web.get(url + "/hub/login", timeout=30)
    r = web.post(url + "/hub/login", data={"username": user, "password": password,
                                           "_xsrf": web.cookies.get("_xsrf", "")}, timeout=60)
    r.raise_for_status()
    return web


def start_server(url: str, user: str, password: str, timeout: float = 120) -> None:
    web = login(url, user, password)
    headers = {"X-XSRFToken": web.cookies.get("_xsrf", "")}
    r = web.post(f"{url}/hub/api/users/{user}/server", json={"profile": "gpu", "gpus": 1, "gpu_model": "any"},
                 headers=headers, timeout=120)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = web.get(f"{url}/hub/api/users/{user}", headers=headers, timeout=30).json()["servers"].get("")
        if server and server.get("ready"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{user}'s server did not start")


def stop_and_watch(proc: subprocess.Popen, terminal: int | None, started: list[int], wait: float,
                   ) -> tuple[float | None, dict[int, float]]:
    """Stop the hub; return when the hub, and each of ``started``, was gone (seconds after the signal)."""
    t0 = time.monotonic()
    if terminal is None:
        proc.send_signal(signal.SIGTERM)
    else:
        os.write(terminal, b"\x03")
    gone: dict[int, float] = {}
    hub_gone = None
    while time.monotonic() - t0 < wait:
        if hub_gone is None and proc.poll() is not None:
            hub_gone = time.monotonic() - t0
        for pid in started:
            if pid not in gone and not alive(pid):
                gone[pid] = time.monotonic() - t0
        if hub_gone is not None and len(gone) == len(started):
            break
        time.sleep(0.05)
    return hub_gone, gone


def run(how: str, servers: int, direct: bool, wait: float) -> None:
    state = Path(tempfile.mkdtemp(prefix="hub-stop-"))
    state.chmod(0o711)  # the servers' accounts reach their homes in it (the database stays 0600)
    prefix = "b" + secrets.token_hex(3) + "-"  # this run's accounts, deleted at the end
    url = f"http://127.0.0.1:{free_port()}"
    password = "bench"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    env.update({
        "GPUSPAWNER_BACKEND": "local", "GPUSPAWNER_STATE_DIR": str(state), "GPUSPAWNER_PASSWORD": password,
        "GPUSPAWNER_BIND_URL": url, "GPUSPAWNER_HUB_BIND_URL": f"http://127.0.0.1:{free_port()}",
        "GPUSPAWNER_PROXY_API_URL": f"http://127.0.0.1:{free_port()}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        "GPUSPAWNER_ACCOUNT_PREFIX": prefix,
    })
    log_path = state / "hub.log"
    proc, terminal = start_hub(how, direct, env, log_path)
    started: list[int] = []
    try:
        wait_until_answers(proc, url, log_path)
        for n in range(servers):
            start_server(url, f"user{n}", password)
        time.sleep(1)  # let the culler finish its first round
        started = descendants(proc.pid)
        labels = {pid: name(pid) for pid in started}
        hub_gone, gone = stop_and_watch(proc, terminal, started, wait)
        print(f"stop by {how}, {servers} server(s), {'jupyterhub directly' if direct else 'scripts/hub'}:")
        print(f"  hub                gone after {hub_gone:6.2f} s" if hub_gone is not None
              else f"  hub                STILL RUNNING after {wait:g} s")
        for pid in started:
            print(f"  {labels[pid]:<10} {pid:>7} " + (f"gone after {gone[pid]:6.2f} s" if pid in gone
                                                      else f"STILL RUNNING after {wait:g} s"))
        if hub_gone is not None and len(gone) == len(started):
            print(f"  everything gone after {max([hub_gone, *gone.values()]):.2f} s")
    finally:
        if proc.poll() is None:
            started = sorted(set(started) | set(descendants(proc.pid)))
            proc.kill()
            proc.wait()
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if terminal is not None:
            os.close(terminal)
        for account in [e.pw_name for e in pwd.getpwall() if e.pw_name.startswith(prefix)]:
            subprocess.run(["userdel", "--remove", account], capture_output=True, timeout=60)
        print(f"  log: {log_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--how", choices=["term", "ctrl-c"], default="term", help="how the hub is stopped")
    parser.add_argument("--servers", type=int, default=0, help="single-user servers to start before stopping")
    parser.add_argument("--direct", action="store_true", help="run jupyterhub as scripts/hub does, without setup")
    parser.add_argument("--wait", type=float, default=60, help="seconds to wait for everything to end")
    args = parser.parse_args()
    run(args.how, args.servers, args.direct, args.wait)


if __name__ == "__main__":
    sys.exit(main())
