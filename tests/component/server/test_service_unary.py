"""Unary calls over a real channel: transaction data, high-water mark, range reads, admin, health."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from waltz.v1 import server_pb2
from waltz_common.types import crc32
from waltz_server.store.wire import encode_pending

from .grpc_harness import served
from .harness import run
from .helpers import append, mount, req


async def commit(s, count: int, partition_id: int = 0) -> None:
    stream = s.open_stream()
    await stream.send(mount=mount(partition_id=partition_id))
    await stream.receive_until(lambda h: h.of("mount"))
    batch = [append(seq=i, data=b"d%d" % i, partition_id=partition_id) for i in range(1, count + 1)]
    await stream.send(appends=server_pb2.AppendBatch(requests=batch))
    await stream.receive_until(lambda h: len(h.fed()) == count)


async def status_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value.code(), error.value.details()


def test_transaction_data_from_cache_and_store_and_missing():
    async def scenario():
        async with served() as s:
            await commit(s, 3)
            answer = await s.stub.GetTransactionData(server_pb2.TransactionDataRequest(req_id=req(), transaction_id=1))
            assert answer.success and answer.data == b"d2" and answer.checksum == crc32(b"d2")
            assert answer.data_length == 2 and s.stores[0].record_reads == 0  # from the cache
            s.manager.get(0).data_cache.clear()
            again = await s.stub.GetTransactionData(server_pb2.TransactionDataRequest(req_id=req(), transaction_id=1))
            assert again.data == b"d2" and s.stores[0].record_reads == 1
            missing = await s.stub.GetTransactionData(server_pb2.TransactionDataRequest(req_id=req(), transaction_id=5))
            assert not missing.success and "high-water mark 2" in missing.error_message

    run(scenario)


def test_high_water_mark_and_partition_errors():
    async def scenario():
        async with served() as s:
            await commit(s, 2)
            answer = await s.stub.GetHighWaterMark(server_pb2.HighWaterMarkRequest(partition_id=0))
            assert answer.high_water_mark == 1
            code, details = await status_of(s.stub.GetHighWaterMark(server_pb2.HighWaterMarkRequest(partition_id=4)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "partitions 0-3" in details
            code, details = await status_of(s.stub.GetHighWaterMark(server_pb2.HighWaterMarkRequest(partition_id=2)))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "partition 2 is not owned" in details
            code, _ = await status_of(
                s.stub.GetTransactionData(server_pb2.TransactionDataRequest(req_id=req(partition_id=-1)))
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT

    run(scenario)


def test_read_transactions_streams_the_range_in_batches():
    async def scenario():
        async with served() as s:
            await commit(s, 25)
            request = server_pb2.ReadTransactionsRequest(
                partition_id=0, from_transaction_id=3, to_transaction_id=20, batch_size=5
            )
            responses = [r async for r in s.stub.ReadTransactions(request)]
            assert [len(r.records) for r in responses] == [5, 5, 5, 3]
            ids = [rec.transaction_id for r in responses for rec in r.records]
            assert ids == list(range(3, 21))
            assert responses[0].records[0].data == b"d4"
            request.raw = True  # the same records as runs of the data files' bytes
            runs = [r.run async for r in s.stub.ReadTransactions(request)]
            assert [(r.first_transaction_id, r.count) for r in runs] == [(3, 5), (8, 5), (13, 5), (18, 3)]
            records = [rec for r in responses for rec in r.records]
            for i, got in enumerate(runs):
                assert got.records == encode_pending(got.first_transaction_id, records[5 * i : 5 * i + got.count])
            beyond = server_pb2.ReadTransactionsRequest(partition_id=0, from_transaction_id=0, to_transaction_id=30)
            code, details = await status_of(_drain(s.stub.ReadTransactions(beyond)))
            assert code == grpc.StatusCode.NOT_FOUND and "high-water mark 24" in details
            backwards = server_pb2.ReadTransactionsRequest(partition_id=0, from_transaction_id=5, to_transaction_id=2)
            code, _ = await status_of(_drain(s.stub.ReadTransactions(backwards)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT

    run(scenario)


def test_read_transactions_refuses_a_store_answer_that_is_not_dense():
    async def scenario():
        async with served() as s:
            await commit(s, 10)
            store = s.stores[0]
            honest = store.get_records

            async def gap(first, count):
                records = await honest(first, count)
                return [r for r in records if r.transaction_id != first + 2]

            async def too_many(first, count):
                return await honest(first, count + 1)

            for broken in (gap, too_many):
                store.get_records = broken
                read = server_pb2.ReadTransactionsRequest(partition_id=0, from_transaction_id=0, to_transaction_id=6)
                code, details = await status_of(_drain(s.stub.ReadTransactions(read)))
                assert code == grpc.StatusCode.UNAVAILABLE and "for 7 from 0" in details, details

    run(scenario)


async def _drain(call) -> None:
    async for _ in call:
        pass


def test_server_partitions_connectivity_and_health():
    async def check() -> dict[str, tuple[bool, str]]:
        return {"127.0.0.1:9001": (True, "connected"), "127.0.0.1:9002": (False, "refused")}

    async def scenario():
        async with served(owned=(0, 1), connectivity=check) as s:
            await commit(s, 2, partition_id=1)
            answer = await s.stub.GetServerPartitions(server_pb2.ServerPartitionsRequest())
            assert answer.server_id == 7
            assert [(p.partition_id, p.generation, p.healthy) for p in answer.partitions] == [
                (0, 1, True),
                (1, 1, True),
            ]
            assert answer.partitions[1].high_water_mark == 1 and answer.partitions[0].high_water_mark == -1
            nodes = await s.stub.CheckStorageConnectivity(server_pb2.StorageConnectivityRequest())
            assert [(n.connect_string, n.connected) for n in nodes.nodes] == [
                ("127.0.0.1:9001", True),
                ("127.0.0.1:9002", False),
            ]
            probe = health_pb2_grpc.HealthStub(s.channel)
            status = await probe.Check(health_pb2.HealthCheckRequest(service=""))
            assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING  # until ZooKeeper says so
            await s.health.set("", health_pb2.HealthCheckResponse.SERVING)
            status = await probe.Check(health_pb2.HealthCheckRequest(service=""))
            assert status.status == health_pb2.HealthCheckResponse.SERVING

    run(scenario)


def test_store_between_sessions_answers_unavailable():
    async def scenario():
        from waltz_server.store.api import StoreUnavailable

        async with served() as s:
            await commit(s, 2)
            s.manager.get(0).data_cache.clear()

            async def no_session(*_args):
                raise StoreUnavailable("recovering")

            s.stores[0].get_record = no_session
            s.stores[0].get_records = no_session
            request = server_pb2.TransactionDataRequest(req_id=req(), transaction_id=1)
            code, details = await status_of(s.stub.GetTransactionData(request))
            assert code == grpc.StatusCode.UNAVAILABLE and "recovering" in details
            read = server_pb2.ReadTransactionsRequest(partition_id=0, from_transaction_id=0, to_transaction_id=1)
            code, _ = await status_of(_drain(s.stub.ReadTransactions(read)))
            assert code == grpc.StatusCode.UNAVAILABLE

    run(scenario)
