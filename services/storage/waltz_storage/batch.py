"""An append's records as one buffer of on-disk bytes: built from engine Records, or straight from an incoming
request's protobuf records in one pass (the append hot path)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import repeat
from operator import add
from typing import NamedTuple

from waltz.v1 import storage_pb2
from waltz_common.types import Record, crc32_unsigned
from waltz_storage.codec import RECORD_CRC, RECORD_OVERHEAD, RECORD_PREFIX, RECORD_PREFIX_SIZE, encode_record

_U32 = 0xFFFFFFFF
_CHECKED_PREFIX = struct.Struct(">q20xII")
"""What the append path checks of a record's prefix (RECORD_PREFIX): its transaction id, then its data length
and data checksum read unsigned."""
assert _CHECKED_PREFIX.size == RECORD_PREFIX_SIZE


class EncodedBatch(NamedTuple):
    """Consecutive records encoded as the data file holds them."""

    first_transaction_id: int
    record_count: int
    data: bytes | bytearray
    offsets: list[int]
    """Where each record starts in data."""


def encode_records(first_transaction_id: int, records: Sequence[Record]) -> EncodedBatch:
    """Records already checked (codec.check_record) as one batch; their ids are not looked at."""
    offsets: list[int] = []
    blobs = [encode_record(r) for r in records]
    offset = 0
    for blob in blobs:
        offsets.append(offset)
        offset += len(blob)
    return EncodedBatch(first_transaction_id, len(blobs), b"".join(blobs), offsets)


def encode_appends(
    requests: Sequence[storage_pb2.StorageAppendRequest], first_transaction_id: int, max_record_size: int
) -> EncodedBatch | None:
    """The records of consecutive append requests as one batch, each validated as it is encoded; None when
    anything is wrong, and then the checked path (protocol.records_from_append, StoragePartition.append)
    names the problem exactly. A request's records come either as messages (records) or already encoded
    (encoded_records, which are checked as they are and taken whole).

    Every record must carry the next transaction id from first_transaction_id, a data_length equal to its
    data's length, at most max_record_size data bytes and the CRC32 of its data as checksum; each request's
    record_list_length must count its records. The 32-bit fields need no range check: protobuf's int32
    guarantees it (and the transaction id, an int64, is compared with the expected one).
    """
    # Each record is one block, prefix + data, and its 4-byte CRC, kept as pieces joined once at the end: one
    # CRC pass over the block instead of two (prefix, then data seeded with it), and no bytearray regrowth.
    pieces: list[bytes] = []
    put = pieces.append
    offsets: list[int] = []
    mark = offsets.append
    pack = RECORD_PREFIX.pack
    pack_crc = RECORD_CRC.pack
    crc = crc32_unsigned
    txn = first_transaction_id
    offset = 0
    for request in requests:
        encoded = request.encoded_records
        if encoded:
            offsets_of = _encoded_offsets(encoded, request.record_list_length, txn, max_record_size)
            if offsets_of is None or request.records:
                return None
            if offset:
                offsets.extend(map(add, offsets_of, repeat(offset)))
            else:  # nothing before it (usually the only request): its offsets are the batch's
                offsets = offsets_of
                mark = offsets.append
            put(encoded)
            offset += len(encoded)
            txn += len(offsets_of)
            continue
        records = request.records
        if request.record_list_length != len(records):
            return None
        for p in records:
            data = p.data  # each access copies the bytes: read it once
            n = len(data)
            checksum = p.checksum
            # The CRC is unsigned, the seed's checksum a signed int: compare them modulo 2**32.
            if p.transaction_id != txn or p.data_length != n or n > max_record_size or crc(data) != checksum & _U32:
                return None
            r = p.req_id
            block = pack(txn, r.client_id, r.generation, r.partition_id, r.seq_num, p.header, n, checksum) + data
            put(block)
            put(pack_crc(crc(block)))
            mark(offset)
            offset += n + RECORD_OVERHEAD
            txn += 1
    return EncodedBatch(first_transaction_id, txn - first_transaction_id, b"".join(pieces), offsets)


def _encoded_offsets(encoded: bytes, count: int, first_transaction_id: int, max_record_size: int) -> list[int] | None:
    """Where each of the count records in encoded (StorageAppendRequest.encoded_records) starts; None unless
    they fill it exactly and each is whole and right: the next transaction id from first_transaction_id, at
    most max_record_size data bytes, the CRC32 of its data as data checksum and the CRC32 of all of it
    before its last four bytes there.

    The per-record loop of the append hot path, kept short: one unpack of just the fields it checks (the data
    length and checksum read unsigned, so a negative length is above any limit and the checksum compares with
    the CRC as it is), and no bounds tests of its own: a prefix, or the CRC after data that runs past the end,
    raises struct.error (bench/storage_append.py)."""
    view = memoryview(encoded)
    unpack = _CHECKED_PREFIX.unpack_from
    unpack_crc = RECORD_CRC.unpack_from
    crc = crc32_unsigned
    size = len(encoded)
    offsets: list[int] = []
    mark = offsets.append
    txn = first_transaction_id
    start = 0
    try:
        for _ in range(count):
            t, length, checksum = unpack(encoded, start)
            end = start + RECORD_PREFIX_SIZE + length  # where the record's CRC is
            if (
                t != txn
                or length > max_record_size
                or crc(view[start + RECORD_PREFIX_SIZE : end]) != checksum
                or crc(view[start:end]) != unpack_crc(encoded, end)[0]
            ):
                return None
            mark(start)
            start = end + 4
            txn += 1
    except struct.error:  # a prefix or a CRC past the end: the records do not fill the bytes given
        return None
    return offsets if start == size else None
