"""gpuspawner.ports: the ports test hubs, proxies and dev clusters are started on."""

from __future__ import annotations

import socket

from gpuspawner.ports import _ephemeral_low, free_port


def test_ports_are_free_distinct_and_below_the_range_outgoing_connections_take():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(1024 <= p < _ephemeral_low() for p in ports)
    with socket.socket() as s:  # nobody holds it: a server can bind it
        s.bind(("127.0.0.1", ports[-1]))
        s.listen()
        taken = ports[-1]
        assert taken not in [free_port() for _ in range(50)]  # a port in use is never handed out again
