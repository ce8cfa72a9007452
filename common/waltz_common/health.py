"""grpc.health.v1 kept true: verdicts (pure) turned into the statuses a health servicer reports, and the plaintext
health-only port that probes unable to present a client certificate (kubelet's) can use.

A service computes a Verdict per health name from its state (pure, in its own module); HealthBook keeps the
last verdicts and says what changed; keep_health applies the changes to the servicer every interval and logs
each one with its reason (the gRPC health protocol itself carries no reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from waltz_common import listen
from waltz_common.port_guard import PortGuard

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

INTERVAL_S = 1.0
"""How often keep_health recomputes the verdicts: a probe sees a change at most this late."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One health name's answer, and why it is not serving (empty when it is)."""

    serving: bool
    reason: str = ""

    @property
    def status(self) -> health_pb2.HealthCheckResponse.ServingStatus:
        return SERVING if self.serving else NOT_SERVING


class HealthBook:
    """The verdicts last reported, per health name; update says which names changed (None: no longer reported,
    e.g. a partition this process gave up)."""

    def __init__(self) -> None:
        self.current: dict[str, Verdict] = {}

    def update(self, verdicts: Mapping[str, Verdict]) -> dict[str, Verdict | None]:
        changes: dict[str, Verdict | None] = {
            name: verdict for name, verdict in verdicts.items() if self.current.get(name) != verdict
        }
        changes.update({name: None for name in self.current if name not in verdicts})
        self.current = dict(verdicts)
        return changes


async def apply(servicer: health.aio.HealthServicer, book: HealthBook, verdicts: Mapping[str, Verdict]) -> None:
    """Report the verdicts: set each changed name (SERVICE_UNKNOWN once dropped) and log the change."""
    for name, verdict in book.update(verdicts).items():
        if verdict is None:
            await servicer.set(name, SERVICE_UNKNOWN)
            log.info("health %r: no longer reported", name)
            continue
        await servicer.set(name, verdict.status)
        if verdict.serving:
            log.info("health %r: SERVING", name)
        else:
            log.warning("health %r: NOT_SERVING: %s", name, verdict.reason)


async def keep_health(
    servicer: health.aio.HealthServicer,
    verdicts: Callable[[], Mapping[str, Verdict]],
    nudge: asyncio.Event | None = None,
    interval_s: float = INTERVAL_S,
) -> None:
    """Apply verdicts() now, then every interval or as soon as nudge is set, until cancelled (the only writer of
    the servicer's statuses meanwhile, so they are applied in order)."""
    book = HealthBook()
    nudge = nudge or asyncio.Event()
    while True:
        try:
            now = verdicts()
        except Exception:  # a bug in a verdict must not freeze every status: keep the last ones, try again
            log.exception("health: the verdicts could not be computed; statuses unchanged")
        else:
            await apply(servicer, book, now)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(nudge.wait(), interval_s)
        nudge.clear()


async def start_health_port(servicer: health.aio.HealthServicer, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """A plaintext gRPC server on host:port with grpc.health.v1 only (no other service, no data): where probes
    that cannot do mutual TLS ask. Returns the started server and its bound port."""
    # plain answers to undecodable requests; a second process on the port fails to start rather than share it
    server = grpc.aio.server(options=[listen.NO_PORT_REUSE], interceptors=[PortGuard("health port")])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    bound = listen.add_grpc_port(server, host, port, None, "health port")
    await server.start()
    return server, bound
