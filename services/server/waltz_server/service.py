"""The grpc.aio WaltzServer servicer: the client Stream, unary reads and admin queries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_common import listen, reflection, tls
from waltz_common.grpc_env import keepalive_options
from waltz_common.port_guard import CallLimits, LimitSettings, PortGuard
from waltz_server.client_stream import ClientStream, StreamAborted, stream_answer
from waltz_server.config import PartitionSettings
from waltz_server.discovery import ClusterView
from waltz_server.identity import ClientIdentities, ClientIdentity
from waltz_server.ownership import PartitionManager
from waltz_server.partition import Partition
from waltz_server.record_runs import run_to_proto
from waltz_server.store.api import StoreUnavailable
from waltz_server.store.events import first_to_end
from waltz_server.transaction_data import RangeError, batch_size, read_range, read_runs, transaction_data

log = logging.getLogger(__name__)

Connectivity = Callable[[], Awaitable[dict[str, tuple[bool, str]]]]
SHUTTING_DOWN = "the server is shutting down: its partitions are elsewhere now"
CLAIM_ATTEMPTS = 100  # ids taken in a row that another identity had bound already (never more than a few)


class WaltzServerService(server_pb2_grpc.WaltzServerServicer):
    """Answers clients from the partitions the PartitionManager holds."""

    def __init__(
        self,
        manager: PartitionManager,
        server_id: Callable[[], int],
        settings: PartitionSettings,
        stream_queue_size: int = 64,
        connectivity: Connectivity | None = None,
        identities: ClientIdentities | None = None,
    ) -> None:
        """identities: whose client ids are whose, checked on the streams of mutual TLS peers (None: not at all)."""
        self._identities = identities
        self._manager = manager
        self._server_id = server_id
        self._settings = settings
        self._queue_size = stream_queue_size
        self._connectivity = connectivity
        self._streams: set[ClientStream] = set()
        self._stopping = asyncio.Event()

    def end_streams(self) -> None:
        """Shutting down: every client Stream writes out what is queued for it (the NOT_READY answers of
        the closed partitions), then ends with UNAVAILABLE, and new ones are refused likewise, so that
        the gRPC server's stop does not wait out its grace for clients that keep their streams open."""
        self._stopping.set()

    async def Stream(
        self, request_iterator: AsyncIterator[server_pb2.ClientMessage], context: grpc.aio.ServicerContext
    ) -> None:
        stopping = self._stopping
        if stopping.is_set():
            await _abort(context, grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        pem = tls.peer_pem(context) if self._identities is not None else None
        stream = ClientStream(
            self._manager,
            self._server_id(),
            self._queue_size,
            4 * self._settings.feed_batch_size,
            ClientIdentity.of_certificate(pem) if pem is not None else None,
            self._identities,
        )
        self._streams.add(stream)
        aborted: StreamAborted | None = None
        try:
            writer = asyncio.create_task(stream.write(context))
            try:
                await first_to_end(stream.read(request_iterator), stopping.wait())
                if stopping.is_set():
                    aborted = StreamAborted(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
                await stream.drain(context)
            except StreamAborted as exc:
                aborted = exc
            finally:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
        finally:
            self._streams.discard(stream)
            stream.detach()
        if aborted is not None:
            if aborted.code == grpc.StatusCode.INVALID_ARGUMENT:
                log.warning("a client stream from %s ended INVALID_ARGUMENT: %s", context.peer(), aborted)
            await context.abort(aborted.code, str(aborted))

    async def GetTransactionData(
        self, request: server_pb2.TransactionDataRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.TransactionDataResponse:
        partition = await self._partition(request.req_id.partition_id, context)
        try:
            return await transaction_data(partition, request)
        except StoreUnavailable as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"partition {partition.partition_id}: {exc}")

    async def GetHighWaterMark(
        self, request: server_pb2.HighWaterMarkRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.HighWaterMarkResponse:
        partition = await self._partition(request.partition_id, context)
        return server_pb2.HighWaterMarkResponse(
            partition_id=partition.partition_id, high_water_mark=partition.high_water_mark
        )

    async def ReadTransactions(
        self, request: server_pb2.ReadTransactionsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[server_pb2.ReadTransactionsResponse]:
        partition = await self._partition(request.partition_id, context)
        size = batch_size(request.batch_size, self._settings.read_batch_size)
        first, last = request.from_transaction_id, request.to_transaction_id
        try:
            if request.raw:
                async for run in read_runs(partition, first, last, size, self._settings.read_batch_bytes):
                    response = server_pb2.ReadTransactionsResponse(partition_id=partition.partition_id)
                    run_to_proto(run, response.run)  # the data files' bytes, passed on as they are
                    yield response
                return
            async for records in read_range(
                partition, first, last, size, max_bytes=self._settings.read_batch_bytes
            ):
                response = server_pb2.ReadTransactionsResponse(partition_id=partition.partition_id)
                response.records.extend(records)  # the storage's messages, copied once in C
                yield response
        except RangeError as exc:
            code = grpc.StatusCode.NOT_FOUND if exc.missing else grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(code, str(exc))
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"partition {partition.partition_id}: {exc}")

    async def GetServerPartitions(
        self, request: server_pb2.ServerPartitionsRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.ServerPartitionsResponse:
        return server_pb2.ServerPartitionsResponse(
            server_id=self._server_id(), partitions=[partition_status(p) for p in self._manager.all()]
        )

    async def CheckStorageConnectivity(
        self, request: server_pb2.StorageConnectivityRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.StorageConnectivityResponse:
        if self._connectivity is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server has no storage connections to check")
        nodes = await self._connectivity()  # type: ignore[misc]
        return server_pb2.StorageConnectivityResponse(
            nodes=[
                server_pb2.StorageConnectivity(connect_string=name, connected=ok, detail=detail)
                for name, (ok, detail) in sorted(nodes.items())
            ]
        )

    _discovery: ClusterView | None = None

    def serve_discovery(self, view: ClusterView) -> None:
        """Answer GetClusterInfo and GetClientId from view from now on."""
        self._discovery = view

    async def GetClusterInfo(
        self, request: server_pb2.ClusterInfoRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.ClusterInfoResponse:
        response = self._discovery.response(self._server_id()) if self._discovery is not None else None
        if response is None:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "this server has not read the cluster's assignment yet")
        return response

    async def GetClientId(
        self, request: server_pb2.ClientIdRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.ClientIdResponse:
        if self._discovery is None:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "this server is not registered in the cluster yet")
        pem = tls.peer_pem(context) if self._identities is not None else None
        try:
            client_id = await self._take_client_id(ClientIdentity.of_certificate(pem) if pem is not None else None)
        except Exception as exc:  # ZooKeeper unreachable, or the counter exhausted: another server may do
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"cannot take a client id: {exc}")
        return server_pb2.ClientIdResponse(client_id=client_id)

    async def _take_client_id(self, caller: ClientIdentity | None) -> int:
        """A new client id, bound to caller (mutual TLS) before anyone else may mount under it."""
        assert self._discovery is not None
        for _ in range(CLAIM_ATTEMPTS):
            client_id = await self._discovery.take_client_id()
            if caller is None or self._identities is None or await self._identities.claim(client_id, caller):
                return client_id
            log.warning("client id %d was bound before it was handed out; taking another", client_id)
        raise RuntimeError(f"{CLAIM_ATTEMPTS} client ids in a row were bound already")

    async def _partition(self, pid: int, context: grpc.aio.ServicerContext) -> Partition:
        if not 0 <= pid < self._manager.num_partitions:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"partition {pid} does not exist: the cluster has partitions 0-{self._manager.num_partitions - 1}",
            )
        partition = self._manager.get(pid)
        if partition is None:
            await _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"partition {pid} is not owned by server {self._server_id()}: ask its owner",
            )
        if not partition.ready:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"partition {pid} is not ready yet: retry shortly")
        return partition


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable: abort raises")


def partition_status(partition: Partition) -> server_pb2.ServerPartitionStatus:
    store = partition.store.status()
    healthy = partition.ready and store.healthy
    detail = partition.failure or ("" if healthy else (store.detail or "store session not open"))
    return server_pb2.ServerPartitionStatus(
        partition_id=partition.partition_id,
        generation=partition.generation,
        session_id=store.session_id,
        high_water_mark=partition.high_water_mark,
        healthy=healthy,
        pending_appends=partition.pending_appends(),
        detail=detail,
        write_set=sorted(store.write_set),
    )


SERVICE_NAME = server_pb2.DESCRIPTOR.services_by_name["WaltzServer"].full_name


# Who may call the client port with TLS on (docs/security.md): applications, and operators (the CLI's
# client and server commands); the admin queries (what a server owns, which storage nodes it reaches) only
# operators.
CLIENT_PORT_ROLES = ("application", "operator")
OPERATOR_METHODS = {
    f"/{SERVICE_NAME}/{name}": ("operator",) for name in ("GetServerPartitions", "CheckStorageConnectivity")
}


class _Registration:
    """Stands for the gRPC server in server_pb2_grpc.add_WaltzServerServicer_to_server and passes on its handlers,
    the Stream's with stream_answer as its serializer: coalesced feed batches are written as bytes."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_StreamAnswers(handler) for handler in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(
            service, {name: _stream_answers(h) if name == "Stream" else h for name, h in handlers.items()})


class _StreamAnswers(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None or handler_call_details.method != f"/{SERVICE_NAME}/Stream":
            return handler
        return _stream_answers(handler)


def _stream_answers(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    return grpc.stream_stream_rpc_method_handler(
        handler.stream_stream, request_deserializer=handler.request_deserializer, response_serializer=stream_answer)


async def start_grpc_server(
    service: WaltzServerService,
    host: str,
    port: int,
    max_message_bytes: int = 16 * 1024 * 1024,
    files: tls.TlsFiles | None = None,
    limits: CallLimits | None = None,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """A started grpc.aio server with the Waltz service, health (NOT_SERVING until set) and reflection; mutual
    TLS admitting CLIENT_PORT_ROLES (OPERATOR_METHODS: operators only) when files are given; limits on calls and
    connections (default: LimitSettings' defaults); plain INVALID_ARGUMENT for requests that do not decode."""
    limits = limits if limits is not None else CallLimits(LimitSettings())
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        *keepalive_options(30_000, 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        *limits.settings.transport_options(),
        listen.NO_PORT_REUSE,  # a second process on the same port must fail to start, not share the clients
    ]
    guard = PortGuard(
        "Waltz server client port",
        CLIENT_PORT_ROLES if files is not None else None,
        OPERATOR_METHODS if files is not None else None,
        limits,
    )
    server = grpc.aio.server(options=options, interceptors=[guard])
    server_pb2_grpc.add_WaltzServerServicer_to_server(service, _Registration(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    reflection.enable(server, (SERVICE_NAME, health.SERVICE_NAME))
    bound = listen.add_grpc_port(server, host, port, files)
    await server.start()
    return server, bound, health_servicer
