"""Record runs (RecordRun: records as a storage node's data file holds them) to Arrow columns, every record checked.

A run is parsed with numpy over its bytes instead of a Python step per record: one mask over the run splits
the records' data (gathered into one buffer, the Arrow column's) from their fields and CRCs (40 bytes each,
read as big-endian fields), and only the data CRC-32s are computed per record (in C, through map). Each record
is checked as rows.check checks a Record (dense ids from the expected one, data length, data CRC-32, ReqId
partition); the first that fails is handed to check() itself, so the errors say the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from waltz.v1 import common_pb2
from waltz_common.record_layout import RECORD_CRC, RECORD_OVERHEAD, RECORD_PREFIX_SIZE
from waltz_common.types import crc32_unsigned
from waltz_spark.rows import ARROW_SCHEMA, BrokenRange, check

OVERHEAD = np.dtype(
    [
        ("transaction_id", ">i8"),
        ("client_id", ">i4"),
        ("generation", ">i4"),
        ("partition_id", ">i4"),
        ("seq_num", ">i4"),
        ("header", ">i4"),
        ("data_length", ">i4"),
        ("checksum", ">u4"),
        ("record_crc", ">u4"),
    ]
)
"""A record's bytes but its data: waltz_common.record_layout.RECORD_PREFIX, then RECORD_CRC (CRCs unsigned, as
crc32 returns them). Records lie back to back, so without their data their overheads do too, 40 bytes each."""
assert OVERHEAD.itemsize == RECORD_OVERHEAD == RECORD_PREFIX_SIZE + RECORD_CRC.size
MAX_BATCH_DATA = 2**31 - 1
"""The data bytes a batch can hold (pa.binary has int32 offsets); a reader takes a batch before it has half."""


_IS_DATA = np.tile(np.array([False, True, False]), 1024)
"""Which of a record's three spans (prefix, data, CRC) is data, for runs of up to 1024 records."""


@dataclass(frozen=True)
class ParsedRun:
    """A run's records, checked: their fields (OVERHEAD, big-endian), their data back to back, and its lengths."""

    fields: np.ndarray
    data: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.fields)


def parse_run(partition: int, expected_first: int, run: common_pb2.RecordRun) -> ParsedRun:
    """The records of run, which must be transactions expected_first.. of partition, each checked.

    Raises BrokenRange (a malformed run, ids out of order, another partition, a wrong length) or ChecksumMismatch,
    naming the partition and the first bad transaction, in the words rows.check uses for a Record.
    """
    records = run.records  # each read of a protobuf bytes field copies it: read it once
    ends_bytes = run.ends
    count = run.count
    where = f"partition {partition}: run of {count} records from transaction {run.first_transaction_id}"
    if len(ends_bytes) != 4 * count:
        raise BrokenRange(f"{where}: {len(ends_bytes)} bytes of ends, not 4 per record")
    if count == 0:
        if records:
            raise BrokenRange(f"{where}: {len(records)} bytes but no record")
        return ParsedRun(np.empty(0, OVERHEAD), np.empty(0, np.uint8), np.empty(0, np.int64))
    if run.first_transaction_id != expected_first:
        raise BrokenRange(
            f"partition {partition}: expected transaction {expected_first}, got {run.first_transaction_id}"
        )
    ends = np.frombuffer(ends_bytes, "<u4").astype(np.int64)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1]
    sizes = ends - starts
    short = sizes < RECORD_OVERHEAD  # also where ends do not increase
    if short.any():
        i = int(short.argmax())
        raise BrokenRange(
            f"{where}: record {i} (transaction {expected_first + i}) spans bytes {starts[i]}..{ends[i]}, "
            f"less than a record's {RECORD_OVERHEAD}"
        )
    if ends[-1] != len(records):
        raise BrokenRange(f"{where}: the records end at byte {ends[-1]} but the run has {len(records)}")

    # One mask splits the run: False over each record's prefix and CRC, True over its data.
    lengths = sizes - RECORD_OVERHEAD
    spans = np.empty(3 * count, np.int64)
    spans[0::3] = RECORD_PREFIX_SIZE
    spans[1::3] = lengths
    spans[2::3] = RECORD_CRC.size
    pattern = _IS_DATA[: 3 * count] if 3 * count <= len(_IS_DATA) else np.tile(_IS_DATA[:3], count)
    is_data = np.repeat(pattern, spans)
    buffer = np.frombuffer(records, np.uint8)
    data = buffer[is_data]
    fields = buffer[~is_data].view(OVERHEAD)

    # The only per-record work left: the data CRC-32s, of slices through map so that the loop runs in C (bytes
    # slices cost less than memoryview ones). Each record's CRC-32 over prefix and data is not checked: a second
    # such pass made this whole parse a third dearer (0.078 against 0.058 s per 100k records of 100 B in runs of
    # 500, RunBuilder with and without it, same run), and the storage node checks it as it reads the records from
    # its data file (RecordListRequest.raw); a Record never carried it to the reader either.
    data_starts = (starts + RECORD_PREFIX_SIZE).tolist()
    data_ends = (ends - RECORD_CRC.size).tolist()
    data_crcs = np.fromiter(
        map(crc32_unsigned, map(records.__getitem__, map(slice, data_starts, data_ends))), np.uint32, count
    )
    bad = (
        (fields["transaction_id"] != np.arange(expected_first, expected_first + count, dtype=np.int64))
        | (fields["data_length"] != lengths)
        | (data_crcs != fields["checksum"])
        | (fields["partition_id"] != partition)
    )
    if bad.any():
        i = int(bad.argmax())
        check(partition, expected_first + i, [_record(fields[i], records[data_starts[i] : data_ends[i]])])
        raise AssertionError(f"partition {partition}: record {i} of the run failed a check that check() passes")
    return ParsedRun(fields, data, lengths)


def _record(fields: np.void, data: bytes) -> common_pb2.Record:
    """A record of a run as a Record, for check() to name what is wrong with it in its words."""
    checksum = int(fields["checksum"])
    return common_pb2.Record(
        transaction_id=int(fields["transaction_id"]),
        req_id=common_pb2.ReqId(
            client_id=int(fields["client_id"]),
            generation=int(fields["generation"]),
            partition_id=int(fields["partition_id"]),
            seq_num=int(fields["seq_num"]),
        ),
        header=int(fields["header"]),
        data_length=int(fields["data_length"]),
        data=data,
        checksum=checksum - 2**32 if checksum >= 2**31 else checksum,
    )


class RunBuilder:
    """Checked runs accumulating into one Arrow RecordBatch of ARROW_SCHEMA, as reading.BatchBuilder does Records."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self._runs: list[ParsedRun] = []
        self.rows = 0
        self.data_bytes = 0

    def add(self, expected_first: int, run: common_pb2.RecordRun) -> int:
        """Check and append a run that must start at expected_first; returns the next id."""
        parsed = parse_run(self.partition, expected_first, run)
        if len(parsed):
            self._runs.append(parsed)
            self.rows += len(parsed)
            self.data_bytes += len(parsed.data)
        return expected_first + len(parsed)

    def take(self) -> pa.RecordBatch:
        runs, self._runs, rows, self.rows, self.data_bytes = self._runs, [], self.rows, 0, 0
        if len(runs) == 1:
            fields, data, lengths = runs[0].fields, runs[0].data, runs[0].lengths
        else:
            fields = np.concatenate([r.fields for r in runs]) if runs else np.empty(0, OVERHEAD)
            data = np.concatenate([r.data for r in runs]) if runs else np.empty(0, np.uint8)
            lengths = np.concatenate([r.lengths for r in runs]) if runs else np.empty(0, np.int64)
        if len(data) > MAX_BATCH_DATA:
            raise ValueError(f"{len(data)} data bytes in one batch: more than int32 offsets (pa.binary) address")
        offsets = np.zeros(rows + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        data_column = pa.BinaryArray.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        return pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(rows, self.partition, np.int32)),
                pa.array(fields["transaction_id"].astype(np.int64)),
                pa.array(fields["header"].astype(np.int32)),
                pa.array(fields["client_id"].astype(np.int32)),
                pa.array(fields["generation"].astype(np.int32)),
                pa.array(fields["seq_num"].astype(np.int32)),
                data_column,
            ],
            schema=ARROW_SCHEMA,
        )
