"""Conversions between the store API's value types and the storage protocol's messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waltz.v1 import common_pb2, storage_pb2
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
    session_id: int, partition_id: int, first: int, records: Sequence[PendingRecord]
) -> storage_pb2.StorageRequest:
    """The append of records with ids first.., built in place (no per-record message copies). Each record is
    added empty and then filled: with this protobuf (upb) that costs about a quarter less than add(**fields)."""
    request = storage_pb2.StorageRequest()
    append = request.append
    append.session_id = session_id
    append.partition_id = partition_id
    append.record_list_length = len(records)
    add = append.records.add
    for transaction_id, r in enumerate(records, first):
        record = add()
        record.transaction_id = transaction_id
        record.req_id.CopyFrom(r.req_id)
        record.header = r.header
        record.data_length = r.data_length
        record.data = r.data
        record.checksum = r.checksum
    return request


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
