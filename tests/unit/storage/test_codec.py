"""Pure codec tests: round trips, exact layouts, and precise complaints about damaged bytes."""

import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_common.types import Record, ReqId, crc32
from waltz_storage.codec import (
    FILE_HEADER_SIZE,
    FRESH_PARTITION_INFO,
    PARTITION_INFO_SIZE,
    RECORD_OVERHEAD,
    ControlFileHeader,
    PartitionInfo,
    PartitionInfoStruct,
    SegmentFileHeader,
    check_record,
    decode_headers,
    decode_index_entries,
    decode_record,
    decode_records,
    encode_index_entries,
    encode_record,
    partition_info_struct_offset,
)
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

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
KEY = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")


def make_record(txn: int, data: bytes = b"payload", header: int = 7) -> Record:
    return Record(txn, ReqId(1, 2, 3, txn), header, data, crc32(data))


records = st.builds(
    lambda txn, ids, header, data: Record(txn, ReqId(*ids), header, data, crc32(data)),
    st.integers(0, 2**63 - 1),
    st.tuples(int32, int32, int32, int32),
    int32,
    st.binary(max_size=200),
)


@given(records)
def test_record_round_trip(record):
    encoded = encode_record(record)
    assert len(encoded) == RECORD_OVERHEAD + len(record.data)
    decoded, end = decode_record(b"xx" + encoded + b"yy", 2, record.transaction_id)
    assert decoded == record
    assert end == 2 + len(encoded)


def test_record_layout_is_the_seed_table():
    record = Record(5, ReqId(-1, 2, 3, 4), -9, b"abc", crc32(b"abc"))
    encoded = encode_record(record)
    prefix = struct.pack(">q4iiii", 5, -1, 2, 3, 4, -9, 3, crc32(b"abc")) + b"abc"
    assert encoded == prefix + struct.pack(">i", crc32(prefix))
    # ReqId as four int32 is byte-identical to the original's two longs.
    assert encoded[8:24] == struct.pack(">qq", (-1 << 32) | 2, (3 << 32) | 4)


def test_decode_names_each_problem():
    encoded = encode_record(make_record(9, b"0123456789"))
    with pytest.raises(TransactionIdMismatch, match="transaction id 9, expected 8"):
        decode_record(encoded, 0, 8)
    with pytest.raises(TornRecordError, match="only 20 of its 36"):
        decode_record(encoded[:20], 0, 9)
    with pytest.raises(TornRecordError, match="needs 50 bytes"):
        decode_record(encoded[:-1], 0, 9)
    flipped = bytearray(encoded)
    flipped[40] ^= 0x01
    with pytest.raises(ChecksumError, match="record checksum"):
        decode_record(bytes(flipped), 0, 9, origin=1000)
    # Data checksum wrong but record checksum recomputed over it: the data checksum check catches it.
    bad = Record(9, ReqId(1, 2, 3, 4), 0, b"x", 12345)
    with pytest.raises(ChecksumError, match="data checksum 12345"):
        decode_record(encode_record(bad), 0, 9)
    negative = bytearray(encoded)
    negative[28:32] = struct.pack(">i", -5)
    with pytest.raises(CorruptionError, match="offset 100: negative data length -5"):
        decode_record(bytes(negative), 0, 9, origin=100)


def fields(record: Record) -> tuple:
    q = record.req_id
    return (
        record.transaction_id,
        q.client_id,
        q.generation,
        q.partition_id,
        q.seq_num,
        record.header,
        record.data,
        record.checksum,
    )


def encoded_run(first: int, n: int, origin: int = 500) -> tuple[bytes, list[int]]:
    """n consecutive records from first as they lie in a file from origin, and their index offsets (+ end)."""
    blobs = [encode_record(make_record(first + i, bytes(range(i, 2 * i + 3)))) for i in range(n)]
    offsets = [origin]
    for blob in blobs:
        offsets.append(offsets[-1] + len(blob))
    return b"".join(blobs), offsets


@given(st.lists(records, max_size=5), st.integers(0, 2**40))
def test_decode_records_is_decode_record_in_one_pass(batch, first):
    batch = [Record(first + i, r.req_id, r.header, r.data, r.checksum) for i, r in enumerate(batch)]
    blobs = [encode_record(r) for r in batch]
    offsets = [FILE_HEADER_SIZE]
    for blob in blobs:
        offsets.append(offsets[-1] + len(blob))
    assert decode_records(b"".join(blobs), offsets, first) == [fields(r) for r in batch]


def test_decode_records_names_each_problem():
    buf, offsets = encoded_run(7, 4)
    assert [f[0] for f in decode_records(buf, offsets, 7)] == [7, 8, 9, 10]
    with pytest.raises(TransactionIdMismatch, match="offset 500: transaction id 7, expected 6"):
        decode_records(buf, offsets, 6)
    flipped = bytearray(buf)
    flipped[offsets[2] - 500 + 37] ^= 0x10  # record 9's data
    with pytest.raises(ChecksumError, match=f"record at offset {offsets[2]}: record checksum"):
        decode_records(bytes(flipped), offsets, 7)
    # Data checksum wrong but the record checksum recomputed over it: still refused.
    bad = encode_record(Record(7, ReqId(1, 2, 3, 4), 0, b"x", 12345))
    with pytest.raises(ChecksumError, match="data checksum 12345"):
        decode_records(bad, [0, len(bad)], 7)
    # Torn ends and slots the records do not fill: tests/unit/storage/test_record_run.py, for both reads.


def test_decode_headers_from_the_whole_range_or_from_prefixes_alone():
    buf, offsets = encoded_run(7, 4)
    expected = [fields(make_record(7 + i, bytes(range(i, 2 * i + 3))))[:6] for i in range(4)]
    assert decode_headers(buf, [o - 500 for o in offsets[:-1]], offsets, 7) == expected
    prefixes = b"".join(buf[o - 500 : o - 500 + 36] for o in offsets[:-1])
    assert decode_headers(prefixes, [0, 36, 72, 108], offsets, 7) == expected
    with pytest.raises(TransactionIdMismatch, match="record at offset 500 has transaction id 7, expected 6"):
        decode_headers(prefixes, [0, 36, 72, 108], offsets, 6)
    with pytest.raises(CorruptionError, match=f"offset {offsets[1]}: data length 4 does not fill its 45 bytes"):
        decode_headers(prefixes, [0, 36], [offsets[0], offsets[1], offsets[2] + 1], 7)
    with pytest.raises(TornRecordError, match=f"offset {offsets[3]}: only 35 of its 36 header bytes"):
        decode_headers(prefixes[:-1], [0, 36, 72, 108], offsets, 7)


def test_check_record_rejects_bad_incoming_records():
    check_record(make_record(1, b"x" * 10), max_data_size=10)
    with pytest.raises(RecordTooLarge):
        check_record(make_record(1, b"x" * 11), max_data_size=10)
    with pytest.raises(DataChecksumMismatch):
        check_record(Record(1, ReqId(1, 2, 3, 4), 0, b"x", 0), max_data_size=10)
    with pytest.raises(InvalidRequest, match="header"):
        check_record(Record(1, ReqId(1, 2, 3, 4), 2**31, b"", crc32(b"")), max_data_size=10)
    with pytest.raises(InvalidRequest, match="out of range"):
        check_record(make_record(-1), max_data_size=10)


@given(int32, int64, int32)
def test_control_header_round_trip(version, created, num_partitions):
    header = ControlFileHeader(version, created, KEY, num_partitions)
    encoded = header.encode()
    assert len(encoded) == FILE_HEADER_SIZE
    assert encoded[:32] == struct.pack(">iq", version, created) + KEY.bytes + struct.pack(">i", num_partitions)
    assert encoded[32:] == bytes(96)
    assert ControlFileHeader.decode(encoded) == header


def test_control_header_check():
    header = ControlFileHeader(0, 0, KEY, 4)
    header.check(KEY, 4, "ctl")
    other = uuid.uuid4()
    with pytest.raises(ClusterKeyMismatch, match="another cluster") as refused:
        header.check(other, 4, "ctl")
    assert str(KEY) not in str(refused.value) and str(other) not in str(refused.value)  # issue 25: keys stay secret
    with pytest.raises(PartitionCountMismatch, match="number of partitions is 4, expected 5"):
        header.check(KEY, 5, "ctl")


@given(int32, int64, int32, int64)
def test_segment_header_round_trip(version, created, partition_id, first):
    header = SegmentFileHeader(version, created, KEY, partition_id, first)
    encoded = header.encode()
    assert len(encoded) == FILE_HEADER_SIZE
    assert encoded[:40] == struct.pack(">iq16siq", version, created, KEY.bytes, partition_id, first)
    assert SegmentFileHeader.decode(encoded) == header


@given(int64, int64, int64)
def test_partition_info_struct_round_trip(session, lwm, local):
    info = PartitionInfoStruct(session, lwm, local)
    encoded = info.encode()
    assert encoded[:24] == struct.pack(">qqq", session, lwm, local)
    assert struct.unpack(">i", encoded[24:])[0] == crc32(encoded[:24])
    assert PartitionInfoStruct.decode(encoded) == info


def test_partition_info_layout_and_fresh_structs():
    encoded = PartitionInfo.fresh(3).encode()
    assert len(encoded) == PARTITION_INFO_SIZE
    assert encoded[:4] == struct.pack(">i", 3)
    assert encoded[4:32] == encoded[32:60] == FRESH_PARTITION_INFO.encode()
    assert PartitionInfo.decode(encoded, 3) == PartitionInfo.fresh(3)
    assert partition_info_struct_offset(3, 1) == 128 + 3 * 60 + 4 + 28


def test_partition_info_alternates_and_picks_the_larger_tuple():
    info = PartitionInfo.fresh(0)
    written = []
    for step in range(1, 5):
        slot, info = info.updated(PartitionInfoStruct(step, step * 10, step * 10 - 1))
        written.append(slot)
        assert info.current == PartitionInfoStruct(step, step * 10, step * 10 - 1)
    assert written == [1, 0, 1, 0]
    # Same session, larger low-water mark wins.
    tie = PartitionInfo(0, (PartitionInfoStruct(5, 10, 3), PartitionInfoStruct(5, 11, 0)))
    assert tie.current_slot() == 1


def test_one_corrupt_struct_uses_the_other_both_corrupt_fails():
    good = PartitionInfoStruct(7, 100, 90)
    encoded = bytearray(PartitionInfo(2, (good, PartitionInfoStruct(8, 200, 190))).encode())
    encoded[40] ^= 0xFF  # inside struct 2
    info = PartitionInfo.decode(bytes(encoded), 2)
    assert info.slots[1] is None
    assert info.current == good
    assert info.updated(PartitionInfoStruct(9, 1, 1))[0] == 1  # the damaged slot is rewritten
    encoded[10] ^= 0xFF  # inside struct 1 too
    both_bad = PartitionInfo.decode(bytes(encoded), 2)
    with pytest.raises(PartitionInfoCorrupted, match="partition 2: both structs fail their checksum"):
        _ = both_bad.current


def test_partition_info_naming_another_partition_is_corrupt():
    with pytest.raises(PartitionInfoCorrupted, match="names partition 1"):
        PartitionInfo.decode(PartitionInfo.fresh(1).encode(), 2)


@given(st.lists(int64, max_size=50))
def test_index_entries_round_trip(offsets):
    encoded = encode_index_entries(offsets)
    assert encoded == b"".join(struct.pack(">q", o) for o in offsets)
    assert decode_index_entries(encoded + b"\x01\x02") == offsets
