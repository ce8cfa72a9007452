"""Conversions between the client's values and the waltz.v1 protobuf messages."""

from __future__ import annotations

from collections.abc import Iterable

from waltz.v1 import server_pb2
from waltz_client.api import TransactionBuilder
from waltz_client.monitor import ReqIdFields
from waltz_common.types import INT32_MAX, ReqId, crc32_unsigned
from waltz_common.wire import req_id_from_proto as req_id_from_proto
from waltz_common.wire import req_id_to_proto as req_id_to_proto


def mount_request(req_id: ReqId, client_high_water_mark: int, seq_num: int,
                  inline_data_max_bytes: int = 0) -> server_pb2.ClientMessage:
    return server_pb2.ClientMessage(mount=server_pb2.MountRequest(
        req_id=req_id_to_proto(req_id), client_high_water_mark=client_high_water_mark, seq_num=seq_num,
        inline_data_max_bytes=inline_data_max_bytes))


def feed_request(req_id: ReqId, client_high_water_mark: int,
                 inline_data_max_bytes: int = 0) -> server_pb2.ClientMessage:
    return server_pb2.ClientMessage(feed=server_pb2.FeedRequest(
        req_id=req_id_to_proto(req_id), client_high_water_mark=client_high_water_mark,
        inline_data_max_bytes=inline_data_max_bytes))


def flush_request(req_id: ReqId) -> server_pb2.ClientMessage:
    return server_pb2.ClientMessage(flush=server_pb2.FlushRequest(req_id=req_id_to_proto(req_id)))


def fill_append_request(request: server_pb2.AppendRequest, req_id: ReqIdFields, builder: TransactionBuilder) -> None:
    """Fill an empty AppendRequest in place (one already inside its batch: nothing is copied)."""
    fill_append_requests((request,), ((builder, req_id),))


def fill_append_requests(requests: Iterable[server_pb2.AppendRequest],
                         appends: Iterable[tuple[TransactionBuilder, ReqIdFields]]) -> None:
    """fill_append_request for each empty request and (builder, its ReqId), in one call."""
    # Field by field, and fields left at 0 not set at all: each set costs more than the test (this runs
    # once per append); cheaper than keyword arguments or a ReqId message copied in.
    for request, (builder, req_id) in zip(requests, appends, strict=True):
        data = builder.data
        request.client_high_water_mark = builder.client_high_water_mark
        if builder.header:
            request.header = builder.header
        request.data_length = len(data)
        request.data = data
        checksum = crc32_unsigned(data)  # waltz_common.types.crc32, inline: a signed int32 as the seed's
        request.checksum = checksum - 0x100000000 if checksum > INT32_MAX else checksum
        q = request.req_id
        q.client_id = req_id.client_id
        if req_id.generation:
            q.generation = req_id.generation
        if req_id.partition_id:
            q.partition_id = req_id.partition_id
        q.seq_num = req_id.seq_num
        if not (builder._write_locks or builder._read_locks or builder._append_locks):  # takes_locks(), inline
            continue
        if builder.write_locks:
            request.write_lock_request_length = len(builder.write_locks)
            request.write_locks.extend(builder.write_locks)
        if builder.read_locks:
            request.read_lock_request_length = len(builder.read_locks)
            request.read_locks.extend(builder.read_locks)
        if builder.append_locks:
            request.append_lock_request_length = len(builder.append_locks)
            request.append_locks.extend(builder.append_locks)


def message_partitions(message: server_pb2.ServerMessage) -> list[tuple[int, server_pb2.ServerMessage]]:
    """The partition a server message is for, with the message (none: nothing to deliver). A feed batch
    carries one partition's entries (the contract): it goes to its first entry's partition, which
    ignores any entry of another one (ClientPartition._on_feed reads every entry's partition anyway)."""
    kind = message.WhichOneof("message")
    if kind == "feed":
        entries = message.feed.transactions
        return [(entries[0].req_id.partition_id, message)] if entries else []
    if kind is None:
        return []
    return [(getattr(message, kind).req_id.partition_id, message)]
