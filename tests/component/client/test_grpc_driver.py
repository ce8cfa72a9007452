"""The gRPC + ZooKeeper driver against the mock's server semantics served over real gRPC.

Real: ZooKeeper (ids counter, ownership watches), grpc.aio channels, streams and unary calls.
Stand-in on purpose: the server logic (MockServer behind a small servicer), so that each fault can be
injected exactly where the test wants it. The client against the real server is tested in
tests/integration/client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from kazoo.client import KazooClient

from tests.component.client.helpers import FAST, Ctx, MemoryCallbacks, eventually, payloads, run
from waltz.v1 import metadata_pb2, server_pb2, server_pb2_grpc
from waltz_client import AsyncWaltzClient, MockServer
from waltz_client.errors import StreamClosedError
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.zookeeper import ZooKeeperProcess


class MockServicer(server_pb2_grpc.WaltzServerServicer):
    def __init__(self, mock: MockServer) -> None:
        self.mock = mock

    async def Stream(self, request_iterator: AsyncIterator[server_pb2.ClientMessage],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[server_pb2.ServerMessage]:
        stream = self.mock.connect()

        async def pump() -> None:
            async for message in request_iterator:
                await stream.send(message)

        task = asyncio.ensure_future(pump())
        try:
            while True:
                yield await stream.receive()
        except StreamClosedError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection cut by the test")
        finally:
            task.cancel()
            await stream.close()

    async def GetTransactionData(self, request: server_pb2.TransactionDataRequest,
                                 context: grpc.aio.ServicerContext) -> server_pb2.TransactionDataResponse:
        return self.mock.transaction_data(request)

    async def GetHighWaterMark(self, request: server_pb2.HighWaterMarkRequest,
                               context: grpc.aio.ServicerContext) -> server_pb2.HighWaterMarkResponse:
        return server_pb2.HighWaterMarkResponse(
            partition_id=request.partition_id, high_water_mark=self.mock.high_water_mark(request.partition_id))


async def serve(mock: MockServer) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    server_pb2_grpc.add_WaltzServerServicer_to_server(MockServicer(mock), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def register(zk: KazooClient, paths: zkmeta.ZkPaths, server_id: int, port: int) -> None:
    descriptor = metadata_pb2.ServerDescriptor(server_id=server_id, host="127.0.0.1", port=port)
    zkmeta.create(zk, paths.server(server_id), descriptor, ephemeral=True)


def assign(zk: KazooClient, paths: zkmeta.ZkPaths, owners: dict[int, tuple[int, int]]) -> None:
    assignment = metadata_pb2.ServerAssignment(partitions=[
        metadata_pb2.PartitionOwnership(partition_id=p, server_id=s, generation=g) for p, (s, g) in owners.items()])
    zkmeta.write(zk, paths.server_assignment, assignment)


@pytest.fixture
def cluster(zk: KazooClient, cluster_root: str, zookeeper: ZooKeeperProcess) -> dict:
    paths = zkmeta.ZkPaths(cluster_root)
    cluster_admin.create_cluster(zk, paths, "grpc-test", 2)
    return {"zookeeper.connectString": zookeeper.connect_string, "cluster.root": cluster_root, **FAST}


@pytest.mark.callback_modes("thread")  # the reader's applies fetch the writer's data
def test_grpc_client_commits_fetches_data_and_survives_cuts(zk: KazooClient, cluster: dict) -> None:
    paths = zkmeta.ZkPaths(cluster["cluster.root"])
    mock = MockServer(2)

    async def main() -> None:
        server, port = await serve(mock)
        register(zk, paths, 1, port)
        assign(zk, paths, {0: (1, 0), 1: (1, 0)})
        writer_cb, reader_cb = MemoryCallbacks(), MemoryCallbacks()
        try:
            async with AsyncWaltzClient(writer_cb, cluster) as writer, AsyncWaltzClient(reader_cb, cluster) as reader:
                assert (writer.client_id, reader.client_id) == (1, 2)  # from <root>/ids/client
                assert writer.num_partitions == 2 and writer.cluster_name == "grpc-test"
                futures = [await writer.submit(Ctx(b"t%d" % i, partition=i)) for i in range(10)]
                mock.disconnect(writer.client_id)
                futures += [await writer.submit(Ctx(b"u%d" % i, partition=i)) for i in range(10)]
                assert await asyncio.gather(*futures) == [True] * 20
                assert await writer.high_water_mark(0) == 9
                # the reader applies the writer's transactions, fetching their data by RPC
                await eventually(lambda: sum(len(v) for v in reader_cb.applied.values()) == 20)
            for p in (0, 1):
                assert [d for _, d in reader_cb.applied[p]] == payloads(mock, p)
                assert [d for _, d in writer_cb.applied[p]] == payloads(mock, p)
        finally:
            await server.stop(None)

    run(main())


def test_grpc_client_follows_a_partition_to_its_new_server(zk: KazooClient, cluster: dict) -> None:
    paths = zkmeta.ZkPaths(cluster["cluster.root"])
    mock = MockServer(2)

    async def main() -> None:
        first, first_port = await serve(mock)
        second, second_port = await serve(mock)
        register(zk, paths, 1, first_port)
        register(zk, paths, 2, second_port)
        assign(zk, paths, {0: (1, 0), 1: (1, 0)})
        try:
            async with AsyncWaltzClient(MemoryCallbacks(), cluster) as c:
                assert await (await c.submit(Ctx(b"before"))) is True
                mock.bump_generation(0)  # the failover: the old owner rejects generation 0
                await first.stop(None)
                assign(zk, paths, {0: (2, 1), 1: (2, 0)})
                assert await (await c.submit(Ctx(b"after"))) is True
                assert await (await c.submit(Ctx(b"other", partition=1))) is True
            records = mock.records(0)
            assert [r.data for r in records] == [b"before", b"after"]
            assert records[1].req_id.generation == 1
        finally:
            await second.stop(None)

    run(main())


def test_a_missing_cluster_is_a_clear_error(zookeeper: ZooKeeperProcess, cluster_root: str) -> None:
    async def main() -> None:
        config = {"zookeeper.connectString": zookeeper.connect_string, "cluster.root": cluster_root}
        c = AsyncWaltzClient(MemoryCallbacks(), config)
        with pytest.raises(zkmeta.MetadataError, match="has the cluster been created"):
            await c.start()
        await c.close()

    run(main())
