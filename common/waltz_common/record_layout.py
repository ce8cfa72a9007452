"""The byte layout of a transaction record in a storage data file (on-disk-format.txt, "Transaction Record").

The storage node writes records in this layout, and the Waltz server sends its appends already in it
(StorageAppendRequest.encoded_records), so both ends share these definitions.
"""

from __future__ import annotations

import struct
from typing import Protocol

from waltz_common.types import crc32_unsigned

RECORD_PREFIX = struct.Struct(">q4iiii")
"""transaction id, ReqId (client id, generation, partition id, seq num), header, data length, data checksum"""
RECORD_PREFIX_SIZE = RECORD_PREFIX.size
RECORD_CRC = struct.Struct(">I")
"""After the data: the CRC-32 of the prefix and the data, unsigned."""
RECORD_OVERHEAD = RECORD_PREFIX_SIZE + RECORD_CRC.size
"""A record's size on disk is its data length plus this."""

assert RECORD_PREFIX_SIZE == 36


class _ReqIdFields(Protocol):
    @property
    def client_id(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def partition_id(self) -> int: ...
    @property
    def seq_num(self) -> int: ...


class RecordFields(Protocol):
    """A record's fields: waltz_common.types.Record and the protos' common_pb2.Record both have them."""

    @property
    def transaction_id(self) -> int: ...
    @property
    def req_id(self) -> _ReqIdFields: ...
    @property
    def header(self) -> int: ...
    @property
    def data(self) -> bytes: ...
    @property
    def checksum(self) -> int: ...


def encode_record(record: RecordFields, data_length: int | None = None) -> bytes:
    """The record in this layout: the prefix (data length: len(record.data) unless given, as a test of a wrong one
    gives it), the data, the CRC-32 of both."""
    r = record.req_id
    data = record.data
    body = RECORD_PREFIX.pack(
        record.transaction_id,
        r.client_id,
        r.generation,
        r.partition_id,
        r.seq_num,
        record.header,
        len(data) if data_length is None else data_length,
        record.checksum,
    ) + data
    return body + RECORD_CRC.pack(crc32_unsigned(body))
