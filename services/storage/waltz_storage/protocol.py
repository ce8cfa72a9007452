"""Pure translation between storage protocol messages and engine values, errors and Failure answers."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from waltz.v1 import common_pb2, storage_pb2
from waltz_common.types import Record, ReqId
from waltz_common.wire import header_to_proto as header_to_proto
from waltz_common.wire import record_to_proto as record_to_proto
from waltz_storage.codec import HeaderFields, RecordFields, decode_record
from waltz_storage.errors import (
    ClusterKeyMismatch,
    CommittedDataError,
    CorruptionError,
    DirtyDataError,
    InvalidRequest,
    PartitionCountMismatch,
    PartitionNotAssigned,
    PartitionNotReadable,
    PartitionNotWritable,
    PermissionDenied,
    PreconditionFailed,
    StaleSession,
    StorageError,
    UnknownPartition,
)

Code = storage_pb2.StorageRpcException.ErrorCode

log = logging.getLogger(__name__)


class NotOpen(PreconditionFailed):
    """A request arrived on a stream that has no successful Open."""


class OfflineNotAllowed(PreconditionFailed):
    """An offline-recovery request for a partition that is still writable."""


# Most specific first: UnknownPartition is an InvalidRequest, DirtyDataError a PreconditionFailed.
_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ClusterKeyMismatch, Code.CLUSTER_KEY_MISMATCH),
    (PartitionCountMismatch, Code.CLUSTER_KEY_MISMATCH),
    (StaleSession, Code.STALE_SESSION),
    (UnknownPartition, Code.UNKNOWN_PARTITION),
    (PartitionNotAssigned, Code.UNKNOWN_PARTITION),
    (PartitionNotReadable, Code.PARTITION_UNAVAILABLE),
    (PartitionNotWritable, Code.PARTITION_UNAVAILABLE),
    (OfflineNotAllowed, Code.PARTITION_UNAVAILABLE),
    (NotOpen, Code.NOT_OPEN),
    (PermissionDenied, Code.PERMISSION_DENIED),
    (CommittedDataError, Code.COMMITTED_DATA),
    (DirtyDataError, Code.INVALID_REQUEST),
    (InvalidRequest, Code.INVALID_REQUEST),
    (CorruptionError, Code.CORRUPTED),
    (StorageError, Code.IO_ERROR),
    (OSError, Code.IO_ERROR),
)


def error_code(exc: BaseException) -> int:
    """The ErrorCode a Failure carries for exc; unexpected exceptions are UNSPECIFIED."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return Code.ERROR_CODE_UNSPECIFIED


UNEXPECTED = "an unexpected error on the storage node; its log has the details"


def rpc_exception(exc: BaseException, message: str | None = None) -> storage_pb2.StorageRpcException:
    """The seed's StorageRpcException for exc: its message and code. The message is the error's own text (the
    storage engine's errors are written for a person), or UNEXPECTED for an error it did not raise on purpose,
    whose text may be a Python detail. No stack trace elements: frames stay in the node's log (the field is
    kept, empty, for the seed's wire format)."""
    code = error_code(exc)
    if message is None:
        message = str(exc) if code != Code.ERROR_CODE_UNSPECIFIED and str(exc) else UNEXPECTED
    return storage_pb2.StorageRpcException(message=message, code=code)  # type: ignore[arg-type]


def failure(session_id: int, seq_num: int, partition_id: int, exc: BaseException) -> storage_pb2.StorageResponse:
    """A Failure echoing the request's ids."""
    return storage_pb2.StorageResponse(
        failure=storage_pb2.FailureResponse(
            session_id=session_id, seq_num=seq_num, partition_id=partition_id, exception=rpc_exception(exc)
        )
    )


def success(session_id: int, seq_num: int, partition_id: int) -> storage_pb2.StorageResponse:
    response = storage_pb2.StorageResponse()
    answer = response.success  # filled in place: no second message to build and copy in
    answer.session_id = session_id
    answer.seq_num = seq_num
    answer.partition_id = partition_id
    return response


def parse_cluster_key(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ClusterKeyMismatch("the cluster key sent is not a UUID") from None


# ----------------------------------------------------------------------------- records


def record_from_proto(p: common_pb2.Record) -> Record:
    """An engine Record; InvalidRequest when data_length does not describe the data."""
    data = p.data  # each access copies the bytes: read it once (this is the append hot path)
    if p.data_length != len(data):
        raise InvalidRequest(
            f"record {p.transaction_id}: data_length {p.data_length} but {len(data)} data bytes; nothing was written"
        )
    r = p.req_id
    return Record(
        p.transaction_id, ReqId(r.client_id, r.generation, r.partition_id, r.seq_num), p.header, data, p.checksum
    )


def add_records(target: Any, records: Iterable[RecordFields]) -> None:
    """Append records to a repeated Record field, each built in place (the read hot path)."""
    add = target.add
    for transaction_id, client_id, generation, partition_id, seq_num, header, data, checksum in records:
        r = add()
        r.transaction_id = transaction_id
        q = r.req_id
        q.client_id = client_id
        q.generation = generation
        q.partition_id = partition_id
        q.seq_num = seq_num
        r.header = header
        r.data_length = len(data)
        r.data = data
        r.checksum = checksum


def add_headers(target: Any, headers: Iterable[HeaderFields]) -> None:
    """Append record headers to a repeated RecordHeader field, each built in place (the feed's hot path)."""
    add = target.add
    for transaction_id, client_id, generation, partition_id, seq_num, header in headers:
        h = add()
        h.transaction_id = transaction_id
        q = h.req_id
        q.client_id = client_id
        q.generation = generation
        q.partition_id = partition_id
        q.seq_num = seq_num
        h.header = header


def records_from_append(request: storage_pb2.StorageAppendRequest) -> list[Record]:
    """The batch's records, from records or from encoded_records; InvalidRequest when record_list_length does not
    count them, when both are set, or when encoded_records do not split into whole records with right CRCs (the
    other checks, of ids, sizes and data checksums, are the partition's, as for records)."""
    encoded = request.encoded_records
    if encoded and len(request.records):
        raise InvalidRequest(
            f"the append carries both records ({len(request.records)}) and encoded_records ({len(encoded)} bytes); "
            f"nothing was written"
        )
    records = records_from_encoded(encoded) if encoded else [record_from_proto(p) for p in request.records]
    if request.record_list_length != len(records):
        raise InvalidRequest(
            f"record_list_length is {request.record_list_length} but the batch holds {len(records)} "
            f"records; nothing was written"
        )
    return records


def records_from_encoded(encoded: bytes) -> list[Record]:
    """The records in encoded_records, decoded and checked as a data file's (codec.decode_record): whole, with
    the right record CRC and data checksum. A fault there is the request's: InvalidRequest naming it."""
    records: list[Record] = []
    offset = 0
    while offset < len(encoded):
        try:
            record, offset = decode_record(encoded, offset, None)
        except CorruptionError as e:
            raise InvalidRequest(
                f"encoded record {len(records)} of {len(encoded)} bytes: {e}; nothing was written"
            ) from None
        records.append(record)
    return records


def check_list_request(transaction_id: int, max_records: int) -> None:
    if transaction_id < 0:
        raise InvalidRequest(f"transaction id {transaction_id} is negative")
    if max_records < 0:
        raise InvalidRequest(f"max number of records {max_records} is negative")
