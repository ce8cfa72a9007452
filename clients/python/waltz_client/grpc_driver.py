"""The real transport: partition ownership from ZooKeeper, grpc.aio streams and unary calls.

kazoo (the `zookeeper` extra) is imported only when a client starts with ZooKeeper discovery
(client.servers empty): require_zookeeper() says what to install when it is missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from waltz.v1 import common_pb2, metadata_pb2, server_pb2, server_pb2_grpc
from waltz_client.config import ClientConfig
from waltz_client.connection import MAX_RECONNECT_DELAY_S
from waltz_client.driver import ClusterInfo, Driver, ServerStream, Topology
from waltz_client.errors import ConfigError, StreamClosedError, UnavailableError, WaltzError
from waltz_common import tls
from waltz_common.entry import install_command
from waltz_common.grpc_env import keepalive_options
from waltz_common.topology import ZkTopologyWatcher, take_client_id

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from waltz_common import zk as zkmeta

log = logging.getLogger(__name__)


class _GrpcStream(ServerStream):
    def __init__(self, call: Any, endpoint: str) -> None:
        self._call = call
        self._endpoint = endpoint

    async def send(self, message: server_pb2.ClientMessage) -> None:
        try:
            await self._call.write(message)
        except Exception as exc:
            raise StreamClosedError(f"{self._endpoint}: {_describe(exc)}") from None

    async def receive(self) -> server_pb2.ServerMessage:
        try:
            message = await self._call.read()
        except Exception as exc:
            raise StreamClosedError(f"{self._endpoint}: {_describe(exc)}") from None
        if message is grpc.aio.EOF:
            raise StreamClosedError(f"{self._endpoint} ended the stream")
        assert isinstance(message, server_pb2.ServerMessage)
        return message

    async def close(self) -> None:
        self._call.cancel()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


class GrpcDriver(Driver):
    """gRPC to the servers, ZooKeeper (kazoo, on its own thread) for ids and ownership."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._zk: KazooClient | None = None
        self._watcher: ZkTopologyWatcher | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._retired: list[grpc.aio.Channel] = []
        self._tls_stamp: object = None

    async def start(self, on_topology: Callable[[Topology], None]) -> ClusterInfo:
        require_zookeeper()
        from waltz_common import zk as zkmeta

        loop = asyncio.get_running_loop()
        cfg = self.config
        try:
            paths = zkmeta.ZkPaths(cfg.cluster_root)
        except zkmeta.MetadataError as exc:
            raise ConfigError(str(exc)) from None
        try:
            self._zk = await asyncio.to_thread(
                zkmeta.connect, cfg.zookeeper_connect_string, cfg.zookeeper_connect_timeout_s,
                cfg.zookeeper_session_timeout_s, cfg.zookeeper_security)
        except zkmeta.MetadataError as exc:
            raise UnavailableError(str(exc)) from None
        zk = self._zk
        params = await asyncio.to_thread(zkmeta.store_params, zk, paths)
        cluster = await asyncio.to_thread(zkmeta.read, zk, paths.cluster, metadata_pb2.ClusterParams)
        client_id = await asyncio.to_thread(_client_id, zk, paths)

        def report(topology: Topology) -> bool:
            try:
                loop.call_soon_threadsafe(on_topology, topology)
                return True
            except RuntimeError:
                return False  # the loop is closed: stop watching

        self._watcher = ZkTopologyWatcher(zk, paths, report)
        await asyncio.to_thread(self._watcher.start)
        name = cluster[0].name if cluster else ""
        return ClusterInfo(client_id, params.num_partitions, name)

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        """The endpoint's channel; a new one (TLS files read again) when the tls.* files changed on disk, so
        rotated certificates are used by the next stream or call. Retired channels close with the client."""
        files = self.config.tls
        stamp = files.stamp() if files is not None else None
        channel = self._channels.get(endpoint)
        if channel is not None and stamp != self._tls_stamp:
            self._retired.extend(self._channels.values())
            self._channels.clear()
            channel = None
        if channel is None:
            self._tls_stamp = stamp
            # The channel lives as long as the client: its own reconnect backoff (1 s growing 1.6 times per
            # failure up to 120 s by default) must not outgrow the connection manager's, or a server back after
            # an outage (a restart: its GOAWAY starts the backoff) is reached only many seconds later.
            backoff_ms = int(MAX_RECONNECT_DELAY_S * 1000)
            channel = tls.aio_channel(endpoint, files, [
                *keepalive_options(round(self.config.keepalive_time_s * 1000), 20000),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
                ("grpc.max_reconnect_backoff_ms", backoff_ms),
            ])
            self._channels[endpoint] = channel
        return channel

    async def open_stream(self, endpoint: str) -> ServerStream:
        stub = server_pb2_grpc.WaltzServerStub(self._channel(endpoint))
        return _GrpcStream(stub.Stream(), endpoint)

    async def get_transaction_data(
        self, endpoint: str, request: server_pb2.TransactionDataRequest, timeout: float
    ) -> server_pb2.TransactionDataResponse:
        stub = server_pb2_grpc.WaltzServerStub(self._channel(endpoint))
        response = await stub.GetTransactionData(request, timeout=timeout)
        assert isinstance(response, server_pb2.TransactionDataResponse)
        return response

    async def get_high_water_mark(self, endpoint: str, partition_id: int, timeout: float) -> int:
        stub = server_pb2_grpc.WaltzServerStub(self._channel(endpoint))
        response = await stub.GetHighWaterMark(
            server_pb2.HighWaterMarkRequest(partition_id=partition_id), timeout=timeout)
        return int(response.high_water_mark)

    async def read_transactions(
        self, endpoint: str, partition_id: int, first: int, last: int, timeout: float
    ) -> list[common_pb2.Record]:
        stub = server_pb2_grpc.WaltzServerStub(self._channel(endpoint))
        request = server_pb2.ReadTransactionsRequest(
            partition_id=partition_id, from_transaction_id=first, to_transaction_id=last)
        records: list[common_pb2.Record] = []
        async for response in stub.ReadTransactions(request, timeout=timeout):
            records.extend(response.records)
        return records

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        for channel in [*self._channels.values(), *self._retired]:
            await channel.close()
        self._channels.clear()
        self._retired.clear()
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await asyncio.to_thread(_stop_zk, zk)


def require_zookeeper() -> None:
    """A ConfigError saying what to install when kazoo (ZooKeeper discovery) is missing."""
    try:
        import kazoo  # noqa: F401
    except ImportError:
        raise ConfigError(
            "ZooKeeper discovery (zookeeper.connectString and cluster.root; client.servers is empty) needs kazoo: "
            f"{install_command('zookeeper')}, or set client.servers (WALTZ_CLIENT_SERVERS) to the servers' "
            "host:port and the client needs no ZooKeeper") from None


def _client_id(zk: KazooClient, paths: zkmeta.ZkPaths) -> int:
    from kazoo.exceptions import NoAuthError

    try:
        return take_client_id(zk, paths)
    except ValueError as exc:
        raise WaltzError(str(exc)) from None
    except NoAuthError:
        raise WaltzError(
            f"ZooKeeper refused this client a client id from {paths.client_ids} (NoAuth): the cluster's znodes carry "
            "an ACL (zookeeper.acl); set client.servers to take client ids from the servers, or add this client's "
            "ZooKeeper identity (zookeeper.auth) to the ACL"
        ) from None


def _stop_zk(zk: KazooClient) -> None:
    zk.stop()
    zk.close()
