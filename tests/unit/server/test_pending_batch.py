"""A PendingBatch's storage request (records encoded once per append when queued, joined when sent) is byte for byte
the one store.wire builds from the AppendRequests, and the partition's inline packing is record_body's."""

from __future__ import annotations

import random

import pytest

from waltz.v1 import server_pb2, storage_pb2
from waltz_common.record_layout import RECORD_CRC, RECORD_PREFIX
from waltz_common.types import crc32, crc32_unsigned
from waltz_server.pending_batch import RECORD_BODY, PendingBatch, storage_append_request
from waltz_server.store.wire import append_pending_request

INT32 = (-(2**31), 2**31 - 1)


def record_body(request: server_pb2.AppendRequest) -> bytes:
    """An append's record without its transaction id and CRC, from its request's fields (what the partition packs
    from the fields it read anyway)."""
    q, data = request.req_id, request.data
    return RECORD_BODY.pack(
        q.client_id, q.generation, q.partition_id, q.seq_num, request.header, len(data), request.checksum
    ) + data


def random_request(rng: random.Random) -> server_pb2.AppendRequest:
    data = rng.randbytes(rng.choice([0, 1, 7, 512, rng.randrange(4096)]))
    request = server_pb2.AppendRequest(
        header=rng.randint(*INT32),
        data_length=len(data),
        data=data,
        checksum=crc32(data) if rng.random() < 0.8 else rng.randint(*INT32),  # signed, as the client sends it
        client_high_water_mark=rng.randrange(-1, 1000),
    )
    q = request.req_id
    q.client_id, q.generation = rng.randint(*INT32), rng.randint(*INT32)
    q.partition_id, q.seq_num = rng.randrange(1000), rng.randint(*INT32)
    return request


@pytest.mark.parametrize("seed", range(20))
def test_a_pending_batch_encodes_what_wire_encodes(seed: int) -> None:
    rng = random.Random(seed)
    requests = [random_request(rng) for _ in range(rng.randrange(1, 120))]
    batch = PendingBatch(requests, [record_body(r) for r in requests])
    first = rng.choice([0, 1, rng.randrange(2**40), 2**63 - len(requests) - 1])
    committed = rng.choice([None, -1, first - 1])
    ours = storage_append_request(5, 3, first, batch, committed)
    theirs = append_pending_request(5, 3, first, requests, committed)
    assert ours.SerializeToString() == theirs.SerializeToString()
    assert list(batch) == requests and len(batch) == len(requests) and batch[-1] is requests[-1]


def test_each_encoded_record_carries_its_id_and_the_crc_of_the_whole_record() -> None:
    rng = random.Random(7)
    requests = [random_request(rng) for _ in range(5)]
    encoded = PendingBatch(requests, [record_body(r) for r in requests]).encoded(41)
    offset = 0
    for transaction_id, request in enumerate(requests, 41):
        prefix = RECORD_PREFIX.unpack_from(encoded, offset)
        q = request.req_id
        assert prefix == (transaction_id, q.client_id, q.generation, q.partition_id, q.seq_num, request.header,
                          len(request.data), request.checksum)
        end = offset + RECORD_PREFIX.size + len(request.data)
        assert encoded[offset + RECORD_PREFIX.size : end] == request.data
        assert RECORD_CRC.unpack_from(encoded, end)[0] == crc32_unsigned(encoded[offset:end])
        offset = end + RECORD_CRC.size
    assert offset == len(encoded)


def test_other_records_are_encoded_by_wire_and_a_batch_needs_a_body_per_request() -> None:
    requests = [random_request(random.Random(3))]
    assert storage_append_request(1, 2, 0, requests) == append_pending_request(1, 2, 0, requests)
    assert isinstance(storage_append_request(1, 2, 0, requests), storage_pb2.StorageRequest)
    with pytest.raises(ValueError):
        PendingBatch(requests, [])
