"""A free TCP port for a server this process is about to start (the dev clusters, tests, benchmarks).

Asking the kernel (bind to port 0) hands out a port of the ephemeral range, the same range every
outgoing connection of the machine takes its local port from: between the pick and the server's
bind, a connection of another process can take it ("address already in use"). :func:`free_port`
picks below that range instead, at random, and checks the port can be bound now; it never hands
out the same port twice in one process.
"""

from __future__ import annotations

import random
import socket
import threading

__all__ = ["free_port"]

_given: set[int] = set()
_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def free_port(address: str = "127.0.0.1") -> int:
    """A port of ``address`` nobody listens on, outside the range outgoing connections use."""
    high = min(_ephemeral_low(), 65536) - 1
    low = 10000 if high > 20000 else 1024
    with _lock:
        for _ in range(200):
            port = random.randint(low, high)
            if port in _given:
                continue
            with socket.socket() as s:
                try:
                    s.bind((address, port))
                except OSError:
                    continue
            _given.add(port)
            return port
    with socket.socket() as s:  # a machine with no room below the range: the kernel's pick
        s.bind((address, 0))
        return s.getsockname()[1]
