"""Every table of the seeds has a protobuf message holding every field the table lists.

Each entry below names a seed table, the message that carries it, and for every field the seed
lists (by the seed's own name) the protobuf field that carries it. The test checks the names
against the seed text, so the lists cannot drift from the seeds, and against the compiled
descriptors, so the contract cannot drift from the lists.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from waltz.v1 import common_pb2, metadata_pb2, server_pb2, storage_admin_pb2, storage_pb2

# The design documents live in shared/seeds beside the checkout (as in CI); WALTZ_SEEDS overrides.
SEEDS = Path(os.environ.get("WALTZ_SEEDS", Path(__file__).resolve().parents[2].parent / "shared" / "seeds"))

STORAGE_HEADER = [("Session ID", "session_id"), ("Sequence number", "seq_num"), ("Partition ID", "partition_id")]
MODULES = (common_pb2, storage_pb2, storage_admin_pb2, server_pb2, metadata_pb2)

# (seed file, table name as the seed writes it, message name, [(seed field, proto field), ...])
TABLES: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("server-storage-protocol.txt", "Open Request", "OpenRequest",
     [*STORAGE_HEADER, ("Cluster key", "cluster_key"), ("Number of partitions", "num_partitions")]),
    ("server-storage-protocol.txt", "Last Session Info Request", "LastSessionInfoRequest", STORAGE_HEADER),
    ("server-storage-protocol.txt", "Last Session Info Response", "LastSessionInfoResponse",
     [*STORAGE_HEADER, ("Session ID", "last_session_id"), ("Low-water Mark", "low_water_mark")]),
    ("server-storage-protocol.txt", "Max Transaction ID Request", "MaxTransactionIdRequest", STORAGE_HEADER),
    ("server-storage-protocol.txt", "Max Transaction ID Response", "MaxTransactionIdResponse",
     [*STORAGE_HEADER, ("Transaction ID", "transaction_id")]),
    ("server-storage-protocol.txt", "Truncate Request", "TruncateRequest",
     [*STORAGE_HEADER, ("Transaction ID", "transaction_id")]),
    ("server-storage-protocol.txt", "Set Low-water Mark Request", "SetLowWaterMarkRequest",
     [*STORAGE_HEADER, ("Low-water mark", "low_water_mark")]),
    ("server-storage-protocol.txt", "Append Request", "StorageAppendRequest",
     [*STORAGE_HEADER, ("Record List Length", "record_list_length"), ("Record List", "records")]),
    ("server-storage-protocol.txt", "RecordHeader", "RecordHeader",
     [("Transaction ID", "transaction_id"), ("Request ID", "req_id"), ("Transaction Header", "header")]),
    ("server-storage-protocol.txt", "Record", "Record",
     [("Transaction ID", "transaction_id"), ("Request ID", "req_id"), ("Transaction Header", "header"),
      ("Transaction Data Length", "data_length"), ("Transaction Data", "data"), ("Checksum", "checksum")]),
    ("server-storage-protocol.txt", "Record Header Request", "RecordHeaderRequest",
     [*STORAGE_HEADER, ("Transaction ID", "transaction_id")]),
    ("server-storage-protocol.txt", "Request Header Response", "RecordHeaderResponse",
     [*STORAGE_HEADER, ("Record header", "record_header")]),
    ("server-storage-protocol.txt", "Record Request", "RecordRequest",
     [*STORAGE_HEADER, ("Transaction ID", "transaction_id")]),
    ("server-storage-protocol.txt", "Record Response", "RecordResponse", [*STORAGE_HEADER, ("Record", "record")]),
    ("server-storage-protocol.txt", "Record Header List Request", "RecordHeaderListRequest",
     [*STORAGE_HEADER, ("Transaction ID", "transaction_id"), ("Max number of records", "max_records")]),
    ("server-storage-protocol.txt", "Request Header List Response", "RecordHeaderListResponse",
     [*STORAGE_HEADER, ("Record header list Length", "record_header_list_length"),
      ("Record header list", "record_headers")]),
    ("server-storage-protocol.txt", "Record List Request", "RecordListRequest",
     [*STORAGE_HEADER, ("Transaction ID", "transaction_id"), ("Max number of records", "max_records")]),
    ("server-storage-protocol.txt", "Record List Response", "RecordListResponse",
     [*STORAGE_HEADER, ("Record List Length", "record_list_length"), ("Record List", "records")]),
    ("server-storage-protocol.txt", "Success Response", "SuccessResponse", STORAGE_HEADER),
    ("server-storage-protocol.txt", "Failure Response", "FailureResponse",
     [*STORAGE_HEADER, ("Exception", "exception")]),
    ("server-storage-protocol.txt", "StorageRpcException", "StorageRpcException",
     [("Message", "message"), ("Stack Trace Length", "stack_trace_length"),
      ("Stack Trace Element", "stack_trace")]),
    ("server-storage-protocol.txt", "Stack Trace Element", "StackTraceElement",
     [("Class name", "class_name"), ("Method name", "method_name"), ("File name", "file_name"),
      ("Line number", "line_number")]),
    ("server-storage-protocol.txt", "Replica Assignments", "ReplicaAssignments",
     [("Map of Storage to Partition ID List", "storage_replicas")]),
    ("server-storage-protocol.txt", "Replica Assignments", "StorageReplicas",
     [("Connect String", "connect_string"), ("Replica IDs", "replica_ids")]),
    ("server-storage-protocol.txt", "Group Descriptor", "GroupDescriptor",
     [("Map of Connect String to Group ID", "groups")]),
    ("server-storage-protocol.txt", "Group Descriptor", "StorageGroup",
     [("Connect String", "connect_string"), ("Group ID", "group_id")]),
    ("server-storage-protocol.txt", "Admin Open Request", "AdminOpenRequest",
     [("Sequence number", "seq_num"), ("Cluster key", "cluster_key"), ("Number of partitions", "num_partitions")]),
    ("server-storage-protocol.txt", "Partition Assignment Request", "PartitionAssignmentRequest",
     [("Sequence number", "seq_num"), ("Partition ID", "partition_id"), ("Toggled", "toggled")]),
    ("server-storage-protocol.txt", "Partition Read Request", "PartitionReadRequest",
     [("Sequence number", "seq_num"), ("Partition ID", "partition_id"), ("Toggled", "toggled")]),
    ("server-storage-protocol.txt", "Partition Write Request", "PartitionWriteRequest",
     [("Sequence number", "seq_num"), ("Partition ID", "partition_id"), ("Toggled", "toggled")]),
    ("client-server-protocol.txt", "Request ID (ReqId)", "ReqId",
     [("Client ID", "client_id"), ("Generation", "generation"), ("Partition ID", "partition_id"),
      ("Sequence number", "seq_num")]),
    ("client-server-protocol.txt", "Mount Request", "MountRequest",
     [("Request ID", "req_id"), ("Client High-water Mark", "client_high_water_mark"),
      ("sequence number", "seq_num")]),
    ("client-server-protocol.txt", "Mount Response", "MountResponse",
     [("Request ID", "req_id"), ("Partition Ready", "partition_ready")]),
    ("client-server-protocol.txt", "Append Request", "AppendRequest",
     [("Request ID", "req_id"), ("Client High-water Mark", "client_high_water_mark"),
      ("Write Lock Request Length", "write_lock_request_length"),
      ("Write Lock Request Hash Values", "write_locks"),
      ("Read Lock Request Length", "read_lock_request_length"),
      ("Read Lock Request Hash Values", "read_locks"), ("Transaction Header", "header"),
      ("Transaction Data Length", "data_length"), ("Transaction Bytes", "data"), ("Checksum", "checksum")]),
    ("client-server-protocol.txt", "Feed Request", "FeedRequest",
     [("Request ID", "req_id"), ("Client High-water Mark", "client_high_water_mark")]),
    ("client-server-protocol.txt", "Feed Data", "FeedData",
     [("Request ID", "req_id"), ("Transaction ID", "transaction_id"), ("Transaction Header", "header")]),
    ("client-server-protocol.txt", "Transaction Data Request", "TransactionDataRequest",
     [("Request ID", "req_id"), ("Transaction ID", "transaction_id")]),
    ("client-server-protocol.txt", "Transaction Data Response", "TransactionDataResponse",
     [("Request ID", "req_id"), ("Transaction ID", "transaction_id"), ("Success Flag", "success"),
      ("Transaction Data Length", "data_length"), ("Transaction Data Bytes", "data"), ("Checksum", "checksum"),
      ("Error Message", "error_message")]),
    ("client-server-protocol.txt", "Flush Request", "FlushRequest", [("Request ID", "req_id")]),
    ("client-server-protocol.txt", "Flush Response", "FlushResponse",
     [("Request ID", "req_id"), ("Transaction ID", "transaction_id")]),
    ("client-server-protocol.txt", "Lock Failure", "LockFailure",
     [("Request ID", "req_id"), ("Transaction ID", "transaction_id")]),
    ("server-design.txt", "Partition Metadata", "PartitionMetadata",
     [("Generation", "generation"), ("Session ID", "session_id"),
      ("Map of Replica ID to Replica State", "replica_states")]),
    ("server-design.txt", "Partition Metadata", "ReplicaStateEntry",
     [("Replica ID", "replica_id"), ("Replica State", "replica_state")]),
    ("server-design.txt", "ReplicaId", "ReplicaId",
     [("Partition ID", "partition_id"), ("Storage Node Connect String", "storage_node_connect_string")]),
    ("server-design.txt", "ReplicaState", "ReplicaState",
     [("Replica ID", "replica_id"), ("Session ID", "session_id"),
      ("Closing High-water mark", "closing_high_water_mark")]),
    # The store parameters the control file is checked against (on-disk-format.txt).
    ("on-disk-format.txt", "Control File Header", "StoreParams",
     [("key", "cluster_key"), ("the number of partitions", "num_partitions")]),
]

# Seed types -> the protobuf types that carry them.
SCALARS = {
    "long": {FieldDescriptor.TYPE_INT64},
    "int": {FieldDescriptor.TYPE_INT32},
    "Integer": {FieldDescriptor.TYPE_INT32},
    "boolean": {FieldDescriptor.TYPE_BOOL},
    "String": {FieldDescriptor.TYPE_STRING},
    "UUID": {FieldDescriptor.TYPE_STRING},
    "byte[]": {FieldDescriptor.TYPE_BYTES},
}


def _descriptor(name: str) -> Descriptor:
    for module in MODULES:
        if name in module.DESCRIPTOR.message_types_by_name:
            return module.DESCRIPTOR.message_types_by_name[name]
    raise AssertionError(f"no message named {name} in waltz.v1")


@pytest.mark.parametrize(("seed", "table", "message", "fields"), TABLES, ids=[f"{t[2]}" for t in TABLES])
def test_every_seed_table_has_a_message_with_every_field(seed, table, message, fields):
    assert (SEEDS / seed).is_file(), f"seed {seed} not found in {SEEDS} (set WALTZ_SEEDS to the seeds directory)"
    text = (SEEDS / seed).read_text()
    assert table in text, f"{seed} has no table named {table!r}"
    descriptor = _descriptor(message)
    for seed_field, proto_field in fields:
        assert seed_field in text, f"{seed} does not name the field {seed_field!r}"
        assert proto_field in descriptor.fields_by_name, (
            f"{message} lacks the field {proto_field!r} for the seed's {table!r} / {seed_field!r}"
        )


def test_seed_scalar_types_are_carried_faithfully():
    expected = {
        ("OpenRequest", "session_id"): "long", ("OpenRequest", "seq_num"): "long",
        ("OpenRequest", "partition_id"): "int", ("OpenRequest", "cluster_key"): "UUID",
        ("ReqId", "client_id"): "int", ("ReqId", "seq_num"): "int",
        ("Record", "data"): "byte[]", ("Record", "checksum"): "int", ("Record", "transaction_id"): "long",
        ("AppendRequest", "client_high_water_mark"): "long", ("AppendRequest", "header"): "int",
        ("TransactionDataResponse", "success"): "boolean", ("TransactionDataResponse", "error_message"): "String",
        ("PartitionAssignmentRequest", "toggled"): "boolean", ("StorageGroup", "group_id"): "Integer",
        ("PartitionMetadata", "generation"): "int", ("ReplicaState", "closing_high_water_mark"): "long",
    }
    for (message, field), seed_type in expected.items():
        assert _descriptor(message).fields_by_name[field].type in SCALARS[seed_type], (message, field)


def test_list_fields_are_repeated():
    for message, field in [("StorageAppendRequest", "records"), ("RecordListResponse", "records"),
                           ("RecordHeaderListResponse", "record_headers"), ("AppendRequest", "write_locks"),
                           ("AppendRequest", "read_locks"), ("AppendRequest", "append_locks"),
                           ("StorageReplicas", "replica_ids"), ("StorageRpcException", "stack_trace"),
                           ("PartitionMetadata", "replica_states")]:
        assert _descriptor(message).fields_by_name[field].is_repeated, (message, field)


def test_every_storage_request_and_response_rides_the_stream():
    request_types = {f.message_type.name for f in storage_pb2.StorageRequest.DESCRIPTOR.fields}
    response_types = {f.message_type.name for f in storage_pb2.StorageResponse.DESCRIPTOR.fields}
    assert request_types == {"OpenRequest", "LastSessionInfoRequest", "MaxTransactionIdRequest", "TruncateRequest",
                             "SetLowWaterMarkRequest", "StorageAppendRequest", "RecordHeaderRequest",
                             "RecordRequest", "RecordHeaderListRequest", "RecordListRequest"}
    assert {"SuccessResponse", "FailureResponse", "LastSessionInfoResponse", "MaxTransactionIdResponse",
            "RecordHeaderResponse", "RecordResponse", "RecordHeaderListResponse",
            "RecordListResponse"} == response_types
    method = storage_pb2.DESCRIPTOR.services_by_name["WaltzStorage"].methods_by_name["Session"]
    assert method.client_streaming and method.server_streaming


def test_services_have_the_agreed_shape():
    admin = storage_admin_pb2.DESCRIPTOR.services_by_name["WaltzStorageAdmin"].methods_by_name["Admin"]
    assert admin.client_streaming and admin.server_streaming
    server = server_pb2.DESCRIPTOR.services_by_name["WaltzServer"]
    stream = server.methods_by_name["Stream"]
    assert stream.client_streaming and stream.server_streaming
    for unary in ("GetTransactionData", "GetHighWaterMark", "GetServerPartitions", "CheckStorageConnectivity"):
        method = server.methods_by_name[unary]
        assert not method.client_streaming and not method.server_streaming, unary
    client_messages = {f.message_type.name for f in server_pb2.ClientMessage.DESCRIPTOR.fields}
    assert client_messages == {"MountRequest", "AppendBatch", "FeedRequest", "FlushRequest"}
    server_messages = {f.message_type.name for f in server_pb2.ServerMessage.DESCRIPTOR.fields}
    assert {"MountResponse", "FeedDataBatch", "LockFailure", "FlushResponse"} <= server_messages


def test_additions_are_marked_in_the_proto_sources():
    protos = Path(__file__).resolve().parents[2] / "protos" / "waltz" / "v1"
    text = "\n".join(p.read_text() for p in protos.glob("*.proto"))
    for addition in ("append_locks", "high_water_mark", "PartitionState", "AppendBatch", "FeedDataBatch"):
        index = text.find(addition)
        assert index >= 0, addition
    assert text.count("ADDITION") >= 15
