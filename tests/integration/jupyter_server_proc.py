"""A real ``jupyter server`` (or ``jupyter lab``) process on loopback, with the stand-in NVML.

The stand-in is found through LD_LIBRARY_PATH, which the dynamic linker reads
at process start, so each server is its own process with the fakenvml
environment. The monitor extension is enabled by the config file the package
installs (nothing here enables it). Stopped by its pid.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from hub import free_port


class JupyterServer:
    def __init__(
        self,
        workdir: Path,
        env: dict[str, str],
        args: list[str] = (),
        base_url: str = "/",
        app: str = "jupyter_server",
    ) -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base_url = base_url
        self.url = f"http://127.0.0.1:{self.port}{base_url}"
        self.env = env
        self.args = list(args)
        self.app = app
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / f"server-{self.port}.log"

    def start(self, timeout: float = 120) -> JupyterServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "jupyter-config").mkdir(exist_ok=True)
        (self.workdir / "runtime").mkdir(exist_ok=True)
        env = {
            **os.environ,
            **self.env,
            # a private user config and runtime dir; the installed (sys-prefix) config still applies
            "JUPYTER_CONFIG_DIR": str(self.workdir / "jupyter-config"),
            "JUPYTER_RUNTIME_DIR": str(self.workdir / "runtime"),
            "JUPYTER_PLATFORM_DIRS": "1",
        }
        cmd = [
            sys.executable, "-m", self.app, "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
            f"--ServerApp.token={self.token}", f"--ServerApp.base_url={self.base_url}",
            f"--ServerApp.root_dir={self.workdir}", "--ServerApp.port_retries=0",
            *(["--allow-root"] if os.geteuid() == 0 else []), *self.args,
        ]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter server exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if requests.get(self.url + "api/status", headers=self.auth, timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"jupyter server did not answer in {timeout} s:\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        self.proc = None

    def __enter__(self) -> JupyterServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----------------------------------------------------------- requests --

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def get(self, path: str, auth: bool = True, **kw) -> requests.Response:
        return requests.get(self.url + path, headers=self.auth if auth else {}, timeout=60, **kw)

    def gpus(self, **params) -> dict:
        r = self.get("api/gpus", params=params)
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    def wait_for(self, predicate, timeout: float = 60, what: str = "condition", **params) -> dict:
        """Poll the snapshot (with query ``params``) until ``predicate(sample)`` holds; return that sample."""
        deadline = time.monotonic() + timeout
        sample = None
        while time.monotonic() < deadline:
            sample = self.gpus(**params)
            if predicate(sample):
                return sample
            time.sleep(0.3)
        raise AssertionError(f"{what} not seen within {timeout} s; last sample: {json.dumps(sample)[:2000]}")


class SSEClient:
    """Reads ``api/gpus/stream`` in a thread; collects the samples it receives."""

    def __init__(self, server: JupyterServer, params: dict | None = None) -> None:
        self.samples: list[dict] = []
        self.events: list[tuple[str, str]] = []
        self.response = requests.get(
            server.url + "api/gpus/stream", headers=server.auth, params=params or {}, stream=True, timeout=60
        )
        self.status_code = self.response.status_code
        self.content_type = self.response.headers.get("Content-Type", "")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _lines(self) -> Iterator[str]:
        yield from self.response.iter_lines(decode_unicode=True)

    def _read(self) -> None:
        event, data = "message", []
        try:
            for line in self._lines():
                if line == "":
                    if data:
                        payload = "\n".join(data)
                        self.events.append((event, payload))
                        if event == "sample":
                            self.samples.append(json.loads(payload))
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
        except (requests.RequestException, AttributeError, ValueError):
            pass  # closed by close()

    def wait_for(self, predicate, timeout: float = 60, what: str = "sample") -> dict:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for sample in self.samples[seen:]:
                if predicate(sample):
                    return sample
            seen = len(self.samples)
            time.sleep(0.1)
        raise AssertionError(f"{what} not received on the stream within {timeout} s ({len(self.samples)} samples)")

    def close(self) -> None:
        self.response.close()


def run_in_kernel(server: JupyterServer, kernel_id: str, code: str, timeout: float = 120) -> str:
    """Execute ``code`` in a running kernel over its websocket; return what it printed."""
    import asyncio
    import uuid

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def go() -> str:
        url = f"ws://127.0.0.1:{server.port}{server.base_url}api/kernels/{kernel_id}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers=server.auth, connect_timeout=60))
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))
        out = []
        try:
            while True:
                raw = await asyncio.wait_for(ws.read_message(), timeout)
                if raw is None:
                    raise RuntimeError("kernel websocket closed")
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "stream":
                    out.append(msg["content"]["text"])
                elif kind == "error":
                    raise RuntimeError("\n".join(msg["content"]["traceback"]))
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    return "".join(out)
        finally:
            ws.close()

    return asyncio.run(go())
