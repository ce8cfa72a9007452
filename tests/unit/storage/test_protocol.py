"""Pure protocol translation: error codes, StorageRpcException stack traces, record conversion."""

import pytest

from waltz.v1 import common_pb2, storage_pb2
from waltz_common.types import Record, ReqId, crc32
from waltz_storage import errors, protocol

Code = storage_pb2.StorageRpcException.ErrorCode


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.ClusterKeyMismatch("x"), Code.CLUSTER_KEY_MISMATCH),
        (errors.PartitionCountMismatch("x"), Code.CLUSTER_KEY_MISMATCH),
        (errors.StaleSession("x"), Code.STALE_SESSION),
        (errors.UnknownPartition("x"), Code.UNKNOWN_PARTITION),
        (errors.PartitionNotAssigned("x"), Code.UNKNOWN_PARTITION),
        (errors.PartitionNotReadable("x"), Code.PARTITION_UNAVAILABLE),
        (errors.PartitionNotWritable("x"), Code.PARTITION_UNAVAILABLE),
        (protocol.OfflineNotAllowed("x"), Code.PARTITION_UNAVAILABLE),
        (protocol.NotOpen("x"), Code.NOT_OPEN),
        (errors.DataChecksumMismatch("x"), Code.INVALID_REQUEST),
        (errors.DirtyDataError("x"), Code.INVALID_REQUEST),
        (errors.PartitionInfoCorrupted("x"), Code.CORRUPTED),
        (errors.StorageError("x"), Code.IO_ERROR),
        (OSError("x"), Code.IO_ERROR),
        (KeyError("x"), Code.ERROR_CODE_UNSPECIFIED),
    ],
)
def test_error_codes(exc, code):
    assert protocol.error_code(exc) == code


def _inner():
    raise errors.StaleSession("stale session 1, partition 0 is at session 2")


def test_rpc_exception_carries_message_and_code_but_no_stack_frames():
    try:
        _inner()
    except errors.StaleSession as e:
        rpc = protocol.rpc_exception(e)
    assert rpc.message == "stale session 1, partition 0 is at session 2"
    assert rpc.code == Code.STALE_SESSION
    assert rpc.stack_trace_length == len(rpc.stack_trace) == 0  # frames stay in the node's log (issue 28)
    never_raised = protocol.rpc_exception(errors.InvalidRequest("bad"))
    assert never_raised.stack_trace_length == 0 and never_raised.code == Code.INVALID_REQUEST


def test_an_unexpected_error_is_described_plainly_without_its_python_text():
    try:
        {}["missing"]
    except KeyError as e:
        rpc = protocol.rpc_exception(e)
    assert rpc.code == Code.ERROR_CODE_UNSPECIFIED
    assert rpc.message == "an unexpected error on the storage node; its log has the details"
    assert not rpc.stack_trace


def test_failure_echoes_ids():
    response = protocol.failure(7, 8, 9, errors.UnknownPartition("partition 9 does not exist"))
    assert (response.failure.session_id, response.failure.seq_num, response.failure.partition_id) == (7, 8, 9)


def test_success_echoes_ids_even_when_all_are_zero():
    for ids in ((4, 100, 1), (0, 0, 0)):
        response = protocol.success(*ids)
        assert response.WhichOneof("response") == "success"
        assert response == storage_pb2.StorageResponse(
            success=storage_pb2.SuccessResponse(session_id=ids[0], seq_num=ids[1], partition_id=ids[2])
        )


def test_records_round_trip_and_lengths_are_checked():
    record = Record(5, ReqId(1, 2, 3, 4), -6, b"abc", crc32(b"abc"))
    message = protocol.record_to_proto(record)
    assert message.data_length == 3
    assert protocol.record_from_proto(message) == record
    message.data_length = 4
    with pytest.raises(errors.InvalidRequest, match="data_length 4 but 3 data bytes"):
        protocol.record_from_proto(message)
    append = storage_pb2.StorageAppendRequest(record_list_length=2, records=[protocol.record_to_proto(record)])
    with pytest.raises(errors.InvalidRequest, match="record_list_length is 2 but the batch holds 1"):
        protocol.records_from_append(append)
    assert protocol.header_to_proto(record.record_header) == common_pb2.RecordHeader(
        transaction_id=5, req_id=common_pb2.ReqId(client_id=1, generation=2, partition_id=3, seq_num=4), header=-6
    )


def test_cluster_key_must_be_a_uuid():
    with pytest.raises(errors.ClusterKeyMismatch, match="not a UUID"):
        protocol.parse_cluster_key("nope")
