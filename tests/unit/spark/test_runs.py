"""parse_run and RunBuilder: record runs in the data file's layout to Arrow, every record checked."""

import struct

import pyarrow as pa
import pytest

from waltz.v1 import common_pb2
from waltz_spark.reading import BatchBuilder
from waltz_spark.rows import ARROW_SCHEMA, BrokenRange, ChecksumMismatch
from waltz_spark.runs import RunBuilder, parse_run
from waltz_spark.testing import encode, record, run_of


def records(partition: int, first: int, sizes: list[int]) -> list[common_pb2.Record]:
    return [
        record(partition, txn, bytes((txn + i) % 251 for i in range(size)), header=txn % 5, client_id=txn % 3)
        for txn, size in enumerate(sizes, first)
    ]


def run(rs: list[common_pb2.Record], first: int | None = None) -> common_pb2.RecordRun:
    return run_of([encode(r) for r in rs], rs[0].transaction_id if first is None else first)


def built(partition: int, first: int, *runs: common_pb2.RecordRun) -> pa.RecordBatch:
    builder = RunBuilder(partition)
    for r in runs:
        first = builder.add(first, r)
    return builder.take()


def by_records(partition: int, first: int, rs: list[common_pb2.Record]) -> pa.RecordBatch:
    builder = BatchBuilder(partition)
    builder.add(first, rs)
    return builder.take()


GOOD = {
    "one record": [7],
    "empty data": [0, 0, 3, 0],
    "large data": [1 << 20, 5, 300_000],
    "many records": [i % 97 for i in range(600)],
    "more records than the mask's pattern holds": [i % 13 for i in range(1500)],
}


@pytest.mark.parametrize("sizes", GOOD.values(), ids=GOOD.keys())
def test_a_run_gives_the_columns_the_record_builder_gives(sizes):
    rs = records(3, 40, sizes)
    batch = built(3, 40, run(rs))
    assert batch.schema == ARROW_SCHEMA
    assert batch.equals(by_records(3, 40, rs))
    assert batch.column("data").to_pylist() == [r.data for r in rs]
    assert batch.column("transaction_id").to_pylist() == list(range(40, 40 + len(sizes)))


def test_runs_accumulate_and_each_continues_from_the_id_the_last_returned():
    rs = records(1, 0, [10, 0, 20, 5, 7])
    builder = RunBuilder(1)
    assert builder.add(0, run(rs[:2])) == 2
    assert builder.add(2, run(rs[2:3])) == 3
    assert builder.add(3, run(rs[3:])) == 5
    assert (builder.rows, builder.data_bytes) == (5, 42)
    assert builder.take().equals(by_records(1, 0, rs))
    assert (builder.rows, builder.data_bytes) == (0, 0)
    assert builder.take().num_rows == 0


def test_an_empty_run_adds_nothing():
    builder = RunBuilder(0)
    assert builder.add(9, common_pb2.RecordRun()) == 9
    assert builder.rows == 0


def test_checksums_above_two_to_the_31_and_negative_fields():
    high_crc = next(d for d in (bytes([i]) for i in range(256)) if record(0, 0, d).checksum < 0)
    r = record(0, 0, high_crc, header=-5, client_id=-2**31)
    assert built(0, 0, run([r])).equals(by_records(0, 0, [r]))


def with_bytes(r: common_pb2.RecordRun, records_: bytes | None = None, ends: bytes | None = None, count: int = -1):
    return common_pb2.RecordRun(
        first_transaction_id=r.first_transaction_id,
        count=r.count if count < 0 else count,
        records=r.records if records_ is None else records_,
        ends=r.ends if ends is None else ends,
    )


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]


THREE = records(0, 10, [5, 50, 8])
GOOD_RUN = run(THREE)
SIZES = [len(encode(r)) for r in THREE]


def ends(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def bad_length() -> common_pb2.Record:
    r = records(0, 11, [50])[0]
    r.data_length = 49
    return r


BROKEN = {
    "ends not 4 bytes a record": (with_bytes(GOOD_RUN, ends=GOOD_RUN.ends[:-1]), BrokenRange, "bytes of ends"),
    "ends that go back": (
        with_bytes(GOOD_RUN, ends=ends(SIZES[0] + SIZES[1], SIZES[0], sum(SIZES))),
        BrokenRange,
        "record 1 \\(transaction 11\\) spans",
    ),
    "a record under 40 bytes": (
        with_bytes(GOOD_RUN, ends=ends(SIZES[0], SIZES[0] + 39, sum(SIZES))),
        BrokenRange,
        "less than a record's 40",
    ),
    "short bytes": (with_bytes(GOOD_RUN, records_=GOOD_RUN.records[:-1]), BrokenRange, "the run has"),
    "ends short of the bytes": (
        with_bytes(GOOD_RUN, ends=GOOD_RUN.ends[:-4], count=2),
        BrokenRange,
        "the records end at byte",
    ),
    "bytes without a record": (with_bytes(GOOD_RUN, ends=b"", count=0), BrokenRange, "but no record"),
    "the wrong first id": (run(THREE, first=9), BrokenRange, "partition 0: expected transaction 10, got 9"),
    "a gap in the ids": (
        run([THREE[0], records(0, 12, [50])[0], THREE[2]]),
        BrokenRange,
        "partition 0: expected transaction 11, got 12",
    ),
    "a record of another partition": (
        run([THREE[0], THREE[1], records(2, 12, [8])[0]]),
        BrokenRange,
        "partition 0 transaction 12: ReqId names partition 2",
    ),
    "a data length that is not the record's": (
        run([THREE[0], bad_length(), THREE[2]]),
        BrokenRange,
        "partition 0 transaction 11: data_length 49 but 50 data bytes",
    ),
    "a flipped data byte": (
        with_bytes(GOOD_RUN, records_=flipped(GOOD_RUN.records, SIZES[0] + 36 + 20)),
        ChecksumMismatch,
        "checksum mismatch in partition 0 transaction 11: data CRC-32",
    ),
}


@pytest.mark.parametrize(("bad", "error", "message"), BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_or_corrupt_run_is_refused_naming_partition_and_transaction(bad, error, message):
    assert built(0, 10, GOOD_RUN).num_rows == 3  # the run these are made from is good
    builder = RunBuilder(0)
    with pytest.raises(error, match=message):
        builder.add(10, bad)
    assert builder.rows == 0


def test_the_first_bad_record_is_named_with_the_first_check_it_fails():
    corrupt = records(0, 10, [5, 5, 5])
    corrupt[1].checksum ^= 1
    corrupt[2].req_id.partition_id = 4
    with pytest.raises(ChecksumMismatch, match="transaction 11"):
        parse_run(0, 10, run(corrupt))
    corrupt[1].transaction_id = 15  # an id out of order is said before the checksum, as check() does
    with pytest.raises(BrokenRange, match="expected transaction 11, got 15"):
        parse_run(0, 10, run(corrupt))
