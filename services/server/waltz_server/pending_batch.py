"""A batch of appends on its way to the store, with each append's record already in the data file's layout but for
its transaction id: the storage request's encoded_records is then joined from them, not re-read from protobuf.

The partition reads every field of an append once, when it validates it, and encodes its record there
(RECORD_BODY.pack(...) + data); the store session asks the batch for its storage request once the ids are known
(storage_append_request). Any other sequence of PendingRecords is encoded by store.wire as before; both give the same
bytes (tests/unit/server/test_pending_batch.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import overload

from waltz.v1 import server_pb2, storage_pb2
from waltz_common.record_layout import RECORD_CRC, RECORD_PREFIX
from waltz_common.types import crc32_unsigned
from waltz_server.store.api import PendingRecord
from waltz_server.store.wire import append_pending_request

TRANSACTION_ID = struct.Struct(RECORD_PREFIX.format[:2])
"""The record prefix's first field (the transaction id, assigned when the batch is sent)."""
RECORD_BODY = struct.Struct(RECORD_PREFIX.format[:1] + RECORD_PREFIX.format[2:])
"""The rest of the record prefix: client id, generation, partition id, seq num, header, data length, checksum."""
assert TRANSACTION_ID.size + RECORD_BODY.size == RECORD_PREFIX.size


class PendingBatch(Sequence[server_pb2.AppendRequest]):
    """The appends of one batch (a Sequence of their AppendRequests, each a PendingRecord as it is) and their records'
    bodies, in the same order."""

    __slots__ = ("_bodies", "_requests")

    def __init__(self, requests: list[server_pb2.AppendRequest], bodies: list[bytes]) -> None:
        if len(requests) != len(bodies):
            raise ValueError("a pending batch needs one record body per request")
        self._requests = requests
        self._bodies = bodies

    def __len__(self) -> int:
        return len(self._requests)

    @overload
    def __getitem__(self, index: int) -> server_pb2.AppendRequest: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[server_pb2.AppendRequest]: ...

    def __getitem__(self, index: int | slice) -> server_pb2.AppendRequest | Sequence[server_pb2.AppendRequest]:
        return self._requests[index]

    def __iter__(self) -> Iterator[server_pb2.AppendRequest]:
        return iter(self._requests)

    def encoded(self, first: int) -> bytes:
        """The records as transactions first.., back to back in the data file's layout (store.wire.encode_pending's
        bytes): per record its id, its body, and the CRC of both (the CRC of the body continued from the id's)."""
        pieces: list[bytes] = []
        put = pieces.append
        pack_id, pack_crc, crc = TRANSACTION_ID.pack, RECORD_CRC.pack, crc32_unsigned
        for transaction_id, body in enumerate(self._bodies, first):
            head = pack_id(transaction_id)
            put(head)
            put(body)
            put(pack_crc(crc(body, crc(head))))
        return b"".join(pieces)


def storage_append_request(
    session_id: int, partition_id: int, first: int, records: Sequence[PendingRecord], committed: int | None = None
) -> storage_pb2.StorageRequest:
    """store.wire.append_pending_request's request; a PendingBatch's records are joined from their bodies."""
    if not isinstance(records, PendingBatch):
        return append_pending_request(session_id, partition_id, first, records, committed)
    request = append_pending_request(session_id, partition_id, first, (), committed)  # every field but the records
    request.append.record_list_length = len(records)
    request.append.encoded_records = records.encoded(first)
    return request
