"""read_task against a fake WaltzServer on loopback: ranges, resumption, checksum and order checks."""

import grpc
import pyarrow as pa
import pytest

from waltz_spark.cluster import PartitionUnavailable
from waltz_spark.reading import ARROW_SCHEMA, BatchBuilder, BrokenRange, ChecksumMismatch, ReadTask, check, read_task
from waltz_spark.testing import FakeWaltzServer, record


@pytest.fixture(params=[True, False], ids=["raw", "records"])
def server(request):
    """Serving record runs to the reader's raw requests, or Records as a server that predates raw does."""
    with FakeWaltzServer(partitions=2, batch_size=100) as fake:
        fake.serves_raw = request.param
        fake.append(0, 1000)
        fake.append(1, 10)
        yield fake


def task(server: FakeWaltzServer, partition: int, first: int, last: int, **kw) -> ReadTask:
    # The ZooKeeper address is never reached unless a retry needs to look the owner up.
    return ReadTask(
        zookeeper="127.0.0.1:1", root="/none", partition=partition, first=first, last=last, address=server.address, **kw
    )


def rows(batches) -> list[dict]:
    return pa.Table.from_batches(list(batches), schema=ARROW_SCHEMA).to_pylist()


def test_reads_a_range_with_every_column(server):
    got = rows(read_task(task(server, 0, 10, 509, batch_size=50)))
    assert [r["transaction_id"] for r in got] == list(range(10, 510))
    expected = server.logs[0][42]
    assert got[32] == {
        "partition": 0,
        "transaction_id": 42,
        "header": expected.header,
        "client_id": 7,
        "generation": 1,
        "seq_num": 142,
        "data": expected.data,
    }
    assert {r.batch_size for r in server.requests} == {50}


def test_the_reader_asks_for_runs_and_reads_the_same_rows_from_records():
    with FakeWaltzServer(partitions=1, batch_size=64) as fake:
        fake.append(0, 300, size=40)
        raw = rows(read_task(task(fake, 0, 5, 299)))
        fake.serves_raw = False
        assert rows(read_task(task(fake, 0, 5, 299))) == raw
        assert [r.raw for r in fake.requests] == [True, True]
        assert len(raw) == 295


def test_batches_are_arrow_with_the_source_schema(server):
    batches = list(read_task(task(server, 0, 0, 999)))
    assert all(b.schema == ARROW_SCHEMA for b in batches)
    assert sum(b.num_rows for b in batches) == 1000


def test_a_cut_stream_resumes_at_the_next_id_without_duplicates(server):
    server.cut_after = 250
    looked_up = []

    def locate(t: ReadTask, previous: str) -> str:
        looked_up.append(previous)
        return server.address

    got = rows(read_task(task(server, 0, 0, 999, timeout_s=10), locate))
    assert [r["transaction_id"] for r in got] == list(range(1000))
    assert [r.from_transaction_id for r in server.requests] == [0, 200]
    assert looked_up == [server.address]


def test_a_stream_resumed_at_a_server_that_predates_raw_reads_on_from_its_records():
    with FakeWaltzServer(partitions=1, batch_size=100) as fake:
        fake.append(0, 1000)
        fake.cut_after = 250

        def failover(t: ReadTask, previous: str) -> str:
            fake.serves_raw = False
            return fake.address

        got = rows(read_task(task(fake, 0, 0, 999, timeout_s=10), failover))
        assert [r["transaction_id"] for r in got] == list(range(1000))
        assert not fake.serves_raw


def test_a_task_planned_without_an_owner_looks_it_up_first(server):
    planned = ReadTask(zookeeper="127.0.0.1:1", root="/none", partition=1, first=0, last=9, address="")
    got = rows(read_task(planned, lambda t, previous: server.address))
    assert [r["transaction_id"] for r in got] == list(range(10))


def test_a_checksum_mismatch_fails_with_the_transaction(server):
    server.corrupt(1, 6)
    with pytest.raises(ChecksumMismatch, match="partition 1 transaction 6"):
        list(read_task(task(server, 1, 0, 9)))


def bad_length() -> object:
    bad = record(0, 0, b"abc")
    bad.data_length = 2
    return bad


def bad_checksum() -> object:
    bad = record(0, 1, b"abc")
    bad.checksum ^= 4
    return bad


BROKEN = [
    ([record(0, 0, b"a"), record(0, 2, b"b")], BrokenRange, "expected transaction 1, got 2"),
    ([record(1, 0, b"a")], BrokenRange, "ReqId names partition 1"),
    ([bad_length()], BrokenRange, "data_length"),
    ([record(0, 0, b"a"), bad_checksum()], ChecksumMismatch, "partition 0 transaction 1: data CRC-32"),
]


@pytest.mark.parametrize(("records", "error", "message"), BROKEN)
def test_records_out_of_order_of_another_partition_or_corrupt_are_refused(records, error, message):
    with pytest.raises(error, match=message):
        check(0, 0, records)
    builder = BatchBuilder(0)  # the reader's one-pass check refuses the same records with the same words
    with pytest.raises(error, match=message):
        builder.add(0, records)


def test_the_builder_continues_from_the_id_it_returns():
    builder = BatchBuilder(0)
    assert builder.add(0, [record(0, 0, b"a"), record(0, 1, b"b")]) == 2
    assert builder.add(2, [record(0, 2, b"c")]) == 3
    assert builder.take().column("transaction_id").to_pylist() == [0, 1, 2]


def test_a_range_beyond_the_high_water_mark_is_not_retried(server):
    with pytest.raises(PartitionUnavailable, match="OUT_OF_RANGE"):
        list(read_task(task(server, 1, 0, 10)))


def test_an_unreachable_server_fails_after_the_timeout():
    dead = ReadTask(
        zookeeper="127.0.0.1:1", root="/none", partition=0, first=0, last=5, address="127.0.0.1:1", timeout_s=0.5
    )
    with pytest.raises(PartitionUnavailable, match="UNAVAILABLE"):
        list(read_task(dead, lambda t, previous: previous))


def test_empty_builder_and_signed_checksums():
    builder = BatchBuilder(3)
    high_crc = next(d for d in (bytes([i]) for i in range(256)) if record(0, 0, d).checksum < 0)
    check(3, 0, [record(3, 0, high_crc)])  # a CRC above 2^31 travels as a negative int32
    builder.add(0, [record(3, 0, high_crc)])
    assert builder.take().to_pylist()[0]["partition"] == 3
    assert builder.rows == 0
    assert isinstance(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode)


def test_a_worker_reads_its_next_tasks_over_the_same_channel(server):
    from waltz_spark import reading

    list(read_task(task(server, 0, 0, 9)))
    kept = reading.channel(server.address, None)
    list(read_task(task(server, 1, 0, 9)))
    assert reading.channel(server.address, None) is kept
    assert len(server.requests) == 2


def test_a_long_task_reads_over_several_streams_each_record_once():
    with FakeWaltzServer(partitions=1, batch_size=500) as fake:
        fake.append(0, 30_100)
        got = rows(read_task(task(fake, 0, 100, 30_099, streams=3)))
        assert sorted(r["transaction_id"] for r in got) == list(range(100, 30_100))
        assert sorted(r.from_transaction_id for r in fake.requests) == [100, 10_100, 20_100]
        fake.requests.clear()
        assert len(rows(read_task(task(fake, 0, 0, 15_000, streams=3)))) == 15_001
        assert [r.from_transaction_id for r in fake.requests] == [0]  # too short to be worth a second stream


def test_an_error_in_one_stream_fails_the_whole_read():
    with FakeWaltzServer(partitions=1, batch_size=500) as fake:
        fake.append(0, 30_000)
        fake.corrupt(0, 21_000)
        with pytest.raises(ChecksumMismatch, match="partition 0 transaction 21000"):
            list(read_task(task(fake, 0, 0, 29_999, streams=2)))


def test_split_range():
    from waltz_spark.planning import split_range

    assert split_range(0, 99, 3, 10) == [(0, 32), (33, 65), (66, 99)]
    assert split_range(5, 24, 4, 10) == [(5, 14), (15, 24)]
    assert split_range(5, 10, 4, 10) == [(5, 10)]
