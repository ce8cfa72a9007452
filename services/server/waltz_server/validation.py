"""Append request validation: the checks a request must pass before it may be queued."""

from __future__ import annotations

from collections.abc import Sequence

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


DEFAULT_MAX_LOCKS_PER_APPEND = 256


def append_problem(
    request: server_pb2.AppendRequest, max_transaction_bytes: int, max_locks: int = DEFAULT_MAX_LOCKS_PER_APPEND
) -> str | None:
    """Why the request is malformed (a message a person can act on), or None when it is fine."""
    return data_problem(request, request.data, max_transaction_bytes) or lock_problem(
        request, request.write_locks, request.read_locks, request.append_locks, max_locks
    )


def data_problem(request: server_pb2.AppendRequest, data: bytes, max_transaction_bytes: int) -> str | None:
    """append_problem's data checks, given request.data (each read of it copies the bytes: the hot path reads
    it once)."""
    size = len(data)
    if size > max_transaction_bytes:
        return f"transaction data of {size} bytes exceeds server.maxTransactionBytes={max_transaction_bytes}"
    if request.data_length != size:
        return f"data_length {request.data_length} does not match the {size} bytes of data"
    if request.checksum != crc32(data):
        return f"checksum {request.checksum} is not the CRC-32 of the data ({crc32(data)})"
    return None


def lock_problem(
    request: server_pb2.AppendRequest,
    write: Sequence[int],
    read: Sequence[int],
    append: Sequence[int],
    max_locks: int = DEFAULT_MAX_LOCKS_PER_APPEND,
) -> str | None:
    """append_problem's lock checks, given the request's lock lists (each read of a repeated field makes a
    container: the hot path reads them once). The count is checked first, before anything costs per lock: a
    request with a million locks would otherwise hold the partition's loop for seconds and mark most of the
    hashed lock table, failing unrelated locks afterwards."""
    count = len(write) + len(read) + len(append)
    if count > max_locks:
        return f"{count} locks in one append; at most server.maxLocksPerAppend={max_locks} are allowed"
    for name, length, values in (
        ("write", request.write_lock_request_length, write),
        ("read", request.read_lock_request_length, read),
        ("append", request.append_lock_request_length, append),
    ):
        if length != len(values):
            return f"{name}_lock_request_length {length} does not match the {len(values)} {name} locks"
    return None
