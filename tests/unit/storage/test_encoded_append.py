"""Appends that carry their records already encoded (StorageAppendRequest.encoded_records), as the server sends
them: taken whole when every record is right, and otherwise refused with the error that names the fault."""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from waltz.v1 import storage_pb2
from waltz_common.types import Record, ReqId, crc32
from waltz_common.wire import record_to_proto, req_id_to_proto
from waltz_server.store.api import NewRecord
from waltz_server.store.wire import encode_pending
from waltz_storage.batch import _encoded_offsets, encode_appends, encode_records
from waltz_storage.codec import RECORD_OVERHEAD, RECORD_PREFIX, RECORD_PREFIX_SIZE
from waltz_storage.errors import InvalidRequest
from waltz_storage.protocol import records_from_append

int32 = st.integers(-(2**31), 2**31 - 1)
bodies = st.lists(st.tuples(st.tuples(int32, int32, int32, int32), int32, st.binary(max_size=2000)), max_size=12)


def pending(record: Record) -> NewRecord:
    return NewRecord(req_id_to_proto(record.req_id), record.header, record.data, record.checksum)


def encoded_request(first: int, records: list[Record], count: int | None = None) -> storage_pb2.StorageAppendRequest:
    """An append as the server builds it (store/wire.encode_pending)."""
    return storage_pb2.StorageAppendRequest(
        record_list_length=len(records) if count is None else count,
        encoded_records=encode_pending(first, [pending(r) for r in records]),
    )


def good(txn: int, data: bytes = b"0123456789") -> Record:
    return Record(txn, ReqId(1, 2, 3, txn), -4, data, crc32(data))


@given(st.integers(0, 2**62), bodies, st.integers(1, 3), st.booleans())
def test_encoded_appends_are_taken_whole_and_equal_the_checked_path(first, bodies, pieces, mixed):
    """Split over several requests, some of them (mixed) still carrying Record messages: the same batch as the
    checked path, and the server's bytes are the data file's bytes."""
    records = [
        Record(first + i, ReqId(*ids), header, data, crc32(data)) for i, (ids, header, data) in enumerate(bodies)
    ]
    step = -(-len(records) // pieces) or 1
    requests = []
    for n, i in enumerate(range(0, len(records), step)):
        part = records[i : i + step]
        if mixed and n % 2:
            requests.append(
                storage_pb2.StorageAppendRequest(record_list_length=len(part), records=map(record_to_proto, part))
            )
        else:
            requests.append(encoded_request(first + i, part))
    checked = encode_records(first, [r for m in requests for r in records_from_append(m)])
    assert [r.data for r in records] == [r.data for m in requests for r in records_from_append(m)]
    batch = encode_appends(requests, first, 2000)
    assert batch is not None
    assert (batch.first_transaction_id, batch.record_count, bytes(batch.data), batch.offsets) == checked


def damaged(records: list[Record], at: int, value: bytes, first: int = 5) -> storage_pb2.StorageAppendRequest:
    """The encoded request with value written over its bytes at `at`."""
    request = encoded_request(first, records)
    raw = bytearray(request.encoded_records)
    raw[at : at + len(value)] = value
    request.encoded_records = bytes(raw)
    return request


def reseal(request: storage_pb2.StorageAppendRequest) -> storage_pb2.StorageAppendRequest:
    """Give every record of the request a right record CRC again (after a change the CRC would catch)."""
    raw = bytearray(request.encoded_records)
    offset = 0
    while offset < len(raw):
        (length,) = struct.unpack_from(">i", raw, offset + RECORD_PREFIX_SIZE - 8)
        end = offset + RECORD_OVERHEAD + length
        struct.pack_into(">i", raw, end - 4, crc32(bytes(raw[offset : end - 4])))
        offset = end
    request.encoded_records = bytes(raw)
    return request


SECOND = RECORD_OVERHEAD + 10  # where the second record of two good ones starts


@pytest.mark.parametrize(
    ("request_of", "message"),
    [
        (lambda r: encoded_request(5, r, count=3), "record_list_length is 3 but the batch holds 2"),
        (
            lambda r: damaged(r, SECOND + 40, b"!"),
            "encoded record 1 of 100 bytes: record at offset 50: record checksum",
        ),
        (lambda r: damaged(r, 0, b"\xff"), "encoded record 0 of 100 bytes: record at offset 0: record checksum"),
        (lambda r: damaged(r, SECOND + 28, struct.pack(">i", 11)), r"needs 51 bytes \(data length 11\), only 50"),
        (lambda r: damaged(r, SECOND + 28, struct.pack(">i", -1)), "negative data length -1"),
        (lambda r: reseal(damaged(r, SECOND + 32, b"\0\0\0\0")), "data checksum 0 does not match"),
    ],
)
def test_a_malformed_encoded_append_is_refused_and_named(request_of, message):
    request = request_of([good(5), good(6)])
    assert encode_appends([request], 5, 10) is None
    with pytest.raises(InvalidRequest, match=message):
        records_from_append(request)


@pytest.mark.parametrize(
    ("request_of", "wrong"),
    [
        (lambda r: reseal(damaged(r, SECOND, struct.pack(">q", 9))), lambda r: r.transaction_id == 9),
        (lambda r: encoded_request(4, r), lambda r: r.transaction_id == 5),
        (lambda r: encoded_request(5, [r[0], good(6, b"x" * 11)]), lambda r: len(r.data) == 11),
    ],
)
def test_a_whole_encoded_append_with_a_wrong_record_is_left_to_the_partitions_checks(request_of, wrong):
    """Whole, intact records with a wrong id or size: not taken, and decoded as they are for the partition's
    checks to name (the node's answers: test_storage_service)."""
    request = request_of([good(5), good(6)])
    assert encode_appends([request], 5, 10) is None
    assert wrong(records_from_append(request)[1])


def test_cut_encoded_records_are_refused_and_named():
    whole = encoded_request(5, [good(5), good(6)])
    for cut in (1, RECORD_OVERHEAD - 1, RECORD_OVERHEAD + 9):
        request = storage_pb2.StorageAppendRequest(record_list_length=2, encoded_records=whole.encoded_records[:-cut])
        assert encode_appends([request], 5, 10) is None
        with pytest.raises(InvalidRequest, match="encoded record 1"):
            records_from_append(request)
    extra = storage_pb2.StorageAppendRequest(record_list_length=2, encoded_records=whole.encoded_records + b"\0")
    assert encode_appends([extra], 5, 10) is None
    with pytest.raises(InvalidRequest, match="encoded record 2 of 101 bytes: record at offset 100: only 1 of its 36"):
        records_from_append(extra)


def test_records_and_encoded_records_together_are_refused():
    request = encoded_request(5, [good(5)], count=2)
    request.records.append(record_to_proto(good(6)))
    assert encode_appends([request], 5, 10) is None
    with pytest.raises(InvalidRequest, match=r"both records \(1\) and encoded_records \(50 bytes\)"):
        records_from_append(request)


def one_by_one_offsets(encoded: bytes, count: int, first: int, max_record_size: int) -> list[int] | None:
    """The check of encoded records as it was before the hot path's loop was cut down (e4db9d1), kept as the
    reference: every test spelled out, record by record."""
    size = len(encoded)
    offsets: list[int] = []
    txn = first
    start = 0
    for _ in range(count):
        if start + RECORD_OVERHEAD > size:
            return None
        t, _c, _g, _p, _s, _h, length, checksum = RECORD_PREFIX.unpack_from(encoded, start)
        data_start = start + RECORD_PREFIX_SIZE
        end = data_start + length
        if (
            t != txn
            or not 0 <= length <= max_record_size
            or end + 4 > size
            or crc32(encoded[data_start:end]) != checksum
            or crc32(encoded[start:end]) != struct.unpack_from(">i", encoded, end)[0]
        ):
            return None
        offsets.append(start)
        start = end + 4
        txn += 1
    return offsets if start == size else None


def resealed(encoded: bytes) -> bytes:
    """reseal for bytes that may be damaged anywhere: each record's CRC made right again as far as the lengths
    lead (a length pointing back or past the end stops it)."""
    raw = bytearray(encoded)
    offset = 0
    while offset + RECORD_PREFIX_SIZE <= len(raw):
        (length,) = struct.unpack_from(">i", raw, offset + RECORD_PREFIX_SIZE - 8)
        end = offset + RECORD_OVERHEAD + length
        if not offset < end <= len(raw) or length < 0:
            break
        struct.pack_into(">i", raw, end - 4, crc32(bytes(raw[offset : end - 4])))
        offset = end
    return bytes(raw)


@settings(max_examples=300)
@example([b"abc", b"de"], None, [(1, 9, b"\x01")], 0, 100, False)  # a ReqId byte: only the record CRC sees it
@example([b"abc", b"de"], None, [(1, 32, b"\x01")], 0, 100, True)  # the data checksum, the record CRC made right
@given(
    st.lists(st.binary(max_size=300), max_size=6),
    st.one_of(st.none(), st.integers(-1, 8)),
    st.lists(
        st.tuples(
            st.integers(0, 5),
            st.one_of(st.integers(RECORD_PREFIX_SIZE - 8, RECORD_PREFIX_SIZE), st.integers(0, RECORD_OVERHEAD + 4)),
            st.binary(min_size=1, max_size=4),
        ),
        max_size=2,
    ),
    st.one_of(st.just(0), st.integers(1, 3)),
    st.sampled_from([0, 1, 100, 300]),
    st.booleans(),
)
def test_the_hot_paths_check_agrees_with_the_record_by_record_one(datas, count, patches, cut, limit, reseal_them):
    """Random batches, damaged at random (bytes overwritten, their CRCs made right again or not, a cut, a wrong
    count or limit): the hot path's check finds exactly what the record-by-record reference finds, and where
    both take the batch, the same offsets."""
    records = [good(7 + i, data) for i, data in enumerate(datas)]
    raw = bytearray(encoded_request(7, records).encoded_records)
    starts = [sum(RECORD_OVERHEAD + len(d) for d in datas[:i]) for i in range(len(datas) + 1)]
    for i, at, value in patches:  # at: a place in record i's prefix, or its first data bytes, or its CRC if short
        place = starts[min(i, len(datas))] + at
        raw[place : place + len(value)] = value
    encoded = bytes(raw[: max(0, len(raw) - cut)])
    if reseal_them:
        encoded = resealed(encoded)
    n = len(records) if count is None else count
    expected = one_by_one_offsets(encoded, n, 7, limit)
    assert _encoded_offsets(encoded, n, 7, limit) == expected
    whole = encoded == encoded_request(7, records).encoded_records and n == len(records)
    if whole and max(map(len, datas), default=0) <= limit:
        assert expected == starts[:-1]
