"""The fault proxy of the test tooling, against an echo server on loopback: pass, cut, blackhole, delay,
throttle and heal."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from waltz_common.testing.fault_proxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with FaultProxy(f"127.0.0.1:{server.server_address[1]}") as p:
        yield p
    server.shutdown()
    server.server_close()


def connect(proxy: FaultProxy, timeout: float = 2.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    return sock


def echo(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_passes_bytes_both_ways(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert echo(sock, b"hello" * 1000) == b"hello" * 1000


def test_cut_resets_open_connections_and_refuses_new_ones_until_healed(proxy: FaultProxy) -> None:
    sock = connect(proxy)
    assert echo(sock, b"x") == b"x"
    proxy.cut()
    with pytest.raises(OSError):
        for _ in range(10):  # the reset may take a send to be seen
            sock.sendall(b"y")
            if not sock.recv(1):
                raise ConnectionResetError("closed")
            time.sleep(0.05)
    sock.close()
    with pytest.raises(OSError), connect(proxy) as again:  # the reset may come at the connect already
        again.sendall(b"z")
        if not again.recv(1):
            raise ConnectionResetError("closed")
    proxy.heal()
    with connect(proxy) as healed:
        assert echo(healed, b"back") == b"back"


def test_blackhole_keeps_the_connection_up_and_lets_the_held_bytes_through_once_healed(proxy: FaultProxy) -> None:
    with connect(proxy, timeout=0.5) as sock:
        assert echo(sock, b"a") == b"a"
        proxy.blackhole()
        sock.sendall(b"held")
        with pytest.raises(TimeoutError):
            sock.recv(10)
        proxy.heal()
        sock.settimeout(2)
        assert sock.recv(10) == b"held"


def test_delay_is_latency_per_message(proxy: FaultProxy) -> None:
    proxy.delay(0.2)
    with connect(proxy) as sock:
        started = time.monotonic()
        assert echo(sock, b"slow") == b"slow"
        took = time.monotonic() - started
    assert 0.4 <= took < 2.0, took  # there and back


def test_throttle_limits_the_rate(proxy: FaultProxy) -> None:
    proxy.throttle(200_000)
    with connect(proxy, timeout=10) as sock:
        started = time.monotonic()
        assert echo(sock, b"t" * 100_000) == b"t" * 100_000
        took = time.monotonic() - started
    assert took >= 0.45, took  # 100 kB each way at 200 kB/s, both ways at once


def test_swallow_next_hangs_that_many_new_connections_and_no_other(proxy: FaultProxy) -> None:
    with connect(proxy) as before:
        assert echo(before, b"open") == b"open"  # the proxy has taken this one up
        proxy.swallow_next(1)
        assert echo(before, b"still") == b"still"  # connections made earlier go on
        with connect(proxy, timeout=1.0) as hung, connect(proxy) as after:
            hung.sendall(b"anyone?")
            with pytest.raises(TimeoutError):  # neither answered nor closed
                hung.recv(16)
            assert echo(after, b"next") == b"next"
