"""One server over three real storage nodes: appends commit with dense ids, locks, feed, data reads."""

from __future__ import annotations

import asyncio

import grpc

from tests.component.server.harness import run
from tests.component.server.helpers import append, mount, req
from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_common.testing.local_cluster import LocalCluster


async def mount_ready(call, client_id: int, tries: int = 100) -> server_pb2.MountResponse:
    for attempt in range(tries):
        await call.write(server_pb2.ClientMessage(mount=mount(client_id=client_id, net_seq=attempt)))
        while True:
            message = await call.read()
            if message.HasField("mount"):
                break
        if message.mount.state == server_pb2.MountResponse.READY:
            return message.mount
        await asyncio.sleep(0.2)
    raise AssertionError("the partition never became ready")


async def read_until(call, received: list, predicate) -> None:
    while not predicate(received):
        message = await call.read()
        assert message is not grpc.aio.EOF
        received.append(message)


def fed(received: list) -> list[int]:
    return [f.transaction_id for m in received if m.HasField("feed") for f in m.feed.transactions]


def test_appends_commit_at_quorum_with_dense_ids_and_locks(tmp_path):
    with LocalCluster(tmp_path, storage_nodes=3, servers=1, partitions=1) as cluster:

        async def scenario():
            async with grpc.aio.insecure_channel(cluster.servers[0].address) as channel:
                stub = server_pb2_grpc.WaltzServerStub(channel)
                writer = stub.Stream()
                await mount_ready(writer, client_id=1)
                batch = [append(1, seq, data=b"t%d" % seq, write=(seq,), read=(seq + 1000,)) for seq in range(1, 301)]
                received: list = []
                for start in range(0, 300, 100):
                    requests = batch[start : start + 100]
                    await writer.write(server_pb2.ClientMessage(appends=server_pb2.AppendBatch(requests=requests)))
                await read_until(writer, received, lambda r: len(fed(r)) == 300)
                assert fed(received) == list(range(300))

                other = stub.Stream()
                await mount_ready(other, client_id=2)
                stale = append(2, 1, write=(3,), hwm=1)  # lock 3 was written by id 2
                fresh = append(2, 2, write=(3,), hwm=299)
                await other.write(server_pb2.ClientMessage(appends=server_pb2.AppendBatch(requests=[stale, fresh])))
                got: list = []
                await read_until(other, got, lambda r: any(m.HasField("lock_failure") for m in r) and 300 in fed(r))
                [failure] = [m.lock_failure for m in got if m.HasField("lock_failure")]
                assert failure.req_id.seq_num == 1 and failure.transaction_id == 2

                data = await stub.GetTransactionData(server_pb2.TransactionDataRequest(req_id=req(), transaction_id=7))
                assert data.success and data.data == b"t8"
                hwm = await stub.GetHighWaterMark(server_pb2.HighWaterMarkRequest(partition_id=0))
                assert hwm.high_water_mark == 300
                status = await stub.GetServerPartitions(server_pb2.ServerPartitionsRequest())
                assert status.partitions[0].healthy and status.partitions[0].session_id >= 0
                nodes = await stub.CheckStorageConnectivity(server_pb2.StorageConnectivityRequest())
                assert len(nodes.nodes) == 3 and all(n.connected for n in nodes.nodes)
                writer.cancel()
                other.cancel()

        run(scenario, timeout=180)
