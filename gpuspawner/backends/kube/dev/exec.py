"""The kubelet API of the fake nodes (gpuspawner.backends.kube.dev.kubelet): ``exec`` into a pod's container.

The API server reaches a node's kubelet at the node's InternalIP (``--kubelet-preferred-address-types``)
and the port of its ``daemonEndpoints`` (10250) over TLS: it checks the kubelet's certificate against
the cluster's CA (``--kubelet-certificate-authority``) and shows its own client certificate
(``--kubelet-client-certificate``), which this server requires to be of that CA (a real kubelet
would then also ask the API server to authorize the call; this one does not).

``/exec/<namespace>/<pod>/[<uid>/]<container>?command=...&stdin=&stdout=&stderr=&tty=`` is served
with the channel.k8s.io WebSocket protocols ``v5.channel.k8s.io`` (kubectl) and ``v4.channel.k8s.io``
(the Python client), which the API server passes through as they are (its translation of
WebSocket to SPDY for kubelets, ``TranslateStreamCloseWebsocketRequests``, is off: this kubelet
speaks no SPDY). Each binary message is a channel byte and data: 0 stdin, 1 stdout, 2 stderr,
3 the error channel, where the end is reported as a ``Status`` (``Success``, or ``Failure`` with
reason ``NonZeroExitCode`` and the exit code as an ``ExitCode`` cause), 4 resize (ignored), and for
v5 255 to close a stream (the client's stdin). The command runs in the container's environment,
as its user, in its working folder: what :meth:`~gpuspawner.backends.kube.dev.kubelet.PodRunner.exec_context`
gives. A TTY is not emulated (pipes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from pathlib import Path

from .api import _certificate, _new_key, _pem_cert, _pem_key

#: the port of each node's kubelet API (the node status' ``daemonEndpoints``)
KUBELET_PORT = 10250
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


def free_octet() -> int:
    """A second octet X for loopback addresses 127.X.*.* whose first node address 127.X.0.1 has no kubelet
    API yet (another cluster's, on this machine), chosen at random from 100-249."""
    import random

    for octet in random.sample(range(100, 250), 150):
        with socket.socket() as s:
            try:
                s.bind((f"127.{octet}.0.1", 10250))
                return octet
            except OSError:
                continue
    raise RuntimeError("no loopback range 127.X.0.0/16 free for fake nodes (each has a kubelet on port 10250)")


def _flag(query, *names: str) -> bool:
    return any(query.get(n, "").lower() in ("1", "true") for n in names)


def status(code: int, message: str = "") -> bytes:
    """The error channel's last word: a ``Status`` as the kubelet writes it."""
    if code == 0:
        return json.dumps({"metadata": {}, "status": "Success"}).encode()
    return json.dumps({"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                       "message": f"command terminated with non-zero exit code: {message or 'exit code'} {code}",
                       "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}).encode()


async def healthz(request):
    from aiohttp import web

    return web.Response(text="ok")


class KubeletServer:
    """The fake nodes' kubelet API, one HTTPS listener per node address, in a thread of its own."""

    def __init__(self, kubelet) -> None:
        self.kubelet = kubelet  # the FakeKubelet it serves: its pki, runner and errors
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None
        self._sites: dict[str, object] = {}
        self.calls: list[str] = []  # what was exec'd: "ns/pod/container: argv", for people and tests

    def start(self) -> None:
        if self.loop is not None:
            return
        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", self.exec)
        app.router.add_route("*", "/exec/{namespace}/{pod}/{uid}/{container}", self.exec)
        app.router.add_get("/healthz", healthz)
        self._runner = web.AppRunner(app, access_log=None)
        self._thread = threading.Thread(target=self.loop.run_forever, name="gpuspawner-kubelet-api", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._runner.setup(), self.loop).result(30)

    def serve(self, name: str, address: str) -> None:
        """Listen on ``address``:10250 for node ``name``, with a serving certificate for that address."""
        from aiohttp import web

        self.start()
        if name in self._sites:
            return
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.kubelet.pki / "ca.crt"))
        context.verify_mode = ssl.CERT_REQUIRED
        cert, key = self._certificate(name, address)
        context.load_cert_chain(str(cert), str(key))
        site = web.TCPSite(self._runner, address, KUBELET_PORT, ssl_context=context, reuse_address=False)
        asyncio.run_coroutine_threadsafe(site.start(), self.loop).result(30)
        self._sites[name] = site

    def unserve(self, name: str) -> None:
        """Stop listening for node ``name`` (removed), so its address and port are free again."""
        site = self._sites.pop(name, None)
        if site is not None and self.loop is not None:
            asyncio.run_coroutine_threadsafe(site.stop(), self.loop).result(15)

    def _certificate(self, name: str, address: str) -> tuple[Path, Path]:
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        pki: Path = self.kubelet.pki
        ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
        ca_key = load_pem_private_key((pki / "ca.key").read_bytes(), None)
        key = _new_key()
        cert = _certificate(f"system:node:{name}", key, ca, ca_key, orgs=("system:nodes",),
                            server_names=(address, name))
        (pki / f"kubelet-{name}.key").write_bytes(_pem_key(key))
        (pki / f"kubelet-{name}.crt").write_bytes(_pem_cert(cert))
        return pki / f"kubelet-{name}.crt", pki / f"kubelet-{name}.key"

    def stop(self) -> None:
        if self.loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.loop.close()
        self.loop = None
        self._sites.clear()

    async def exec(self, request):
        try:
            return await self._exec(request)
        except Exception as error:  # said where people and tests look (aiohttp would only log it)
            self.kubelet.errors.append(f"exec {request.path}: {type(error).__name__}: {error}")
            raise

    async def _exec(self, request):
        from aiohttp import WSMsgType, web

        match, query = request.match_info, request.query
        ws = web.WebSocketResponse(protocols=PROTOCOLS)
        if not ws.can_prepare(request).ok:
            return web.Response(status=400, text="this kubelet serves exec over WebSockets "
                                "(v5.channel.k8s.io, v4.channel.k8s.io) only, not SPDY\n")
        argv = query.getall("command", [])
        want_stdin = _flag(query, "stdin", "input")
        channels = {STDOUT: _flag(query, "stdout", "output"), STDERR: _flag(query, "stderr", "error")}
        where = f"{match['namespace']}/{match['pod']}/{match['container']}"
        self.calls.append(f"{where}: {argv}")
        found = await asyncio.get_running_loop().run_in_executor(
            None, self.kubelet.runner.exec_context, match["namespace"], match["pod"], match["container"])

        if found is None or not argv:
            return web.Response(status=404 if argv else 400, text=(
                f"container {match['container']!r} of pod {match['namespace']}/{match['pod']} is not running on "
                "this node (the fake kubelet runs only the pods of its pod runner)\n" if argv else "no command\n"))
        await ws.prepare(request)

        async def send(channel: int, data: bytes) -> None:
            if not ws.closed:
                await ws.send_bytes(bytes([channel]) + data)
        pod, container = found
        command = self.kubelet.runner.exec_argv(pod, container, argv)
        if command is None:
            await send(STDERR, f"exec: {argv[0]!r}: executable file not found in $PATH\n".encode())
            await send(ERROR, status(127, f"error executing command {argv}, exit code"))
            await ws.close()
            return ws
        pipe = asyncio.subprocess.PIPE
        process = await asyncio.create_subprocess_exec(
            *command, env=container.env, start_new_session=True,
            stdin=pipe if want_stdin else asyncio.subprocess.DEVNULL, stdout=pipe,
            stderr=pipe if channels[STDERR] else asyncio.subprocess.STDOUT)

        async def pump(stream, channel: int) -> None:
            while chunk := await stream.read(65536):
                if channels.get(channel):
                    await send(channel, chunk)

        async def feed() -> None:
            async for message in ws:
                if message.type != WSMsgType.BINARY or not message.data:
                    continue
                channel, data = message.data[0], message.data[1:]
                if channel == STDIN and process.stdin is not None and data:
                    process.stdin.write(data)
                    with contextlib.suppress(ConnectionError):
                        await process.stdin.drain()
                elif channel == CLOSE and data[:1] == bytes([STDIN]) and process.stdin is not None:
                    process.stdin.close()

        pumps = [asyncio.ensure_future(pump(process.stdout, STDOUT))]
        if process.stderr is not None:
            pumps.append(asyncio.ensure_future(pump(process.stderr, STDERR)))
        reader = asyncio.ensure_future(feed())
        await asyncio.gather(*pumps)
        code = await process.wait()
        code = 128 - code if code < 0 else code
        await send(ERROR, status(code, f"error executing command {argv}, exit code"))
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await ws.close()
        return ws
