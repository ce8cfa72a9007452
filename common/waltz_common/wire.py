"""Conversions between the shared value types (ReqId, Record, RecordHeader) and their protobuf messages."""

from __future__ import annotations

from waltz.v1 import common_pb2
from waltz_common.types import Record, RecordHeader, ReqId


def varint(value: int) -> bytes:
    """value in protobuf's varint encoding (a negative int64 as its 64-bit two's complement, 10 bytes)."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def req_id_to_proto(r: ReqId) -> common_pb2.ReqId:
    return common_pb2.ReqId(
        client_id=r.client_id, generation=r.generation, partition_id=r.partition_id, seq_num=r.seq_num
    )


def req_id_from_proto(p: common_pb2.ReqId) -> ReqId:
    return ReqId(p.client_id, p.generation, p.partition_id, p.seq_num)


def record_to_proto(r: Record) -> common_pb2.Record:
    return common_pb2.Record(
        transaction_id=r.transaction_id,
        req_id=req_id_to_proto(r.req_id),
        header=r.header,
        data_length=len(r.data),
        data=r.data,
        checksum=r.checksum,
    )


def record_from_proto(p: common_pb2.Record) -> Record:
    """The record as sent; callers that take records from the network validate data_length themselves."""
    return Record(p.transaction_id, req_id_from_proto(p.req_id), p.header, p.data, p.checksum)


def header_to_proto(h: RecordHeader) -> common_pb2.RecordHeader:
    return common_pb2.RecordHeader(transaction_id=h.transaction_id, req_id=req_id_to_proto(h.req_id), header=h.header)


def header_from_proto(p: common_pb2.RecordHeader) -> RecordHeader:
    return RecordHeader(p.transaction_id, req_id_from_proto(p.req_id), p.header)
