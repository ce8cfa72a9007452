"""Append request validation messages."""

from __future__ import annotations

from waltz.v1 import common_pb2, server_pb2
from waltz_common.types import ReqId, crc32
from waltz_server.validation import append_problem, req_id_message, req_id_of


def request(data: bytes = b"abc", **fields) -> server_pb2.AppendRequest:
    message = server_pb2.AppendRequest(data=data, data_length=len(data), checksum=crc32(data))
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    return message


def test_a_good_request_passes():
    assert append_problem(request(), 10) is None
    locked = request(write_locks=[1, 2], write_lock_request_length=2, read_locks=[3], read_lock_request_length=1)
    assert append_problem(locked, 10) is None


def test_each_problem_is_named():
    assert "checksum" in append_problem(request(checksum=5), 10)
    assert "data_length 9" in append_problem(request(data_length=9), 10)
    assert "read_lock_request_length 0" in append_problem(request(read_locks=[1]), 10)
    assert "append_lock_request_length 2" in append_problem(request(append_lock_request_length=2), 10)
    assert "exceeds server.maxTransactionBytes=2" in append_problem(request(), 2)
    negative = crc32(b"\xff" * 7)
    assert append_problem(request(b"\xff" * 7), 10) is None and negative == request(b"\xff" * 7).checksum


def test_req_id_round_trip():
    req_id = ReqId(1, 2, 3, -4)
    assert req_id_of(req_id_message(req_id)) == req_id
    assert isinstance(req_id_message(req_id), common_pb2.ReqId)
