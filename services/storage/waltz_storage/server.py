"""Start and stop the storage node's two gRPC servers (storage and admin), each with health and reflection, its
optional framed Session port, and its optional plaintext health-only port."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from waltz.v1 import storage_admin_pb2, storage_admin_pb2_grpc, storage_pb2, storage_pb2_grpc
from waltz_common import listen, reflection, tls
from waltz_common.health import keep_health, start_health_port
from waltz_common.port_guard import CallLimits, LimitSettings, PortGuard
from waltz_storage.admin_service import StorageAdminService
from waltz_storage.health import READY_NAMES
from waltz_storage.node import StorageNode
from waltz_storage.service import StorageService
from waltz_storage.session_port import SessionPort

STORAGE_SERVICE = storage_pb2.DESCRIPTOR.services_by_name["WaltzStorage"].full_name
ADMIN_SERVICE = storage_admin_pb2.DESCRIPTOR.services_by_name["WaltzStorageAdmin"].full_name
_MIB = 1024 * 1024
# Who may call each port with TLS on (docs/security.md): servers run store sessions on the storage port, and
# operators copy partitions there (recover-partition, while the partition is unwritable); the admin port is
# for operators only.
STORAGE_ROLES = ("server", "operator")
ADMIN_ROLES = ("operator",)


@dataclass
class NodeServers:
    """The running storage and admin servers of one node (and its plaintext health port, if any), with their bound
    ports; one health servicer answers on every port, kept up to date by health_task."""

    node: StorageNode
    storage: grpc.aio.Server
    admin: grpc.aio.Server
    health: health.aio.HealthServicer
    health_task: asyncio.Task[None]
    storage_port: int
    admin_port: int
    health_server: grpc.aio.Server | None = None
    health_port: int = 0
    limits: dict[str, CallLimits] | None = None
    """The calls open on each port (storage, admin), for the metrics."""
    session: SessionPort | None = None
    """The framed Session port (storage.sessionPort), if any; its connections count in limits["storage"]."""

    async def stop(self, grace: float) -> None:
        """NOT_SERVING, stop reading streams (queued requests finish), stop the servers, close the files."""
        self.health_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.health_task
        await self.health.enter_graceful_shutdown()
        self.node.begin_shutdown()
        servers = [self.storage, self.admin, *([self.health_server] if self.health_server is not None else [])]
        session = [self.session.stop(grace)] if self.session is not None else []
        await asyncio.gather(*(server.stop(grace) for server in servers), *session)
        await asyncio.to_thread(self.node.close)


def _max_message_bytes(node: StorageNode) -> int:
    """Twice the batch limit, so an oversized batch still arrives and gets a clear INVALID_REQUEST."""
    return 2 * node.limits.max_batch_bytes + _MIB


def _message_options(node: StorageNode, limits: LimitSettings) -> list[tuple[str, int]]:
    size = _max_message_bytes(node)
    # No SO_REUSEPORT: a second process on the same port must fail to start, not share the traffic.
    # Servers ping idle connections every storage.keepaliveTime (their key, not ours): accept pings at any rate,
    # as gRPC's default answers a ping more often than every 5 minutes without data with GOAWAY too_many_pings.
    return [
        ("grpc.max_receive_message_length", size),
        ("grpc.max_send_message_length", size),
        listen.NO_PORT_REUSE,
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 0),
        ("grpc.http2.max_ping_strikes", 0),
        *limits.transport_options(),
    ]


async def _serve(
    node: StorageNode,
    host: str,
    port: int,
    service_name: str,
    add: object,
    servicer: object,
    files: tls.TlsFiles | None,
    roles: tuple[str, ...],
    checker: health.aio.HealthServicer,
    limits: CallLimits,
) -> tuple[grpc.aio.Server, int]:
    guard = PortGuard(f"{service_name} port", roles if files is not None else None, limits=limits)
    server = grpc.aio.server(options=_message_options(node, limits.settings), interceptors=[guard])
    add(servicer, server)  # type: ignore[operator]
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    reflection.enable(server, (service_name, health.SERVICE_NAME))
    bound = listen.add_grpc_port(server, host, port, files, "" if service_name == STORAGE_SERVICE else "admin port")
    await server.start()
    return server, bound


async def start(
    node: StorageNode,
    host: str,
    port: int,
    admin_port: int,
    files: tls.TlsFiles | None = None,
    health_port: int | None = None,
    limit_settings: LimitSettings | None = None,
    session_port: int | None = None,
    session_advertised_port: int = 0,
) -> NodeServers:
    """Serve WaltzStorage on port and WaltzStorageAdmin on admin_port (0 picks a free port); mutual TLS on both
    when files are given; grpc.health.v1 alone, plaintext, on health_port when given (0 picks one); the framed
    Session on session_port when given (0 picks one; its connections count with the storage port's), advertised
    to servers as session_advertised_port when that is not 0. Each port
    has its own limits on calls and connections (limit_settings; default: LimitSettings' defaults)."""
    settings = limit_settings if limit_settings is not None else LimitSettings(prefix="storage")
    limits = {"storage": CallLimits(settings), "admin": CallLimits(settings)}
    checker = health.aio.HealthServicer()
    for name in READY_NAMES:  # until the first verdicts, a moment later
        await checker.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    service = StorageService(node, mutual_tls=files is not None)
    session: SessionPort | None = None
    if session_port is not None:  # first: every Open the storage port answers advertises it
        session = SessionPort(node, files, STORAGE_ROLES, limits["storage"], _max_message_bytes(node))
        service.session_port = await session.start(host, session_port, session_advertised_port)
    started: list[grpc.aio.Server] = []
    try:
        storage, bound = await _serve(
            node,
            host,
            port,
            STORAGE_SERVICE,
            storage_pb2_grpc.add_WaltzStorageServicer_to_server,
            service,
            files,
            STORAGE_ROLES,
            checker,
            limits["storage"],
        )
        started.append(storage)
        admin, admin_bound = await _serve(
            node,
            host,
            admin_port,
            ADMIN_SERVICE,
            storage_admin_pb2_grpc.add_WaltzStorageAdminServicer_to_server,
            StorageAdminService(node),
            files,
            ADMIN_ROLES,
            checker,
            limits["admin"],
        )
        started.append(admin)
        health_server, health_bound = None, 0
        if health_port is not None:
            health_server, health_bound = await start_health_port(checker, host, health_port)
    except BaseException:
        await asyncio.gather(*(server.stop(None) for server in started), *([session.stop(0)] if session else []))
        raise
    task = asyncio.create_task(keep_health(checker, node.health))
    return NodeServers(
        node, storage, admin, checker, task, bound, admin_bound, health_server, health_bound, limits, session
    )
