"""LocalCluster's ports come from below the ephemeral range, where no outgoing connection lands."""

from __future__ import annotations

import socket

from waltz_common.testing.local_cluster import EPHEMERAL_RANGE, free_port, listening_port_range


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    low, high = listening_port_range()
    if EPHEMERAL_RANGE.exists():
        ephemeral_low = int(EPHEMERAL_RANGE.read_text().split()[0])
        assert high < ephemeral_low
    assert all(low <= p <= high for p in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
