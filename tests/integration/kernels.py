"""Run code in a kernel of a single-user server, as a notebook would, through the server's own API."""

from __future__ import annotations

import asyncio
import json
import uuid

import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect


def start_kernel(server_url: str, token: str) -> str:
    """Start a python3 kernel on the server at ``server_url`` (ending in /); its id."""
    r = requests.post(server_url + "api/kernels", json={"name": "python3"},
                      headers={"Authorization": f"token {token}"}, timeout=60)
    r.raise_for_status()
    return r.json()["id"]


async def _execute(server_url: str, token: str, kernel_id: str, code: str, timeout: float) -> str:
    url = server_url.replace("http", "ws", 1) + f"api/kernels/{kernel_id}/channels"
    conn = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    msg_id = uuid.uuid4().hex
    conn.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": msg_id,
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }))
    out: list[str] = []
    try:
        while True:
            raw = await asyncio.wait_for(conn.read_message(), timeout)
            if raw is None:
                raise ConnectionError("the kernel's websocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                raise RuntimeError(f"{content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)
    finally:
        conn.close()


def execute(server_url: str, token: str, kernel_id: str, code: str, timeout: float = 60) -> str:
    """What ``code`` prints when run in the kernel."""
    return asyncio.run(_execute(server_url, token, kernel_id, code, timeout))
