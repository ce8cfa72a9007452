"""Pure big-endian codecs of the seed's on-disk structures: control file, segment headers, records."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice, repeat
from operator import add, sub
from typing import NamedTuple

from waltz_common.record_layout import RECORD_CRC as RECORD_CRC
from waltz_common.record_layout import RECORD_OVERHEAD as RECORD_OVERHEAD
from waltz_common.record_layout import RECORD_PREFIX as RECORD_PREFIX
from waltz_common.record_layout import RECORD_PREFIX_SIZE as RECORD_PREFIX_SIZE
from waltz_common.record_layout import encode_record as encode_record
from waltz_common.types import INT32_MAX, INT32_MIN, Record, RecordHeader, ReqId, crc32, crc32_unsigned
from waltz_storage.errors import (
    ChecksumError,
    ClusterKeyMismatch,
    CorruptionError,
    DataChecksumMismatch,
    InvalidRequest,
    PartitionCountMismatch,
    PartitionInfoCorrupted,
    RecordTooLarge,
    TornRecordError,
    TransactionIdMismatch,
)

FORMAT_VERSION = 0
FILE_HEADER_SIZE = 128
INDEX_ENTRY_SIZE = 8
PARTITION_INFO_SIZE = 60
PARTITION_INFO_STRUCT_SIZE = 28
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_CONTROL_HEADER = struct.Struct(">iq16si")
_SEGMENT_HEADER = struct.Struct(">iq16siq")
_INT32 = struct.Struct(">i")
_INFO_BODY = struct.Struct(">qqq")

assert 4 + 2 * PARTITION_INFO_STRUCT_SIZE == PARTITION_INFO_SIZE


def _pad(body: bytes) -> bytes:
    return body + bytes(FILE_HEADER_SIZE - len(body))


def _need(buf: bytes, size: int, what: str) -> None:
    if len(buf) < size:
        raise CorruptionError(f"{what}: {len(buf)} bytes, needs {size}")


# ----------------------------------------------------------------------------- control file


@dataclass(frozen=True, slots=True)
class ControlFileHeader:
    """The control file's first 128 bytes."""

    version: int
    creation_time_ms: int
    cluster_key: uuid.UUID
    num_partitions: int

    def encode(self) -> bytes:
        return _pad(
            _CONTROL_HEADER.pack(self.version, self.creation_time_ms, self.cluster_key.bytes, self.num_partitions)
        )

    @classmethod
    def decode(cls, buf: bytes) -> ControlFileHeader:
        _need(buf, FILE_HEADER_SIZE, "control file header")
        version, created, key, num_partitions = _CONTROL_HEADER.unpack_from(buf)
        return cls(version, created, uuid.UUID(bytes=key), num_partitions)

    def check(self, cluster_key: uuid.UUID, num_partitions: int, where: str) -> None:
        """Raise unless this header has our format version, cluster key and partition count."""
        if self.version != FORMAT_VERSION:
            raise CorruptionError(f"{where}: unsupported format version {self.version}")
        if self.cluster_key != cluster_key:
            raise ClusterKeyMismatch(f"{where}: belongs to another cluster (its cluster key differs from this one's)")
        if self.num_partitions != num_partitions:
            raise PartitionCountMismatch(
                f"{where}: number of partitions is {self.num_partitions}, expected {num_partitions}"
            )


@dataclass(frozen=True, slots=True, order=True)
class PartitionInfoStruct:
    """One slot of a partition info; ordering is the (session, lwm, local lwm) tuple."""

    session_id: int
    low_water_mark: int
    local_low_water_mark: int

    def encode(self) -> bytes:
        body = _INFO_BODY.pack(self.session_id, self.low_water_mark, self.local_low_water_mark)
        return body + _INT32.pack(crc32(body))

    @classmethod
    def decode(cls, buf: bytes) -> PartitionInfoStruct | None:
        """The struct, or None when its checksum does not match."""
        _need(buf, PARTITION_INFO_STRUCT_SIZE, "partition info struct")
        body = bytes(buf[:24])
        (stored,) = _INT32.unpack_from(buf, 24)
        if stored != crc32(body):
            return None
        return cls(*_INFO_BODY.unpack(body))


FRESH_PARTITION_INFO = PartitionInfoStruct(-1, -1, -1)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A partition's two alternately written structs; None marks a slot whose checksum failed."""

    partition_id: int
    slots: tuple[PartitionInfoStruct | None, PartitionInfoStruct | None]

    @classmethod
    def fresh(cls, partition_id: int) -> PartitionInfo:
        return cls(partition_id, (FRESH_PARTITION_INFO, FRESH_PARTITION_INFO))

    def current_slot(self) -> int:
        """Index of the valid slot with the larger tuple (slot 0 on a tie)."""
        first, second = self.slots
        if first is None and second is None:
            raise PartitionInfoCorrupted(
                f"partition info corrupted for partition {self.partition_id}: both structs fail their checksum"
            )
        if first is None or (second is not None and second > first):
            return 1
        return 0

    @property
    def current(self) -> PartitionInfoStruct:
        info = self.slots[self.current_slot()]
        assert info is not None
        return info

    def updated(self, info: PartitionInfoStruct) -> tuple[int, PartitionInfo]:
        """The slot an update writes (the non-current one) and the resulting PartitionInfo."""
        slot = 1 - self.current_slot()
        slots = (info, self.slots[1]) if slot == 0 else (self.slots[0], info)
        return slot, PartitionInfo(self.partition_id, slots)

    def encode(self) -> bytes:
        encoded = [(s or FRESH_PARTITION_INFO).encode() for s in self.slots]
        return _INT32.pack(self.partition_id) + encoded[0] + encoded[1]

    @classmethod
    def decode(cls, buf: bytes, expected_partition_id: int) -> PartitionInfo:
        _need(buf, PARTITION_INFO_SIZE, f"partition info of partition {expected_partition_id}")
        (partition_id,) = _INT32.unpack_from(buf)
        if partition_id != expected_partition_id:
            raise PartitionInfoCorrupted(
                f"partition info corrupted for partition {expected_partition_id}: it names partition {partition_id}"
            )
        first = PartitionInfoStruct.decode(buf[4 : 4 + PARTITION_INFO_STRUCT_SIZE])
        second = PartitionInfoStruct.decode(buf[4 + PARTITION_INFO_STRUCT_SIZE : PARTITION_INFO_SIZE])
        return cls(partition_id, (first, second))


def partition_info_offset(partition_id: int) -> int:
    """Byte offset of a partition's 60-byte info in the control file."""
    return FILE_HEADER_SIZE + PARTITION_INFO_SIZE * partition_id


def partition_info_struct_offset(partition_id: int, slot: int) -> int:
    """Byte offset of one of a partition's two structs in the control file."""
    return partition_info_offset(partition_id) + 4 + PARTITION_INFO_STRUCT_SIZE * slot


def control_file_size(num_partitions: int) -> int:
    return FILE_HEADER_SIZE + PARTITION_INFO_SIZE * num_partitions


# ----------------------------------------------------------------------------- segment files


@dataclass(frozen=True, slots=True)
class SegmentFileHeader:
    """The first 128 bytes of a .seg and of its .idx (identical)."""

    version: int
    creation_time_ms: int
    cluster_key: uuid.UUID
    partition_id: int
    first_transaction_id: int

    def encode(self) -> bytes:
        return _pad(
            _SEGMENT_HEADER.pack(
                self.version,
                self.creation_time_ms,
                self.cluster_key.bytes,
                self.partition_id,
                self.first_transaction_id,
            )
        )

    @classmethod
    def decode(cls, buf: bytes) -> SegmentFileHeader:
        _need(buf, FILE_HEADER_SIZE, "segment file header")
        version, created, key, partition_id, first = _SEGMENT_HEADER.unpack_from(buf)
        return cls(version, created, uuid.UUID(bytes=key), partition_id, first)

    def check(self, cluster_key: uuid.UUID, partition_id: int, first_transaction_id: int, where: str) -> None:
        """Raise unless the header belongs to this cluster, partition and segment name."""
        if self.version != FORMAT_VERSION:
            raise CorruptionError(f"{where}: unsupported format version {self.version}")
        if self.cluster_key != cluster_key:
            raise ClusterKeyMismatch(f"{where}: belongs to another cluster (its cluster key differs from this one's)")
        if self.partition_id != partition_id:
            raise CorruptionError(f"{where}: header names partition {self.partition_id}, expected {partition_id}")
        if self.first_transaction_id != first_transaction_id:
            raise CorruptionError(
                f"{where}: header says first transaction {self.first_transaction_id}, "
                f"file name says {first_transaction_id}"
            )


def index_entry_offset(first_transaction_id: int, transaction_id: int) -> int:
    """Byte offset in the .idx of the entry for transaction_id."""
    return FILE_HEADER_SIZE + INDEX_ENTRY_SIZE * (transaction_id - first_transaction_id)


def encode_index_entries(offsets: Sequence[int], base: int = 0) -> bytes:
    """The index entries of records at these offsets, each plus base."""
    if base:
        return struct.pack(f">{len(offsets)}q", *map(add, offsets, repeat(base)))
    return struct.pack(f">{len(offsets)}q", *offsets)


def decode_index_entries(buf: bytes) -> list[int]:
    return list(struct.unpack_from(f">{len(buf) // INDEX_ENTRY_SIZE}q", buf))


# ----------------------------------------------------------------------------- records


class RecordPrefix(NamedTuple):
    """The fixed 36 bytes before a record's data."""

    transaction_id: int
    req_id: ReqId
    header: int
    data_length: int
    data_checksum: int

    @property
    def record_size(self) -> int:
        return RECORD_OVERHEAD + self.data_length

    @property
    def record_header(self) -> RecordHeader:
        return RecordHeader(self.transaction_id, self.req_id, self.header)


def encoded_record_size(data_length: int) -> int:
    return RECORD_OVERHEAD + data_length


def decode_record_prefix(buf: bytes, offset: int = 0, origin: int = 0) -> RecordPrefix:
    """Parse the 36-byte prefix at buf[offset:]; origin is buf's position in its file, for messages."""
    available = len(buf) - offset
    if available < RECORD_PREFIX_SIZE:
        raise TornRecordError(
            f"record at offset {origin + offset}: only {available} of its {RECORD_PREFIX_SIZE} header bytes"
        )
    txn, client_id, generation, partition_id, seq_num, header, length, checksum = RECORD_PREFIX.unpack_from(
        buf, offset
    )
    if length < 0:
        raise CorruptionError(f"record at offset {origin + offset}: negative data length {length}")
    return RecordPrefix(txn, ReqId(client_id, generation, partition_id, seq_num), header, length, checksum)


def decode_record(buf: bytes, offset: int, expected_transaction_id: int | None, origin: int = 0) -> tuple[Record, int]:
    """Decode and fully validate the record at buf[offset:]; returns it and the offset just past it."""
    where = f"record at offset {origin + offset}"
    prefix = decode_record_prefix(buf, offset, origin)
    end = offset + prefix.record_size
    if len(buf) < end:
        raise TornRecordError(
            f"{where}: needs {prefix.record_size} bytes (data length {prefix.data_length}), "
            f"only {len(buf) - offset} present"
        )
    data_start = offset + RECORD_PREFIX_SIZE
    (stored,) = _INT32.unpack_from(buf, end - 4)
    computed = crc32(bytes(buf[offset : end - 4]))
    if stored != computed:
        raise ChecksumError(f"{where}: record checksum {stored} does not match computed {computed}")
    if expected_transaction_id is not None and prefix.transaction_id != expected_transaction_id:
        raise TransactionIdMismatch(
            f"{where}: transaction id {prefix.transaction_id}, expected {expected_transaction_id}"
        )
    data = bytes(buf[data_start : end - 4])
    if crc32(data) != prefix.data_checksum:
        raise ChecksumError(f"{where}: data checksum {prefix.data_checksum} does not match computed {crc32(data)}")
    record = Record(prefix.transaction_id, prefix.req_id, prefix.header, data, prefix.data_checksum)
    return record, end


RecordFields = tuple[int, int, int, int, int, int, bytes, int]
"""A decoded record as plain values: transaction id, client id, generation, partition id, seq num, header,
data, data checksum (the read path builds its messages from these without a Record in between)."""


def _span_view(buf: bytes, offsets: Sequence[int]) -> memoryview:
    """buf, which should hold the file's bytes from offsets[0] to offsets[-1]; TornRecordError when it does not."""
    if len(buf) != offsets[-1] - offsets[0]:
        raise TornRecordError(
            f"records at offset {offsets[0]}: {len(buf)} bytes present of the {offsets[-1] - offsets[0]} the index "
            f"spans"
        )
    return memoryview(buf)


def decode_records(buf: bytes, offsets: Sequence[int], first_transaction_id: int) -> list[RecordFields]:
    """Decode and fully validate consecutive records in one pass: buf holds the file's bytes from
    offsets[0] to offsets[-1], and record i lies between offsets[i] and offsets[i + 1] (the index).

    Each record's CRC32 and its data checksum are verified, its transaction id must follow its
    predecessor's and it must fill its slot exactly; anything else raises the CorruptionError that
    decode_record names (offsets in messages are file offsets).
    """
    base = offsets[0]
    view = _span_view(buf, offsets)
    unpack_prefix = RECORD_PREFIX.unpack_from
    unpack_crc = RECORD_CRC.unpack_from
    crc = crc32_unsigned
    out: list[RecordFields] = []
    append = out.append
    txn = first_transaction_id
    start = 0
    for i in range(1, len(offsets)):
        end = offsets[i] - base
        size = end - start
        if size >= RECORD_OVERHEAD:
            t, client_id, generation, partition_id, seq_num, header, length, checksum = unpack_prefix(buf, start)
            data = buf[start + RECORD_PREFIX_SIZE : end - 4]
            if (
                t == txn
                and length == len(data)
                and unpack_crc(buf, end - 4)[0] == crc(view[start : end - 4])
                and not (crc(data) - checksum) & 0xFFFFFFFF
            ):
                append((t, client_id, generation, partition_id, seq_num, header, data, checksum))
                txn += 1
                start = end
                continue
        _fail_record(buf, start, end, txn, base)
    return out


_RUN_PREFIX = struct.Struct(">q20xi4x")
"""What a raw read checks of a record's prefix (RECORD_PREFIX): its transaction id and its data length."""
assert _RUN_PREFIX.size == RECORD_PREFIX_SIZE


def check_records(buf: bytes, offsets: Sequence[int], first_transaction_id: int) -> None:
    """decode_records' checks without decoding (a raw read passes the bytes on as they are): buf holds the
    file's bytes from offsets[0] to offsets[-1]; each record must carry the next transaction id from
    first_transaction_id, fill its slot between offsets[i] and offsets[i + 1] exactly and end with the CRC32
    of its prefix and data. Anything else raises the CorruptionError decode_records raises.

    The data checksum is not computed: the record CRC covers the data, and every path that writes a record
    checks the data against the checksum in its prefix first (batch.encode_appends and _encoded_offsets,
    check_record for the checked path, Segment.repair), so a record whose CRC holds has data that matches it.
    """
    base = offsets[0]
    view = _span_view(buf, offsets)
    unpack_prefix = _RUN_PREFIX.unpack_from
    unpack_crc = RECORD_CRC.unpack_from
    crc = crc32_unsigned
    txn = first_transaction_id
    start = 0
    for end in map(sub, islice(offsets, 1, None), repeat(base)):  # where each record ends in buf
        if end - start >= RECORD_OVERHEAD:
            t, length = unpack_prefix(buf, start)
            if (
                t == txn
                and length + RECORD_OVERHEAD == end - start
                and unpack_crc(buf, end - 4)[0] == crc(view[start : end - 4])
            ):
                txn += 1
                start = end
                continue
        _fail_record(buf, start, end, txn, base)


def join_spans(spans: Sequence[tuple[bytes, Sequence[int]]]) -> tuple[bytes, bytes]:
    """Consecutive records read as spans of the data files (bytes, and the offsets of each record and of the
    end, as Segment.record_span gives them) as one RecordRun's records and ends: the bytes back to back, and
    where each record ends in them as little-endian uint32."""
    ends: list[int] = []
    at = 0  # where the span starts in the joined bytes
    for buf, offsets in spans:
        ends.extend(map(add, islice(offsets, 1, None), repeat(at - offsets[0])))
        at += len(buf)
    records = spans[0][0] if len(spans) == 1 else b"".join([buf for buf, _ in spans])
    return records, struct.pack(f"<{len(ends)}I", *ends)


HeaderFields = tuple[int, int, int, int, int, int]
"""A decoded record header as plain values: transaction id, client id, generation, partition id, seq num, header."""


def decode_headers(
    prefixes: bytes, positions: Sequence[int], offsets: Sequence[int], first_transaction_id: int
) -> list[HeaderFields]:
    """The headers of consecutive records: record i's 36-byte prefix is at prefixes[positions[i]:] and the
    record lies between file offsets offsets[i] and offsets[i + 1] (the index). Each transaction id must
    follow its predecessor's and each data length must fill its slot (the data is not read: no checksum)."""
    unpack_prefix = RECORD_PREFIX.unpack_from
    limit = len(prefixes) - RECORD_PREFIX_SIZE
    out: list[HeaderFields] = []
    append = out.append
    txn = first_transaction_id
    for i, position in enumerate(positions):
        if position > limit:
            raise TornRecordError(
                f"record at offset {offsets[i]}: only {len(prefixes) - position} of its {RECORD_PREFIX_SIZE} "
                f"header bytes"
            )
        t, client_id, generation, partition_id, seq_num, header, length, _ = unpack_prefix(prefixes, position)
        if t != txn:
            raise TransactionIdMismatch(f"record at offset {offsets[i]} has transaction id {t}, expected {txn}")
        if length + RECORD_OVERHEAD != offsets[i + 1] - offsets[i]:
            raise CorruptionError(
                f"record at offset {offsets[i]}: data length {length} does not fill its "
                f"{offsets[i + 1] - offsets[i]} bytes in the index"
            )
        append((t, client_id, generation, partition_id, seq_num, header))
        txn += 1
    return out


def _fail_record(buf: bytes, start: int, end: int, txn: int, origin: int) -> None:
    """Raise the error that the record in buf[start:end] (expected to hold txn) deserves."""
    decode_record(buf[:end], start, txn, origin)
    raise CorruptionError(f"record at offset {origin + start}: it does not fill its {end - start} bytes in the index")


def check_record(record: Record, max_data_size: int) -> None:
    """Raise InvalidRequest unless an incoming record is storable as is."""
    txn = record.transaction_id
    if not 0 <= txn <= INT64_MAX:
        raise InvalidRequest(f"transaction id {txn} is out of range")
    r = record.req_id
    for name, value in (
        ("client id", r.client_id),
        ("generation", r.generation),
        ("partition id", r.partition_id),
        ("sequence number", r.seq_num),
        ("header", record.header),
        ("checksum", record.checksum),
    ):
        if not INT32_MIN <= value <= INT32_MAX:
            raise InvalidRequest(f"record {txn}: {name} {value} does not fit a 32-bit int")
    if len(record.data) > max_data_size:
        raise RecordTooLarge(f"record {txn}: {len(record.data)} data bytes exceed the maximum {max_data_size}")
    if crc32(record.data) != record.checksum:
        raise DataChecksumMismatch(
            f"record {txn}: checksum {record.checksum} is not the CRC32 of its data ({crc32(record.data)})"
        )
