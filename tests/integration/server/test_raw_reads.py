"""ReadTransactions raw=true against a real cluster: the runs hold exactly the records raw=false gives, whatever
the range and batch size, and a record rotten on one replica is still served intact from another (and repaired)."""

from __future__ import annotations

import asyncio
import struct
import time

import grpc

from tests.component.server.harness import run
from tests.component.server.helpers import append
from tests.integration.server.test_server_end_to_end import fed, mount_ready, read_until
from waltz.v1 import common_pb2, server_pb2, server_pb2_grpc
from waltz_common.record_layout import RECORD_CRC, RECORD_OVERHEAD, RECORD_PREFIX, RECORD_PREFIX_SIZE
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.types import crc32, crc32_unsigned

COUNT = 3000
READ_BATCH = 5000  # server.readBatchSize's default: batch sizes above it are capped


def data_of(i: int) -> bytes:
    return (b"%d." % i) * ((i * 37) % 90)  # 0 to about 400 bytes; every 90th is empty


def decoded(response: server_pb2.ReadTransactionsResponse) -> list[common_pb2.Record]:
    """A raw response's records, with every check a reader makes: ends increasing to the end of the bytes, each
    record's size, transaction id in sequence, record CRC and data checksum."""
    got = response.run
    assert not response.records and got.count > 0 and len(got.ends) == 4 * got.count
    ends = struct.unpack(f"<{got.count}I", got.ends)
    assert ends[-1] == len(got.records)
    records, start = [], 0
    for i, end in enumerate(ends):
        assert end - start >= RECORD_OVERHEAD
        txn, client_id, generation, partition_id, seq_num, header, length, checksum = RECORD_PREFIX.unpack_from(
            got.records, start
        )
        assert txn == got.first_transaction_id + i and length == end - start - RECORD_OVERHEAD
        assert RECORD_CRC.unpack_from(got.records, end - 4)[0] == crc32_unsigned(got.records[start : end - 4])
        data = got.records[start + RECORD_PREFIX_SIZE : end - 4]
        assert crc32(data) == checksum
        req_id = common_pb2.ReqId(
            client_id=client_id, generation=generation, partition_id=partition_id, seq_num=seq_num
        )
        records.append(
            common_pb2.Record(
                transaction_id=txn, req_id=req_id, header=header, data_length=length, data=data, checksum=checksum
            )
        )
        start = end
    return records


async def both_ways(stub, first: int, last: int, batch: int) -> tuple[list, list]:
    """The records of [first, last] read with raw=false and with raw=true (decoded); checks the runs' messages."""
    request = server_pb2.ReadTransactionsRequest(
        partition_id=0, from_transaction_id=first, to_transaction_id=last, batch_size=batch
    )
    messages = [list(response.records) async for response in stub.ReadTransactions(request)]
    request.raw = True
    responses = [response async for response in stub.ReadTransactions(request)]
    assert [r.run.count for r in responses] == [len(m) for m in messages]  # split alike, at most the batch size
    assert max(map(len, messages)) <= (min(batch, READ_BATCH) if batch > 0 else READ_BATCH)
    assert [r.run.first_transaction_id for r in responses] == [m[0].transaction_id for m in messages]
    return [r for m in messages for r in m], [r for response in responses for r in decoded(response)]


async def fill(stub) -> None:
    """COUNT transactions of data_of(i), committed (every one in the appender's feed)."""
    writer = stub.Stream()
    await mount_ready(writer, client_id=1)
    for start in range(0, COUNT, 500):
        batch = [append(1, i + 1, data=data_of(i), header=i % 7) for i in range(start, start + 500)]
        await writer.write(server_pb2.ClientMessage(appends=server_pb2.AppendBatch(requests=batch)))
    received: list = []
    await read_until(writer, received, lambda r: len(fed(r)) == COUNT)
    writer.cancel()


def flip(path, offset: int) -> bytes:
    """Flip a bit of the byte at offset in place (the storage node's open file sees it); the byte as it was."""
    with path.open("r+b") as f:
        f.seek(offset)
        intact = f.read(1)
        f.seek(offset)
        f.write(bytes([intact[0] ^ 0x20]))
    return intact


def test_raw_reads_give_the_records_and_survive_a_rotten_replica(tmp_path):
    with LocalCluster(tmp_path, storage_nodes=3, servers=1, partitions=1) as cluster:

        async def scenario():
            async with grpc.aio.insecure_channel(cluster.servers[0].address) as channel:
                stub = server_pb2_grpc.WaltzServerStub(channel)
                await fill(stub)
                for first, last, batch in ((0, COUNT - 1, 0), (0, 999, 7), (5, 2100, 333), (1234, 1234, 1),
                                           (17, COUNT - 1, 1000), (89, 181, 2)):
                    plain, raw = await both_ways(stub, first, last, batch)
                    assert len(plain) == last - first + 1 and raw == plain, (first, last, batch)
                assert any(not r.data for r in plain)
                expected, _ = await both_ways(stub, 0, COUNT - 1, 0)

                # Rot a data byte of transaction 1501 on the replica reads go to first (the first by name).
                node = min(cluster.storage, key=lambda n: n.connect_string)
                segment = node.directory / "0" / f"{0:019d}.seg"
                (offset,) = struct.unpack(">q", (segment.with_suffix(".idx")).read_bytes()[128 + 8 * 1501 :][:8])
                intact = flip(segment, offset + RECORD_PREFIX_SIZE)
                request = server_pb2.ReadTransactionsRequest(
                    partition_id=0, from_transaction_id=1400, to_transaction_id=1600, batch_size=50, raw=True
                )
                raw = [r async for response in stub.ReadTransactions(request) for r in decoded(response)]
                assert raw == expected[1400:1601] and raw[101].data == data_of(1501)

                # The CORRUPTED answer made the server look for damage: a new session repairs the rotten copy.
                deadline = time.monotonic() + 60
                while True:
                    with segment.open("rb") as f:
                        f.seek(offset + RECORD_PREFIX_SIZE)
                        if f.read(1) == intact:
                            break
                    assert time.monotonic() < deadline, "the rotten record was never repaired"
                    await asyncio.sleep(0.5)

        run(scenario, timeout=180)
