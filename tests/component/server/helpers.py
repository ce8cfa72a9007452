"""Builders for client messages in server component tests."""

from __future__ import annotations

from waltz.v1 import common_pb2, server_pb2
from waltz_common.types import crc32


def req(client_id: int = 1, seq: int = 1, partition_id: int = 0, generation: int = 1) -> common_pb2.ReqId:
    return common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=partition_id, seq_num=seq)


def append(
    client_id: int = 1,
    seq: int = 1,
    data: bytes = b"x",
    hwm: int = -1,
    write: tuple[int, ...] = (),
    read: tuple[int, ...] = (),
    appends: tuple[int, ...] = (),
    partition_id: int = 0,
    generation: int = 1,
    header: int = 0,
) -> server_pb2.AppendRequest:
    return server_pb2.AppendRequest(
        req_id=req(client_id, seq, partition_id, generation),
        client_high_water_mark=hwm,
        write_lock_request_length=len(write),
        write_locks=write,
        read_lock_request_length=len(read),
        read_locks=read,
        append_lock_request_length=len(appends),
        append_locks=appends,
        header=header,
        data_length=len(data),
        data=data,
        checksum=crc32(data),
    )


def mount(
    client_id: int = 1, seq: int = 0, hwm: int = -1, partition_id: int = 0, generation: int = 1, net_seq: int = 1
):
    return server_pb2.MountRequest(
        req_id=req(client_id, seq, partition_id, generation), client_high_water_mark=hwm, seq_num=net_seq
    )


def feed_of(first: int, requests):
    """partition_feeds.prepared_feed of AppendRequests of one partition (the partition builds it from its queued
    appends, which read these fields from their requests once)."""
    from types import SimpleNamespace

    from waltz_server.partition_feeds import prepared_feed

    requests = list(requests)
    entries = [
        SimpleNamespace(client_id=r.req_id.client_id, generation=r.req_id.generation, seq_num=r.req_id.seq_num,
                        header=r.header)
        for r in requests
    ]
    return prepared_feed(first, requests[0].req_id.partition_id if requests else 0, entries)
