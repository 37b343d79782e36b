"""Real receivers for the hub's notifications: an SMTP server (aiosmtpd, its own process on loopback,
keeping what it receives in a Maildir) and a webhook receiver (an HTTP server the test runs)."""

from __future__ import annotations

import email
import email.policy
import json
import mailbox
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpuspawner.ports import free_port


class SMTPServer:
    """``python -m aiosmtpd`` on 127.0.0.1:``port``, every message kept in the Maildir ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = Path(directory)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aiosmtpd", "-n", "-l", f"127.0.0.1:{self.port}",
             "-c", "aiosmtpd.handlers.Mailbox", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("aiosmtpd did not listen")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def messages(self, to: str) -> list[email.message.EmailMessage]:
        """The messages received for ``to`` (its plain-text part readable with ``get_body``)."""
        if not self.directory.exists():
            return []
        box = mailbox.Maildir(str(self.directory), factory=None, create=False)
        found = [email.message_from_bytes(m.as_bytes(), policy=email.policy.default) for m in box]
        return [m for m in found if m["To"] == to]


def text_of(message: email.message.EmailMessage) -> str:
    return message.get_body(("plain",)).get_content()


class WebhookReceiver:
    """An HTTP server on loopback that keeps each POST's path and JSON body."""

    def __init__(self) -> None:
        received: list[tuple[str, dict]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.received = received
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
