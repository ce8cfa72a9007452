"""StorageConnection over real gRPC: Open, sequence-matched requests, Failure, loss, reconnect, timeouts."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from waltz.v1 import common_pb2, storage_pb2, storage_pb2_grpc
from waltz_common import cluster_admin, frames
from waltz_common.testing.local_cluster import free_port
from waltz_common.types import crc32
from waltz_common.zk import ZkPaths
from waltz_server.store.connection import (
    Code,
    StorageConnectionLost,
    StorageRpcError,
    StorageTimeout,
)
from waltz_server.store.connections import StorageConnections
from waltz_server.store.replica_session import ReplicaSession
from waltz_server.store.settings import StoreSettings
from waltz_storage import server
from waltz_storage.dispatch import Limits
from waltz_storage.node import StorageNode
from waltz_storage.storage_manager import StorageManager

KEY = str(uuid.UUID(int=42))
FAST = StoreSettings(initial_retry_interval_s=0.02, max_retry_interval_s=0.2, request_timeout_s=20.0,
                     use_session_port=True)  # a node's framed port is used when it has one (the param below)


@pytest.fixture(autouse=True, params=["framed", "grpc"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every test runs with nodes that have a framed session port (used) and with nodes without one (gRPC)."""
    TRANSPORT[0] = request.param
    return str(request.param)


TRANSPORT = ["framed"]


def run(test: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(60):
            await test()

    asyncio.run(bounded())


async def start_node(
    directory: Path, port: int = 0, partitions: tuple[int, ...] = (0, 1), advertised_port: int = 0
) -> server.NodeServers:
    with StorageManager(directory, uuid.UUID(KEY), 2) as manager:
        for pid in partitions:
            manager.assign(pid)
    node = StorageNode.open(
        directory, uuid.UUID(KEY), 2, limits=Limits(4 << 20, 16 << 20), segment_size_threshold=1 << 30
    )
    session_port = 0 if TRANSPORT[0] == "framed" else None
    return await server.start(
        node, "127.0.0.1", port, 0, session_port=session_port, session_advertised_port=advertised_port
    )


def record(transaction_id: int, size: int = 0) -> common_pb2.Record:
    data = b"d%d" % transaction_id + bytes(size)
    return common_pb2.Record(
        transaction_id=transaction_id, req_id=common_pb2.ReqId(), data_length=len(data), data=data, checksum=crc32(data)
    )


def test_requests_on_one_stream_are_matched_to_their_answers_across_partitions(tmp_path: Path) -> None:
    async def test() -> None:
        node = await start_node(tmp_path)
        pool = StorageConnections(KEY, 2, FAST)
        try:
            connection = pool.get(f"127.0.0.1:{node.storage_port}")
            assert pool.get(connection.connect_string) is connection
            epoch = await connection.wait_connected()
            assert connection.transport == TRANSPORT[0]
            replicas = [ReplicaSession(connection, epoch, pid, 0) for pid in (0, 1)]
            for pid, replica in enumerate(replicas):
                await replica.set_low_water_mark(-1)
                await replica.append([record(i) for i in range(10 * (pid + 1))])
            answers = await asyncio.gather(*(replicas[i % 2].records(i // 2, 3) for i in range(40)))
            for i, got in enumerate(answers):
                first = i // 2
                expected = [t for t in range(first, first + 3) if t < 10 * (i % 2 + 1)]
                assert [r.transaction_id for r in got] == expected
            assert await replicas[1].max_transaction_id() == 19
            assert (await replicas[0].last_session_info()).session_id == 0
            assert await pool.check_connectivity() == {connection.connect_string: (True, "connected")}
        finally:
            await pool.close()
            await node.stop(0)

    run(test)


def test_the_pool_takes_the_cluster_key_and_partition_count_from_zookeeper(
    tmp_path: Path, zk: Any, cluster_root: str
) -> None:
    async def test() -> None:
        paths = ZkPaths(cluster_root)
        key = cluster_admin.create_cluster(zk, paths, "pool", 2)
        directory = tmp_path / "node"
        with StorageManager(directory, uuid.UUID(key), 2) as manager:
            manager.assign(0)
        node = StorageNode.open(
            directory, uuid.UUID(key), 2, limits=Limits(1 << 20, 1 << 23), segment_size_threshold=1 << 30
        )
        servers = await server.start(node, "127.0.0.1", 0, 0)
        pool = await StorageConnections.from_zookeeper(zk, paths, FAST)
        try:
            connection = pool.get(f"127.0.0.1:{servers.storage_port}")
            epoch = await connection.wait_connected()
            assert await ReplicaSession(connection, epoch, 0, 0).max_transaction_id() == -1
        finally:
            await pool.close()
            await servers.stop(0)

    run(test)


def test_messages_larger_than_grpcs_default_limit_go_both_ways(tmp_path: Path) -> None:
    async def test() -> None:
        node = await start_node(tmp_path)
        pool = StorageConnections(KEY, 2, FAST)
        try:
            connection = pool.get(f"127.0.0.1:{node.storage_port}")
            epoch = await connection.wait_connected()
            replica = ReplicaSession(connection, epoch, 0, 0)
            await replica.append([record(i, 2 << 20) for i in range(3)])  # 6 MiB in one request
            got = await replica.records(0, 3)  # and in one answer
            assert [len(r.data) for r in got] == [(2 << 20) + 2] * 3
        finally:
            await pool.close()
            await node.stop(0)

    run(test)


def test_a_failure_answer_raises_storage_rpc_error_with_its_code(tmp_path: Path) -> None:
    async def test() -> None:
        node = await start_node(tmp_path, partitions=(0,))
        pool = StorageConnections(KEY, 2, FAST)
        try:
            connection = pool.get(f"127.0.0.1:{node.storage_port}")
            epoch = await connection.wait_connected()
            with pytest.raises(StorageRpcError) as unknown:
                await ReplicaSession(connection, epoch, 1, 0).max_transaction_id()
            assert unknown.value.code == Code.UNKNOWN_PARTITION
            await ReplicaSession(connection, epoch, 0, 5).set_low_water_mark(-1)  # raises the fence (a read does not)
            with pytest.raises(StorageRpcError) as stale:
                await ReplicaSession(connection, epoch, 0, 4).max_transaction_id()
            assert stale.value.code == Code.STALE_SESSION and "STALE_SESSION" in str(stale.value)
            assert connection.connected  # a Failure is an answer, not a broken stream
        finally:
            await pool.close()
            await node.stop(0)

    run(test)


def test_a_wrong_cluster_key_never_connects_and_says_why(tmp_path: Path) -> None:
    async def test() -> None:
        node = await start_node(tmp_path)
        pool = StorageConnections(str(uuid.UUID(int=7)), 2, FAST)
        try:
            connection = pool.get(f"127.0.0.1:{node.storage_port}")
            while "CLUSTER_KEY_MISMATCH" not in connection.last_error:
                await asyncio.sleep(0.02)
            connected, why = (await pool.check_connectivity())[connection.connect_string]
            assert not connected and "cluster key" in why
            with pytest.raises(StorageConnectionLost):
                await connection.request(
                    storage_pb2.StorageRequest(max_transaction_id=storage_pb2.MaxTransactionIdRequest())
                )
        finally:
            await pool.close()
            await node.stop(0)

    run(test)


def test_stream_loss_fails_the_epoch_and_the_connection_comes_back_with_a_new_one(tmp_path: Path) -> None:
    async def test() -> None:
        node = await start_node(tmp_path)
        port = node.storage_port
        pool = StorageConnections(KEY, 2, FAST)
        try:
            connection = pool.get(f"127.0.0.1:{port}")
            epoch = await connection.wait_connected()
            replica = ReplicaSession(connection, epoch, 0, 0)
            assert await replica.max_transaction_id() == -1
            watcher = asyncio.create_task(connection.wait_lost(epoch))
            await node.stop(0)
            await asyncio.wait_for(watcher, 30)
            assert not replica.alive
            with pytest.raises(StorageConnectionLost):
                await replica.max_transaction_id()
            node = await start_node(tmp_path / "again", port)
            new_epoch = await connection.wait_connected()
            assert new_epoch > epoch
            with pytest.raises(StorageConnectionLost):
                await replica.max_transaction_id()  # bound to the lost stream for good
            assert await ReplicaSession(connection, new_epoch, 0, 0).max_transaction_id() == -1
        finally:
            await pool.close()
            await node.stop(0)

    run(test)


class SilentStorage(storage_pb2_grpc.WaltzStorageServicer):
    """Answers Open, then never answers anything."""

    async def Session(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async for request in request_iterator:
            if request.WhichOneof("request") == "open":
                yield storage_pb2.StorageResponse(success=storage_pb2.SuccessResponse(seq_num=-1))


def test_an_unanswered_request_times_out_and_the_stream_stays_usable() -> None:
    async def test() -> None:
        silent = grpc.aio.server()
        storage_pb2_grpc.add_WaltzStorageServicer_to_server(SilentStorage(), silent)
        port = silent.add_insecure_port("127.0.0.1:0")
        await silent.start()
        pool = StorageConnections(KEY, 2, StoreSettings(request_timeout_s=0.2, use_session_port=True))
        try:
            connection = pool.get(f"127.0.0.1:{port}")
            await connection.wait_connected()
            request = storage_pb2.StorageRequest(max_transaction_id=storage_pb2.MaxTransactionIdRequest())
            with pytest.raises(StorageTimeout):
                await connection.request(request)
            assert connection.connected
        finally:
            await pool.close()
            await silent.stop(None)
        with pytest.raises(StorageConnectionLost):
            pool.get("127.0.0.1:1")

    run(test)


def test_a_connection_no_session_uses_is_closed_after_the_idle_time_and_forgotten(tmp_path: Path) -> None:
    # a storage node removed from the cluster must not be reconnected to (and reported down) for ever
    async def test() -> None:
        node = await start_node(tmp_path)
        pool = StorageConnections(KEY, 2, FAST, idle_close_s=0.3)
        address = f"127.0.0.1:{node.storage_port}"
        try:
            connection = pool.get(address)
            await connection.wait_connected()
            pool.release(address)
            await asyncio.sleep(0.1)
            assert pool.get(address) is connection  # taken back within the idle time: kept
            pool.get(address)
            pool.release(address)
            await asyncio.sleep(0.5)
            assert connection.connected  # one user left
            pool.release(address)
            await asyncio.sleep(0.5)
            assert not connection.connected
            assert await pool.check_connectivity() == {}
            again = pool.get(address)  # a later session opens a new one
            assert again is not connection
            await again.wait_connected()
        finally:
            await pool.close()
            await node.stop(0)

    run(test)


def test_the_grpc_stream_serves_when_the_advertised_session_port_cannot_be_reached_or_is_turned_off(
    tmp_path: Path, transport: str
) -> None:
    if transport != "framed":
        pytest.skip("about nodes with a session port")

    async def test() -> None:
        node = await start_node(tmp_path, advertised_port=free_port())  # nobody listens there (a wrong mapping)
        pools = [StorageConnections(KEY, 2, FAST), StorageConnections(KEY, 2, replace(FAST, use_session_port=False))]
        try:
            for pool in pools:
                connection = pool.get(f"127.0.0.1:{node.storage_port}")
                epoch = await connection.wait_connected()
                assert connection.transport == "grpc"
                assert await ReplicaSession(connection, epoch, 0, 0).max_transaction_id() == -1
        finally:
            for pool in pools:
                await pool.close()
            await node.stop(0)

    run(test)


class FrozenAfterOpen:
    """A framed session port that answers the first Open and then reads on, never answering (a frozen node:
    its kernel keeps the TCP connection up)."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.opens = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (data := await frames.read_frame(reader, 1 << 20)) is not None:
            request = storage_pb2.StorageRequest.FromString(data)
            if request.WhichOneof("request") == "open":
                self.opens += 1
                if self.opens == 1:
                    answer = storage_pb2.StorageResponse(success=storage_pb2.SuccessResponse(seq_num=-1))
                    frames.write_frame(writer, answer.SerializeToString())


class AdvertisingStorage(storage_pb2_grpc.WaltzStorageServicer):
    """Answers Open on gRPC with a session port (and nothing else)."""

    def __init__(self, session_port: int) -> None:
        self.session_port = session_port

    async def Session(self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async for request in request_iterator:
            if request.WhichOneof("request") == "open":
                yield storage_pb2.StorageResponse(
                    success=storage_pb2.SuccessResponse(seq_num=-1, session_port=self.session_port)
                )


def test_a_framed_node_that_stops_answering_is_noticed_by_the_keepalive_ping_while_idle(transport: str) -> None:
    if transport != "framed":
        pytest.skip("about the framed transport")

    async def test() -> None:
        frozen = FrozenAfterOpen()
        listener = await asyncio.start_server(frozen.serve, "127.0.0.1", 0)
        grpc_server = grpc.aio.server()
        storage_pb2_grpc.add_WaltzStorageServicer_to_server(
            AdvertisingStorage(listener.sockets[0].getsockname()[1]), grpc_server
        )
        port = grpc_server.add_insecure_port("127.0.0.1:0")
        await grpc_server.start()
        pool = StorageConnections(KEY, 2, replace(FAST, keepalive_time_s=0.2, request_timeout_s=30.0))
        try:
            connection = pool.get(f"127.0.0.1:{port}")
            epoch = await connection.wait_connected()
            assert connection.transport == "framed"
            started = asyncio.get_running_loop().time()
            await asyncio.wait_for(connection.wait_lost(epoch), 5)
            assert asyncio.get_running_loop().time() - started < 2  # two keepalive periods, not the request timeout
            assert frozen.opens >= 2  # the Open of the connection, then the unanswered ping
        finally:
            await pool.close()
            await grpc_server.stop(None)
            listener.close()

    run(test)
