"""Binding a process's ports, failing with one plain line ("cannot listen on 127.0.0.1:55280: address in use").

gRPC reports a port it cannot bind as a RuntimeError ("Failed to bind to address ...; set GRPC_VERBOSITY=debug")
or a bound port of 0, without the reason; prometheus_client raises the socket's OSError. Both become a
ListenError here, whose message names the address, the port's role and the reason; the reason for gRPC is
found by binding a plain socket to the same address (the kernel says why).
"""

from __future__ import annotations

import errno
import socket
from typing import Any

import grpc

from waltz_common import tls

REASONS = {
    errno.EADDRINUSE: "address in use",
    errno.EADDRNOTAVAIL: "no such address on this host",
    errno.EACCES: "permission denied",
}

NO_PORT_REUSE = ("grpc.so_reuseport", 0)
"""gRPC servers set SO_REUSEPORT by default, so that a second process binding the same port succeeds and the
kernel splits the connections between them; with this option the second one is told "address in use"."""


class ListenError(OSError):
    """A port of this process cannot be bound; the message is the whole story, on one line."""


def join(host: str, port: int) -> str:
    """host:port, with an IPv6 literal in brackets ("[::1]:80")."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def reason(error: OSError) -> str:
    return REASONS.get(error.errno or 0, error.strerror or str(error))


def why_not(host: str, port: int) -> str:
    """Why host:port cannot be bound, by trying it with a plain socket (gRPC keeps its reason to itself)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host!r} ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        try:
            sock.bind(address)
        except OSError as exc:
            return reason(exc)
    return "refused by gRPC (the address is free now: taken and released meanwhile?)"


def failure(host: str, port: int, role: str, why: str) -> ListenError:
    where = join(host, port) + (f" ({role})" if role else "")
    return ListenError(f"cannot listen on {where}: {why}")


def add_grpc_port(server: grpc.aio.Server, host: str, port: int, files: tls.TlsFiles | None, role: str = "") -> int:
    """Bind host:port on a gRPC server (mutual TLS with files); the bound port, or ListenError."""
    try:
        bound = tls.add_port(server, join(host, port), files)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise failure(host, port, role, why_not(host, port))
    return bound


def start_metrics_http(port: int, host: str, registry: Any) -> Any:
    """prometheus_client's HTTP server for /metrics on host:port; what start_http_server returns, or ListenError."""
    from prometheus_client import start_http_server

    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise failure(host, port, "metrics port", reason(exc)) from None
