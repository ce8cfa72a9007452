"""Appends that carry their records already encoded (StorageAppendRequest.encoded_records), as the server sends
them: taken whole when every record is right, and otherwise refused with the error that names the fault."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.v1 import storage_pb2
from waltz_common.types import Record, ReqId, crc32
from waltz_common.wire import record_to_proto, req_id_to_proto
from waltz_server.store.api import NewRecord
from waltz_server.store.wire import encode_pending
from waltz_storage.batch import encode_appends, encode_records
from waltz_storage.codec import RECORD_OVERHEAD, RECORD_PREFIX_SIZE
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
