"""Conversions between the store API's value types and the storage protocol's messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waltz.v1 import common_pb2, storage_pb2
from waltz_common.record_layout import RECORD_CRC, RECORD_PREFIX
from waltz_common.types import crc32_unsigned
from waltz_common.wire import header_from_proto as header_from_proto
from waltz_common.wire import record_from_proto as record_from_proto
from waltz_server.store.api import PendingRecord


def append_request(
    session_id: int, partition_id: int, records: Sequence[common_pb2.Record]
) -> storage_pb2.StorageRequest:
    return storage_pb2.StorageRequest(
        append=storage_pb2.StorageAppendRequest(
            session_id=session_id, partition_id=partition_id, record_list_length=len(records), records=records
        )
    )


def append_pending_request(
    session_id: int, partition_id: int, first: int, records: Sequence[PendingRecord], committed: int | None = None
) -> storage_pb2.StorageRequest:
    """The append of records with ids first.., sent as encoded_records: the records as the data file holds
    them, one bytes field instead of a message per record. Building it costs about a quarter less than filling
    a Record per append (185-199 against 244-274 us per 100 records), and the storage node checks it in about
    half the time it took to encode the Records (no protobuf field reads), then writes it as it is.

    committed: the session's high-water mark now (a majority holds every transaction up to it): the storage
    node refuses to truncate below it (waltz_storage.rules)."""
    request = storage_pb2.StorageRequest()
    append = request.append
    append.session_id = session_id
    append.partition_id = partition_id
    append.record_list_length = len(records)
    append.encoded_records = encode_pending(first, records)
    if committed is not None:
        append.committed_high_water_mark = committed
    return request


def encode_pending(first: int, records: Sequence[PendingRecord]) -> bytes:
    """records with ids first.. in the data file's record layout (waltz_common.record_layout), back to back."""
    pieces: list[bytes] = []
    put = pieces.append
    pack = RECORD_PREFIX.pack
    pack_crc = RECORD_CRC.pack
    crc = crc32_unsigned
    for transaction_id, r in enumerate(records, first):
        q = r.req_id
        data = r.data  # each access of a protobuf bytes field copies it: read it once
        block = pack(
            transaction_id, q.client_id, q.generation, q.partition_id, q.seq_num, r.header, len(data), r.checksum
        )
        block += data
        put(block)
        put(pack_crc(crc(block)))
    return b"".join(pieces)


def open_request(cluster_key: str, num_partitions: int) -> storage_pb2.StorageRequest:
    return storage_pb2.StorageRequest(
        open=storage_pb2.OpenRequest(
            session_id=-1, seq_num=-1, partition_id=-1, cluster_key=cluster_key, num_partitions=num_partitions
        )
    )


def request_body(message: storage_pb2.StorageRequest) -> Any:
    """The oneof member a request carries (every member has session_id, seq_num and partition_id)."""
    kind = message.WhichOneof("request")
    if kind is None:
        raise ValueError("empty storage request")
    return getattr(message, kind)


def response_body(message: storage_pb2.StorageResponse) -> Any:
    """The oneof member a response carries (every member echoes session_id, seq_num and partition_id)."""
    kind = message.WhichOneof("response")
    if kind is None:
        raise ValueError("empty storage response")
    return getattr(message, kind)
