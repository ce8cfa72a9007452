"""A port that cannot be bound is one line naming the address, the port's role and the reason (issue 28): for gRPC
ports with and without mutual TLS, the plaintext health port and the metrics port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from waltz_common import devcerts, listen
from waltz_common.health import start_health_port
from waltz_common.tls import TlsFiles


@pytest.fixture
def taken() -> Iterator[int]:
    """A port a plain socket listens on (no SO_REUSEPORT), for as long as the test runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def tls_files(tmp_path) -> TlsFiles:
    files = devcerts.write(tmp_path)
    return TlsFiles(str(files["server"]), str(files["server-key"]), str(files["ca"]))


@pytest.mark.parametrize("with_tls", [False, True])
def test_a_taken_grpc_port_is_one_line(tmp_path, taken, with_tls):
    files = tls_files(tmp_path) if with_tls else None

    async def bind() -> None:
        server = grpc.aio.server(options=[listen.NO_PORT_REUSE])
        try:
            listen.add_grpc_port(server, "127.0.0.1", taken, files, "admin port")
        finally:
            await server.stop(None)

    with pytest.raises(listen.ListenError) as refused:
        asyncio.run(bind())
    assert str(refused.value) == f"cannot listen on 127.0.0.1:{taken} (admin port): address in use"


def test_two_grpc_servers_do_not_share_a_port():
    """gRPC sets SO_REUSEPORT unless told not to: then a second process on the port would take half the clients."""

    async def both() -> None:
        first = grpc.aio.server(options=[listen.NO_PORT_REUSE])
        port = listen.add_grpc_port(first, "127.0.0.1", 0, None)
        await first.start()
        second = grpc.aio.server(options=[listen.NO_PORT_REUSE])
        try:
            with pytest.raises(listen.ListenError, match=f"127.0.0.1:{port}: address in use"):
                listen.add_grpc_port(second, "127.0.0.1", port, None)
        finally:
            await second.stop(None)
            await first.stop(None)

    asyncio.run(both())


def test_the_health_and_metrics_ports(taken):
    from grpc_health.v1 import health

    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{taken} \\(health port\\): address in use"):
        asyncio.run(start_health_port(health.aio.HealthServicer(), "127.0.0.1", taken))
    with pytest.raises(listen.ListenError) as refused:
        listen.start_metrics_http(taken, "127.0.0.1", CollectorRegistry())
    assert str(refused.value) == f"cannot listen on 127.0.0.1:{taken} (metrics port): address in use"


def test_reasons_and_ipv6_addresses():
    assert listen.join("::", 80) == "[::]:80" and listen.join("[::1]", 80) == "[::1]:80"
    assert listen.join("10.0.0.7", 80) == "10.0.0.7:80"
    assert listen.why_not("192.0.2.1", 55280) == "no such address on this host"  # TEST-NET-1: not ours
