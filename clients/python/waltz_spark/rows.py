"""The rows the reader yields (their Arrow schema and batch size), its checks of records and their errors.

Shared by both ways of reading: Record messages (reading.BatchBuilder) and raw record runs (runs.RunBuilder).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from waltz.v1 import common_pb2
from waltz_common.types import crc32_unsigned

ARROW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("transaction_id", pa.int64()),
        ("header", pa.int32()),
        ("client_id", pa.int32()),
        ("generation", pa.int32()),
        ("seq_num", pa.int32()),
        ("data", pa.binary()),
    ]
)
ARROW_BATCH_ROWS = 8192


class ChecksumMismatch(RuntimeError):
    """A record's data does not match its CRC-32: the log or the transfer is corrupt."""


class BrokenRange(RuntimeError):
    """The server sent records out of order, of the wrong partition or with a wrong length."""


def check(partition: int, expected_first: int, records: Sequence[common_pb2.Record]) -> None:
    """Ids dense from expected_first, lengths right, and the CRC-32 of every record's data as recorded."""
    expected = expected_first
    for record in records:
        if record.transaction_id != expected:
            raise BrokenRange(f"partition {partition}: expected transaction {expected}, got {record.transaction_id}")
        data = record.data
        if record.data_length != len(data):
            raise BrokenRange(
                f"partition {partition} transaction {expected}: data_length {record.data_length} "
                f"but {len(data)} data bytes"
            )
        if (crc32_unsigned(data) - record.checksum) & 0xFFFFFFFF:
            raise ChecksumMismatch(
                f"checksum mismatch in partition {partition} transaction {expected}: data CRC-32 "
                f"{crc32_unsigned(data):#010x}, record says {record.checksum & 0xFFFFFFFF:#010x}"
            )
        if record.req_id.partition_id != partition:
            raise BrokenRange(
                f"partition {partition} transaction {expected}: ReqId names partition {record.req_id.partition_id}"
            )
        expected += 1
