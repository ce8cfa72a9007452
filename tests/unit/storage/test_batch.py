"""The one-pass append encoder: exactly the bytes of the per-record encoder, and None for anything it must refuse."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given
from hypothesis import strategies as st

from waltz.v1 import common_pb2, storage_pb2
from waltz_common.types import Record, ReqId, crc32
from waltz_common.wire import record_to_proto
from waltz_storage.batch import encode_appends, encode_records
from waltz_storage.codec import RECORD_OVERHEAD, encode_record
from waltz_storage.protocol import records_from_append

int32 = st.integers(-(2**31), 2**31 - 1)
bodies = st.tuples(st.tuples(int32, int32, int32, int32), int32, st.binary(max_size=300))


def requests_of(records: list[Record], cuts: list[int]) -> list[storage_pb2.StorageAppendRequest]:
    """The records split at the cut points into consecutive append requests (some possibly empty)."""
    bounds = [0, *sorted(c % (len(records) + 1) for c in cuts), len(records)]
    return [
        storage_pb2.StorageAppendRequest(
            record_list_length=hi - lo, records=[record_to_proto(r) for r in records[lo:hi]]
        )
        for lo, hi in itertools.pairwise(bounds)
    ]


@given(st.integers(0, 2**62), st.lists(bodies, max_size=20), st.lists(st.integers(0, 100), max_size=3))
def test_one_pass_encoding_is_byte_identical_to_the_per_record_encoder(first, bodies, cuts):
    records = [
        Record(first + i, ReqId(*ids), header, data, crc32(data)) for i, (ids, header, data) in enumerate(bodies)
    ]
    batch = encode_appends(requests_of(records, cuts), first, 300)
    assert batch is not None
    assert bytes(batch.data) == b"".join(encode_record(r) for r in records)
    assert batch.first_transaction_id == first and batch.record_count == len(records)
    sizes = [RECORD_OVERHEAD + len(r.data) for r in records]
    assert batch.offsets == [sum(sizes[:i]) for i in range(len(records))]
    assert encode_records(first, records) == (first, len(records), bytes(batch.data), batch.offsets)


def good(txn: int, data: bytes = b"0123456789") -> Record:
    return Record(txn, ReqId(1, 2, 3, txn), 0, data, crc32(data))


def test_anything_to_refuse_gives_none():
    def refused(records: list[Record], **changes: int) -> bool:
        request = storage_pb2.StorageAppendRequest(
            record_list_length=len(records), records=[record_to_proto(r) for r in records]
        )
        for name, value in changes.items():
            if name == "record_list_length":
                request.record_list_length = value
            else:
                setattr(request.records[-1], name, value)
        return encode_appends([request], 5, 10) is None

    assert not refused([good(5), good(6)])
    assert refused([good(5), good(7)])  # a gap
    assert refused([good(4)])  # behind
    assert refused([good(5), good(6, b"x" * 11)])  # too large
    assert refused([good(5), good(6)], data_length=9)
    assert refused([good(5), good(6)], checksum=crc32(b"0123456789") ^ 1)
    assert refused([good(5), good(6)], record_list_length=3)
    assert refused([good(5), good(6)], record_list_length=-1)
    assert refused([good(5), good(6)], transaction_id=-1)


def test_the_checksum_compares_as_the_seeds_signed_int():
    data = next(bytes([i]) * 7 for i in range(256) if crc32(bytes([i]) * 7) < 0)
    request = storage_pb2.StorageAppendRequest(record_list_length=1, records=[record_to_proto(good(0, data))])
    assert request.records[0].checksum < 0
    batch = encode_appends([request], 0, 100)
    assert batch is not None and bytes(batch.data) == encode_record(good(0, data))


def request_built_in_place(first: int, records: list[Record]) -> storage_pb2.StorageAppendRequest:
    """An append as the server builds it: each record added in place (store/wire.append_pending_request)."""
    request = storage_pb2.StorageAppendRequest(record_list_length=len(records))
    for r in records:
        request.records.add(
            transaction_id=r.transaction_id,
            req_id=common_pb2.ReqId(**dataclasses.asdict(r.req_id)),
            header=r.header,
            data_length=len(r.data),
            data=r.data,
            checksum=r.checksum,
        )
    return request


@given(
    st.integers(0, 2**62),
    st.lists(st.tuples(st.tuples(int32, int32, int32, int32), int32, st.binary(max_size=2000)), max_size=12),
    st.integers(1, 3),
)
def test_one_pass_encoding_equals_the_checked_path(first, bodies, pieces):
    """Records of any size (past the allocator's small-object bound too), split over several requests: the same
    batch as the checked path, records_from_append then encode_records."""
    records = [
        Record(first + i, ReqId(*ids), header, data, crc32(data)) for i, (ids, header, data) in enumerate(bodies)
    ]
    step = -(-len(records) // pieces) or 1
    requests = [request_built_in_place(first, records[i : i + step]) for i in range(0, len(records), step)]
    checked = encode_records(first, [r for m in requests for r in records_from_append(m)])
    batch = encode_appends(requests, first, 2000)
    assert batch is not None
    assert (batch.first_transaction_id, batch.record_count, bytes(batch.data), batch.offsets) == checked
