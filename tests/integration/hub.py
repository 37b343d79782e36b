"""A real JupyterHub process for integration tests, on loopback, stopped by pid.

Its servers run as gpu-local does in the runnable default: each user's as a system
account the hub makes on their first start (``create_system_users``), never as root.
The accounts of one Hub share a prefix of their own (``t1a2b3c-ada``), so that test
runs side by side never share one; :meth:`Hub.close` deletes them. The hub's folder
(database, cookie secret, log) is the hub's alone; the accounts' homes and the
servers' start script lie beside it, in ``<folder>-servers``.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import requests

from gpuspawner.ports import free_port

VENV_BIN = Path(sys.executable).parent


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def passable(path: Path) -> Path:
    """Let every user pass through ``path`` and the folders above it that this user owns, up to the test
    session's temporary folder (mode +x: entered, not listed): servers run as other accounts and must
    reach what tests write for them (tests/conftest.py says where the session's folders are)."""
    path = Path(path)
    for folder in [path, *path.parents]:
        if folder.name.startswith("gpuspawner-tests-") or folder == folder.parent:
            break
        info = folder.stat()
        if info.st_uid == os.geteuid():
            folder.chmod(info.st_mode | 0o111)
    return path


def uid_pids(uid: int) -> list[int]:
    """The live processes running as ``uid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid and pid_alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def process_env(pid: int) -> dict[str, str]:
    """The environment a process was started with, as the kernel holds it."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode() for k, v in pairs}


# What every test hub shares: loopback ports, a private database, dummy logins, a test service token.
BASE_HUB_CONFIG = """
import os, json
c = get_config()
settings = json.loads(os.environ["GPUSPAWNER_TEST_HUB"])
c.JupyterHub.bind_url = settings["bind_url"]
c.JupyterHub.hub_bind_url = settings["hub_bind_url"]
c.ConfigurableHTTPProxy.api_url = settings["proxy_api_url"]
c.ConfigurableHTTPProxy.pid_file = settings["dir"] + "/proxy.pid"
c.JupyterHub.db_url = "sqlite:///" + settings["dir"] + "/hub.sqlite"
c.JupyterHub.cookie_secret_file = settings["dir"] + "/cookie_secret"
c.JupyterHub.cleanup_servers = False
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = "test-password"
c.Authenticator.allow_all = True
c.JupyterHub.services = [{"name": "tests", "api_token": settings["token"]}]
c.JupyterHub.load_roles = [{
    "name": "tests",
    "scopes": ["admin:users", "admin:servers", "admin:server_state", "list:users", "read:users", "access:servers"],
    "services": ["tests"],
}]
"""

HUB_CONFIG = BASE_HUB_CONFIG + """
c.JupyterHub.spawner_class = "gpu-local"
c.GPULocalProcessSpawner.create_system_users = True
c.GPULocalProcessSpawner.system_user_prefix = settings["account_prefix"]
c.GPULocalProcessSpawner.system_user_home = settings["homes"]
c.Spawner.cmd = [settings["singleuser"]]
c.Spawner.args = []  # (no --allow-root: no server runs as root)
c.Spawner.start_timeout = 60
c.Spawner.http_timeout = 60
c.LocalProcessSpawner.env_keep = ["PATH", "LANG", "LD_LIBRARY_PATH", "FAKENVML_CONFIG"]
c.GPUSpawnerMixin.simulated_gpus = True
c.GPUSpawnerMixin.gpu_hub_id = settings["hub_id"]  # never another test hub's servers
c.GPUSpawnerMixin.gpu_inventory_ttl = 0.5
c.GPUSpawnerMixin.gpu_profiles = settings["profiles"]
"""


class Hub:
    """Start, restart and drive one JupyterHub through its REST API."""

    def __init__(
        self, directory: Path, nvml_env: dict[str, str], profiles: list[dict] | None = None,
        config_file: Path | None = None, extra_config: str = "",
    ) -> None:
        """A hub on free loopback ports; ``config_file`` replaces the test configuration,
        ``extra_config`` (Python, with ``c`` and ``settings``) is appended to it."""
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(16)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.settings = {
            "dir": str(self.dir),
            "bind_url": self.url,
            "hub_bind_url": f"http://127.0.0.1:{free_port()}",
            "proxy_api_url": f"http://127.0.0.1:{free_port()}",
            "token": self.token,
            "profiles": profiles,
            # what the servers' accounts may reach lies beside the hub's own folder (its database,
            # cookie secret, log: the hub's alone, mode 0700)
            "singleuser": str(self.dir.parent / f"{self.dir.name}-servers" / "singleuser.sh"),
            # this hub's own id (kept across its restarts): a hub adopts or stops the servers
            # that carry its id, so two test hubs alive at once must not share one
            "hub_id": "test-" + secrets.token_hex(4),
            # the system accounts its servers run as: <prefix><user name>, homes in <dir>/homes
            "account_prefix": "t" + secrets.token_hex(3) + "-",
            "homes": str(self.dir.parent / f"{self.dir.name}-servers" / "homes"),
        }
        servers = Path(self.settings["singleuser"]).parent
        servers.mkdir(exist_ok=True)
        passable(servers)
        if config_file is None:
            self.dir.chmod(0o700)  # the test configuration keeps its database here
        else:
            passable(self.dir)  # another configuration (the runnable default's) may keep its state here
        # the real single-user server, except for the user "crash", whose server dies at start
        singleuser = Path(self.settings["singleuser"])
        singleuser.write_text(
            "#!/bin/sh\n"
            'if [ "$JUPYTERHUB_USER" = crash ]; then echo "crashing on purpose" >&2; exit 3; fi\n'
            f'exec {VENV_BIN / "jupyterhub-singleuser"} "$@"\n'
        )
        singleuser.chmod(0o755)
        if config_file is None:
            config_file = self.dir / "jupyterhub_config.py"
            config_file.write_text(HUB_CONFIG + extra_config)
        self.config_file = Path(config_file)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")},
            **nvml_env,
            "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
            "GPUSPAWNER_TEST_HUB": json.dumps(self.settings),
        }
        self.proc: subprocess.Popen | None = None
        self.server_pids: set[int] = set()
        self.log_path = self.dir / "hub.log"

    # ------------------------------------------------------------ process

    def start(self, timeout: float = 60, *, background_job: bool = False) -> None:
        """Start the hub and wait until it answers; ``background_job``: with SIGINT and SIGQUIT
        ignored, as a non-interactive shell starts ``scripts/hub &``."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "jupyterhub"), "-f", str(self.config_file)],
            cwd=self.dir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_ignore_sigint if background_job else None,  # only signal dispositions
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/hub/api/", timeout=2).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"hub did not answer within {timeout}s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop the hub, then its proxy by pid (also when the hub had ended on its own: a hub that dies
        or is killed leaves its configurable-http-proxy running)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stop_proxy()

    def _stop_proxy(self) -> None:
        pid_file = self.dir / "proxy.pid"
        if sig_pid := (pid_file.read_text().strip() if pid_file.exists() else ""):
            pid = int(sig_pid)
            try:
                if pid_alive(pid) and b"configurable-http-proxy" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGTERM)
            except OSError:  # it ended meanwhile
                pass

    def restart(self) -> None:
        self.stop()
        self.start()

    def home(self, name: str) -> Path:
        """User ``name``'s home: their account's, made now if the hub has not made it yet."""
        from gpuspawner.accounts import ensure_account

        entry = ensure_account(name, self.settings["account_prefix"], Path(self.settings["homes"]))
        return Path(entry.pw_dir)

    def accounts(self) -> list[str]:
        """The system accounts this hub made."""
        from gpuspawner.accounts import MARK

        return sorted(e.pw_name for e in pwd.getpwall()
                      if e.pw_name.startswith(self.settings["account_prefix"]) and e.pw_gecos.startswith(MARK))

    def close(self) -> None:
        """Stop every server this hub started, then the hub, all by pid; delete the accounts it made."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                for name in self.user_names():
                    self.api("DELETE", f"/users/{name}/server")
            except requests.RequestException:  # a hub that does not answer: its servers are stopped by pid below
                pass
        self.server_pids |= self.marked_pids()
        for pid in list(self.server_pids):
            if pid_alive(pid):
                os.kill(pid, signal.SIGTERM)
        self.stop()
        deadline = time.monotonic() + 10
        for pid in self.server_pids:
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        self._remove_fences()
        self.delete_accounts()

    def delete_accounts(self) -> None:
        """Delete the accounts this hub made, ending whatever of theirs still runs (by pid)."""
        for account in self.accounts():
            uid = pwd.getpwnam(account).pw_uid
            for pid in uid_pids(uid):  # anything of the account's still running (this hub's servers' own)
                os.kill(pid, signal.SIGKILL)
            subprocess.run(["userdel", "--remove", account], capture_output=True, timeout=60)

    def _remove_fences(self) -> None:
        """The (empty) cgroups and records of this hub's server starts: a hub stopped right after its
        servers' stops were asked for has not removed them (a later hub of the same id would)."""
        from gpuspawner.backends.local.fence import DeviceFence

        fence = DeviceFence(self.settings["hub_id"])
        for spawn in fence.starts():
            fence.remove(spawn)

    def marked_pids(self) -> set[int]:
        """Live processes whose environment carries this hub's id (gpu-local's GPUSPAWNER_HUB marker)."""
        found = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if process_env(int(entry.name)).get("GPUSPAWNER_HUB") == self.settings["hub_id"]:
                        found.add(int(entry.name))
                except (OSError, UnicodeDecodeError):
                    continue  # gone, or not ours to read
        return found

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    # ------------------------------------------------------------ REST API

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(method, self.url + "/hub/api" + path, headers=headers, timeout=90, **kwargs)

    def user_names(self) -> list[str]:
        r = self.api("GET", "/users")
        return [u["name"] for u in r.json()] if r.ok else []

    def add_users(self, *names: str) -> None:
        r = self.api("POST", "/users", json={"usernames": list(names)})
        assert r.status_code in (201, 409), r.text

    def user(self, name: str) -> dict:
        r = self.api("GET", f"/users/{name}")
        r.raise_for_status()
        return r.json()

    def spawn(self, name: str, options: object) -> requests.Response:
        """POST a server request with a JSON body (which may be deliberately malformed)."""
        data = options if isinstance(options, (str, bytes)) else json.dumps(options)
        return self.api("POST", f"/users/{name}/server", data=data)

    def wait_ready(self, name: str, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.user(name)["servers"].get("")
            if server and server.get("ready"):
                pid = server.get("state", {}).get("pid")
                if pid:
                    self.server_pids.add(pid)
                return server
            if not server:
                raise RuntimeError(f"{name}'s server went away while starting:\n{self.log()}")
            time.sleep(0.3)
        raise TimeoutError(f"{name}'s server not ready within {timeout}s:\n{self.log()}")

    def stop_server(self, name: str, timeout: float = 30) -> None:
        r = self.api("DELETE", f"/users/{name}/server")
        assert r.status_code in (202, 204), r.text
        deadline = time.monotonic() + timeout
        while self.user(name)["servers"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not self.user(name)["servers"], f"{name}'s server did not stop"

    def server_env(self, name: str) -> dict[str, str]:
        """The environment of the user's running server process."""
        server = self.user(name)["servers"][""]
        pid = server["state"]["pid"]
        self.server_pids.add(pid)
        return process_env(pid)


def xsrf_token(html: str) -> str:
    """The XSRF token a page carries (a hidden field, or in the form's action URL)."""
    found = re.search(r'name="_xsrf" value="([^"]+)"', html) or re.search(r'[?&]_xsrf=([^"&]+)', html)
    return unquote(found.group(1))


def login(hub: Hub, name: str, password: str = "test-password") -> requests.Session:
    """A browser-like session logged in as ``name`` through the hub's login form (any backend's hub)."""
    web = requests.Session()
    page = web.get(hub.url + "/hub/login", timeout=60)
    r = web.post(hub.url + "/hub/login", timeout=60,
                 data={"_xsrf": xsrf_token(page.text), "username": name, "password": password})
    assert r.ok and "/hub/login" not in r.url, r.text
    return web
