"""The real transport: partition ownership from ZooKeeper, grpc.aio streams and unary calls."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz.v1 import metadata_pb2, server_pb2, server_pb2_grpc
from waltz_client.config import ClientConfig
from waltz_client.connection import MAX_RECONNECT_DELAY_S
from waltz_client.driver import ClusterInfo, Driver, Ownership, ServerStream, Topology
from waltz_client.errors import StreamClosedError, WaltzError
from waltz_common import zk as zkmeta
from waltz_common.types import INT32_MAX

log = logging.getLogger(__name__)


class ZkTopologyWatcher:
    """Watches <root>/partitions and <root>/servers/*; reports partition -> Ownership on change.

    Runs on kazoo's thread; `report` must be thread-safe (the driver hops onto the event loop).
    """

    def __init__(self, zk: KazooClient, paths: zkmeta.ZkPaths, report: Callable[[Topology], bool]) -> None:
        self._zk = zk
        self._paths = paths
        self._report = report
        self._lock = threading.Lock()
        self._assignment: dict[int, tuple[int, int]] = {}  # partition -> (server id, generation)
        self._servers: dict[int, str] = {}  # server id -> host:port
        self._last: dict[int, Ownership] | None = None
        self._stopped = False

    def start(self) -> None:
        self._zk.DataWatch(self._paths.server_assignment, self._on_assignment)
        self._zk.ChildrenWatch(self._paths.servers, self._on_servers)

    def stop(self) -> None:
        self._stopped = True

    def _on_assignment(self, data: bytes | None, _stat: Any) -> bool:
        assignment = metadata_pb2.ServerAssignment()
        if data:
            assignment.ParseFromString(data)
        with self._lock:
            self._assignment = {p.partition_id: (p.server_id, p.generation) for p in assignment.partitions}
        return self._publish()

    def _on_servers(self, children: list[str]) -> bool:
        servers: dict[int, str] = {}
        for child in children:
            try:
                data, _ = self._zk.get(f"{self._paths.servers}/{child}")
            except NoNodeError:
                continue  # gone between the listing and the read
            descriptor = metadata_pb2.ServerDescriptor()
            descriptor.ParseFromString(data)
            servers[descriptor.server_id] = f"{descriptor.host}:{descriptor.port}"
        with self._lock:
            self._servers = servers
        return self._publish()

    def _publish(self) -> bool:
        if self._stopped:
            return False  # kazoo stops the watch
        with self._lock:
            topology = {
                pid: Ownership(self._servers.get(server_id) if server_id >= 0 else None, generation)
                for pid, (server_id, generation) in self._assignment.items()
            }
            if topology == self._last:
                return True
            self._last = topology
        return self._report(topology)


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

    async def start(self, on_topology: Callable[[Topology], None]) -> ClusterInfo:
        loop = asyncio.get_running_loop()
        cfg = self.config
        paths = zkmeta.ZkPaths(cfg.cluster_root)
        self._zk = await asyncio.to_thread(
            zkmeta.connect, cfg.zookeeper_connect_string, cfg.zookeeper_connect_timeout_s,
            cfg.zookeeper_session_timeout_s)
        zk = self._zk
        params = await asyncio.to_thread(zkmeta.store_params, zk, paths)
        cluster = await asyncio.to_thread(zkmeta.read, zk, paths.cluster, metadata_pb2.ClusterParams)
        client_id = await asyncio.to_thread(self._take_client_id, zk, paths)

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

    @staticmethod
    def _take_client_id(zk: KazooClient, paths: zkmeta.ZkPaths) -> int:
        counter = zk.Counter(paths.client_ids)
        counter += 1
        client_id = int(counter.post_value)
        if client_id > INT32_MAX:
            raise WaltzError(f"the client id counter {paths.client_ids} is exhausted")
        return client_id

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            # The channel lives as long as the client: its own reconnect backoff (1 s growing 1.6 times per
            # failure up to 120 s by default) must not outgrow the connection manager's, or a server back after
            # an outage (a restart: its GOAWAY starts the backoff) is reached only many seconds later.
            backoff_ms = int(MAX_RECONNECT_DELAY_S * 1000)
            channel = grpc.aio.insecure_channel(endpoint, options=[
                ("grpc.keepalive_time_ms", self.config.keepalive_time_ms),
                ("grpc.keepalive_timeout_ms", 20000),
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

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await asyncio.to_thread(_stop_zk, zk)


def _stop_zk(zk: KazooClient) -> None:
    zk.stop()
    zk.close()
