"""Append request validation: the checks a request must pass before it may be queued."""

from __future__ import annotations

from waltz.v1 import common_pb2, server_pb2
from waltz_common.types import ReqId, crc32


def req_id_of(message: common_pb2.ReqId) -> ReqId:
    return ReqId(message.client_id, message.generation, message.partition_id, message.seq_num)


def req_id_message(req_id: ReqId) -> common_pb2.ReqId:
    return common_pb2.ReqId(
        client_id=req_id.client_id,
        generation=req_id.generation,
        partition_id=req_id.partition_id,
        seq_num=req_id.seq_num,
    )


def append_problem(request: server_pb2.AppendRequest, max_transaction_bytes: int) -> str | None:
    """Why the request is malformed (a message a person can act on), or None when it is fine."""
    data = request.data  # each access copies the bytes: read them once (the append hot path)
    size = len(data)
    if size > max_transaction_bytes:
        return f"transaction data of {size} bytes exceeds server.maxTransactionBytes={max_transaction_bytes}"
    if request.data_length != size:
        return f"data_length {request.data_length} does not match the {size} bytes of data"
    if request.checksum != crc32(data):
        return f"checksum {request.checksum} is not the CRC-32 of the data ({crc32(data)})"
    if (
        request.write_lock_request_length
        or request.read_lock_request_length
        or request.append_lock_request_length
        or request.write_locks
        or request.read_locks
        or request.append_locks
    ):
        return _lock_problem(request)
    return None


def _lock_problem(request: server_pb2.AppendRequest) -> str | None:
    for name, length, values in (
        ("write", request.write_lock_request_length, request.write_locks),
        ("read", request.read_lock_request_length, request.read_locks),
        ("append", request.append_lock_request_length, request.append_locks),
    ):
        if length != len(values):
            return f"{name}_lock_request_length {length} does not match the {len(values)} {name} locks"
    return None
