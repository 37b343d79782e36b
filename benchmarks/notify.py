"""What one notification costs, through the hub's notifier and the real Apprise, on loopback.

Prints, for N notifications each (median and slowest, milliseconds):

- email: to a real SMTP server (aiosmtpd, its own process), from ``tell()`` to its return;
- webhook: Apprise's JSON post to a local HTTP receiver;
- dead SMTP: a sender whose server is gone (connection refused);
- silent webhook: a receiver that accepts and never answers, given up at ``gpu_notify_timeout``;
- and how long the event loop was blocked during all of it (the longest gap of a 10 ms ticker),
  the figure that says a slow channel holds up nothing else.

    scripts/bench notify [N]
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import Counter
from sqlalchemy import create_engine

from gpuspawner.hub.notify import EmailChannel, Notifier, WebhookChannel
from gpuspawner.hub.notify_store import NotifyStore
from gpuspawner.notifications import EVENTS, GPUNotifySettings, Preferences
from notify_parts import SMTPServer, WebhookReceiver


def notifier(email: str, prefix: str, timeout: float) -> Notifier:
    counter = Counter("gpuspawner_notifications", "bench", ["channel", "event", "outcome"], registry=None)
    n = Notifier(GPUNotifySettings(gpu_notify_email=email, gpu_notify_webhook_prefixes=[prefix],
                                   gpu_notify_timeout=timeout), NotifyStore(create_engine("sqlite://")), counter)
    n.add(EmailChannel(n.pool, email, n.preferences))
    n.add(WebhookChannel(n.pool, n.preferences, [prefix]))
    return n


async def measure(n: Notifier, count: int, user: str) -> tuple[list[float], float]:
    """Per-tell seconds, and the longest the event loop went without running a 10 ms ticker."""
    longest, running = 0.0, True

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            longest, last = max(longest, now - last - 0.01), now

    tick = asyncio.create_task(ticker())
    took = []
    for i in range(count):
        began = time.perf_counter()
        await n.tell(user, "ready", f"Your GPU server is ready ({i})", "It is running.")
        took.append(time.perf_counter() - began)
    running = False
    await tick
    return took, longest


def line(name: str, took: list[float], blocked: float) -> None:
    print(f"{name:<16} median {statistics.median(took) * 1000:7.1f} ms   slowest {max(took) * 1000:7.1f} ms   "
          f"event loop blocked at most {blocked * 1000:5.1f} ms")


def main(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        smtp = SMTPServer(Path(tmp) / "mail")
        smtp.start()
        receiver = WebhookReceiver()
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        try:
            prefix = f"http://127.0.0.1:{receiver.port}/hooks/"
            quiet = f"http://127.0.0.1:{silent.getsockname()[1]}/hooks/"
            n = notifier(f"mailto://127.0.0.1:{smtp.port}?from=gpus@example.org", prefix, 2.0)
            on = {c: frozenset(EVENTS) for c in ("email", "webhook")}
            n.store.put("mail", Preferences(email="mail@example.org", events=on))
            n.store.put("hook", Preferences(webhook=prefix + "x", events=on))
            n.store.put("quiet", Preferences(webhook=quiet + "x", events=on))
            line("email", *asyncio.run(measure(n, count, "mail")))
            line("webhook", *asyncio.run(measure(n, count, "hook")))
            smtp.stop()
            line("dead SMTP", *asyncio.run(measure(n, count, "mail")))
            line("silent webhook", *asyncio.run(measure(n, min(count, 3), "quiet")))
            print(f"received: {len(receiver.received)} webhook posts; counted: "
                  + ", ".join(f"{m.labels['channel']}/{m.labels['outcome']}={m.value:g}"
                              for m in next(iter(n.counter.collect())).samples if m.name.endswith("_total")))
            n.close()
        finally:
            smtp.stop()
            receiver.close()
            silent.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
