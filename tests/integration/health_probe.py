"""Ask a process's grpc.health.v1 what a probe would ask, and wait for an answer (tests' helper)."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from waltz_common import tls

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def status(address: str, name: str = "", files: tls.TlsFiles | None = None, timeout: float = 3.0) -> str:
    """The status name (SERVING, NOT_SERVING, ...) of a health name, or the gRPC code's name when the check fails
    (e.g. NOT_FOUND for a name not reported, UNAVAILABLE when nothing answers)."""
    channel = tls.channel(address, files)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=name), timeout=timeout
            )
        except grpc.RpcError as e:
            return str(e.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def wait_for(address: str, name: str, wanted: str, timeout: float = 60.0, files: tls.TlsFiles | None = None) -> float:
    """Poll until the health name answers wanted; the seconds it took. AssertionError naming the last answer."""
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < timeout:
        last = status(address, name, files)
        if last == wanted:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{address} health {name!r}: {last}, not {wanted} within {timeout:g} s")
