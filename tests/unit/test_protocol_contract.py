"""Every table of the design documents has a protobuf message holding every field the table lists.

The design documents (server-storage protocol, client-server protocol, server design, on-disk
format) are the spec the protos were written from. They are not part of the repository, so the
tables below carry what they say: for each spec table, the message that carries it, and for each
field the spec lists, its name and data type as the spec writes them and the protobuf field that
carries it. The test checks the compiled descriptors against this table: every message and field
is there, each field has the type the spec gives (a scalar of the right width, a message of the
right kind, a repeated field for a list), so removing or retyping a spec'd field fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from waltz.v1 import common_pb2, metadata_pb2, server_pb2, storage_admin_pb2, storage_pb2

MODULES = (common_pb2, storage_pb2, storage_admin_pb2, server_pb2, metadata_pb2)

# The spec's documents, by the names they had in the design set.
STORAGE = "server-storage-protocol"
CLIENT = "client-server-protocol"
SERVER = "server-design"
DISK = "on-disk-format"

Field = tuple[str, str, str]  # (spec field name, spec data type, proto field)

# The header every storage request and response starts with (server-storage protocol).
STORAGE_HEADER: list[Field] = [
    ("Session ID", "long", "session_id"),
    ("Sequence number", "long", "seq_num"),
    ("Partition ID", "int", "partition_id"),
]

# (document, table name as the spec writes it, message, fields). "X[]" is a list of X; "*repeat"
# marks a group of fields the spec repeats, carried as a repeated message (the next entry).
SPEC: list[tuple[str, str, str, list[Field]]] = [
    (STORAGE, "Open Request", "OpenRequest",
     [*STORAGE_HEADER, ("Cluster key", "UUID", "cluster_key"), ("Number of partitions", "int", "num_partitions")]),
    (STORAGE, "Last Session Info Request", "LastSessionInfoRequest", STORAGE_HEADER),
    (STORAGE, "Last Session Info Response", "LastSessionInfoResponse",
     [*STORAGE_HEADER, ("Session ID", "long", "last_session_id"), ("Low-water Mark", "long", "low_water_mark")]),
    (STORAGE, "Max Transaction ID Request", "MaxTransactionIdRequest", STORAGE_HEADER),
    (STORAGE, "Max Transaction ID Response", "MaxTransactionIdResponse",
     [*STORAGE_HEADER, ("Transaction ID", "long", "transaction_id")]),
    (STORAGE, "Truncate Request", "TruncateRequest", [*STORAGE_HEADER, ("Transaction ID", "long", "transaction_id")]),
    (STORAGE, "Set Low-water Mark Request", "SetLowWaterMarkRequest",
     [*STORAGE_HEADER, ("Low-water mark", "long", "low_water_mark")]),
    (STORAGE, "Append Request", "StorageAppendRequest",
     [*STORAGE_HEADER, ("Record List Length", "int", "record_list_length"), ("Record List", "Record[]", "records")]),
    (STORAGE, "RecordHeader", "RecordHeader",
     [("Transaction ID", "long", "transaction_id"), ("Request ID", "ReqId", "req_id"),
      ("Transaction Header", "int", "header")]),
    (STORAGE, "Record", "Record",
     [("Transaction ID", "long", "transaction_id"), ("Request ID", "ReqId", "req_id"),
      ("Transaction Header", "int", "header"), ("Transaction Data Length", "int", "data_length"),
      ("Transaction Data", "byte[]", "data"), ("Checksum", "int", "checksum")]),
    (STORAGE, "Record Header Request", "RecordHeaderRequest",
     [*STORAGE_HEADER, ("Transaction ID", "long", "transaction_id")]),
    (STORAGE, "Request Header Response", "RecordHeaderResponse",
     [*STORAGE_HEADER, ("Record header", "RecordHeader", "record_header")]),
    (STORAGE, "Record Request", "RecordRequest", [*STORAGE_HEADER, ("Transaction ID", "long", "transaction_id")]),
    (STORAGE, "Record Response", "RecordResponse", [*STORAGE_HEADER, ("Record", "Record", "record")]),
    (STORAGE, "Record Header List Request", "RecordHeaderListRequest",
     [*STORAGE_HEADER, ("Transaction ID", "long", "transaction_id"),
      ("Max number of records", "int", "max_records")]),
    (STORAGE, "Request Header List Response", "RecordHeaderListResponse",
     [*STORAGE_HEADER, ("Record header list Length", "int", "record_header_list_length"),
      ("Record header list", "RecordHeader[]", "record_headers")]),
    (STORAGE, "Record List Request", "RecordListRequest",
     [*STORAGE_HEADER, ("Transaction ID", "long", "transaction_id"),
      ("Max number of records", "int", "max_records")]),
    (STORAGE, "Record List Response", "RecordListResponse",
     [*STORAGE_HEADER, ("Record List Length", "int", "record_list_length"), ("Record List", "Record[]", "records")]),
    (STORAGE, "Success Response", "SuccessResponse", STORAGE_HEADER),
    (STORAGE, "Failure Response", "FailureResponse",
     [*STORAGE_HEADER, ("Exception", "StorageRpcException", "exception")]),
    (STORAGE, "StorageRpcException", "StorageRpcException",
     [("Message", "String", "message"), ("Stack Trace Length", "int", "stack_trace_length"),
      ("Stack Trace Element", "*repeat StackTraceElement", "stack_trace")]),
    (STORAGE, "Stack Trace Element", "StackTraceElement",
     [("Class name", "String", "class_name"), ("Method name", "String", "method_name"),
      ("File name", "String", "file_name"), ("Line number", "int", "line_number")]),
    (STORAGE, "Replica Assignments", "ReplicaAssignments",
     [("Map of Storage to Partition ID List", "*repeat StorageReplicas", "storage_replicas")]),
    (STORAGE, "Replica Assignments (entry)", "StorageReplicas",
     [("Connect String", "String", "connect_string"), ("Replica IDs", "int[]", "replica_ids")]),
    (STORAGE, "Group Descriptor", "GroupDescriptor",
     [("Map of Connect String to Group ID", "*repeat StorageGroup", "groups")]),
    (STORAGE, "Group Descriptor (entry)", "StorageGroup",
     [("Connect String", "String", "connect_string"), ("Group ID", "Integer", "group_id")]),
    (STORAGE, "Admin Open Request", "AdminOpenRequest",
     [("Sequence number", "long", "seq_num"), ("Cluster key", "UUID", "cluster_key"),
      ("Number of partitions", "int", "num_partitions")]),
    (STORAGE, "Partition Assignment Request", "PartitionAssignmentRequest",
     [("Sequence number", "long", "seq_num"), ("Partition ID", "int", "partition_id"),
      ("Toggled", "boolean", "toggled")]),
    (STORAGE, "Partition Read Request", "PartitionReadRequest",
     [("Sequence number", "long", "seq_num"), ("Partition ID", "int", "partition_id"),
      ("Toggled", "boolean", "toggled")]),
    (STORAGE, "Partition Write Request", "PartitionWriteRequest",
     [("Sequence number", "long", "seq_num"), ("Partition ID", "int", "partition_id"),
      ("Toggled", "boolean", "toggled")]),
    (CLIENT, "Request ID (ReqId)", "ReqId",
     [("Client ID", "int", "client_id"), ("Generation", "int", "generation"), ("Partition ID", "int", "partition_id"),
      ("Sequence number", "int", "seq_num")]),
    (CLIENT, "Mount Request", "MountRequest",
     [("Request ID", "ReqId", "req_id"), ("Client High-water Mark", "long", "client_high_water_mark"),
      ("sequence number", "int", "seq_num")]),
    (CLIENT, "Mount Response", "MountResponse",
     [("Request ID", "ReqId", "req_id"), ("Partition Ready", "boolean", "partition_ready")]),
    (CLIENT, "Append Request", "AppendRequest",
     [("Request ID", "ReqId", "req_id"), ("Client High-water Mark", "long", "client_high_water_mark"),
      ("Write Lock Request Length", "int", "write_lock_request_length"),
      ("Write Lock Request Hash Values", "int[]", "write_locks"),
      ("Read Lock Request Length", "int", "read_lock_request_length"),
      ("Read Lock Request Hash Values", "int[]", "read_locks"), ("Transaction Header", "int", "header"),
      ("Transaction Data Length", "int", "data_length"), ("Transaction Bytes", "byte[]", "data"),
      ("Checksum", "int", "checksum")]),
    (CLIENT, "Feed Request", "FeedRequest",
     [("Request ID", "ReqId", "req_id"), ("Client High-water Mark", "long", "client_high_water_mark")]),
    (CLIENT, "Feed Data", "FeedData",
     [("Request ID", "ReqId", "req_id"), ("Transaction ID", "long", "transaction_id"),
      ("Transaction Header", "int", "header")]),
    (CLIENT, "Transaction Data Request", "TransactionDataRequest",
     [("Request ID", "ReqId", "req_id"), ("Transaction ID", "long", "transaction_id")]),
    (CLIENT, "Transaction Data Response", "TransactionDataResponse",
     [("Request ID", "ReqId", "req_id"), ("Transaction ID", "long", "transaction_id"),
      ("Success Flag", "boolean", "success"), ("Transaction Data Length", "int", "data_length"),
      ("Transaction Data Bytes", "byte[]", "data"), ("Checksum", "int", "checksum"),
      ("Error Message", "String", "error_message")]),
    (CLIENT, "Flush Request", "FlushRequest", [("Request ID", "ReqId", "req_id")]),
    (CLIENT, "Flush Response", "FlushResponse",
     [("Request ID", "ReqId", "req_id"), ("Transaction ID", "long", "transaction_id")]),
    (CLIENT, "Lock Failure", "LockFailure",
     [("Request ID", "ReqId", "req_id"), ("Transaction ID", "long", "transaction_id")]),
    (SERVER, "Partition Metadata", "PartitionMetadata",
     [("Generation", "int", "generation"), ("Session ID", "long", "session_id"),
      ("Map of Replica ID to Replica State", "*repeat ReplicaStateEntry", "replica_states")]),
    (SERVER, "Partition Metadata (entry)", "ReplicaStateEntry",
     [("Replica ID", "ReplicaID", "replica_id"), ("Replica State", "ReplicaState", "replica_state")]),
    (SERVER, "ReplicaId", "ReplicaId",
     [("Partition ID", "int", "partition_id"),
      ("Storage Node Connect String", "String", "storage_node_connect_string")]),
    (SERVER, "ReplicaState", "ReplicaState",
     [("Replica ID", "ReplicaID", "replica_id"), ("Session ID", "long", "session_id"),
      ("Closing High-water mark", "long", "closing_high_water_mark")]),
    # The store parameters the control file is checked against (the control file header).
    (DISK, "Control File Header", "StoreParams",
     [("key", "UUID", "cluster_key"), ("the number of partitions", "int", "num_partitions")]),
]

# Spec scalar types -> the protobuf types that carry them. A UUID travels as its text form.
SCALARS = {
    "long": {FieldDescriptor.TYPE_INT64},
    "int": {FieldDescriptor.TYPE_INT32},
    "Integer": {FieldDescriptor.TYPE_INT32},
    "boolean": {FieldDescriptor.TYPE_BOOL},
    "String": {FieldDescriptor.TYPE_STRING},
    "UUID": {FieldDescriptor.TYPE_STRING},
    "byte[]": {FieldDescriptor.TYPE_BYTES},
}
# Spec record types whose message has another name in the protos.
MESSAGE_NAMES = {"ReplicaID": "ReplicaId"}
# Fields deliberately wider than the spec says, each explained in its proto comment.
WIDENED = {("MountRequest", "seq_num"): FieldDescriptor.TYPE_INT64}  # int64 like the original implementation
TYPE_NAMES = {value: name.removeprefix("TYPE_").lower() for name, value in vars(FieldDescriptor).items()
              if name.startswith("TYPE_")}


def _descriptor(name: str) -> Descriptor:
    for module in MODULES:
        if name in module.DESCRIPTOR.message_types_by_name:
            return module.DESCRIPTOR.message_types_by_name[name]
    raise AssertionError(f"no message named {name} in waltz.v1")


def type_problem(field: FieldDescriptor, spec_type: str) -> str | None:
    """Why field does not carry a value of the spec's type, or None when it does."""
    repeated = (spec_type.endswith("[]") and spec_type != "byte[]") or spec_type.startswith("*repeat ")
    element = spec_type.removeprefix("*repeat ").removesuffix("[]") if repeated else spec_type
    if field.is_repeated != repeated:
        shape = "repeated" if field.is_repeated else "not repeated"
        return f"{'a list' if repeated else 'one value'} expected, the field is {shape}"
    if element in SCALARS:
        widened = WIDENED.get((field.containing_type.name, field.name))
        allowed = SCALARS[element] | ({widened} if widened is not None else set())
        if field.type not in allowed:
            return f"{TYPE_NAMES[field.type]} does not carry the spec's {element}"
        return None
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return f"the spec's {element} is a record: a message field expected, the field is {TYPE_NAMES[field.type]}"
    wanted = MESSAGE_NAMES.get(element, element)
    if field.message_type.name != wanted:
        return f"message {wanted} expected, the field holds {field.message_type.name}"
    return None


@pytest.mark.parametrize(("document", "table", "message", "fields"), SPEC, ids=[f"{t[2]}" for t in SPEC])
def test_every_spec_table_has_a_message_with_every_field_and_type(document, table, message, fields):
    descriptor = _descriptor(message)
    for spec_field, spec_type, proto_field in fields:
        where = f"{document} / {table!r} / {spec_field!r}"
        assert proto_field in descriptor.fields_by_name, f"{message} lacks the field {proto_field!r} for {where}"
        problem = type_problem(descriptor.fields_by_name[proto_field], spec_type)
        assert problem is None, f"{message}.{proto_field} ({where}, {spec_type}): {problem}"


def test_the_table_covers_every_request_and_record_of_the_spec():
    # The spec's storage protocol has these tables (its ten request/response patterns, the record
    # layouts, the exception, the ZooKeeper payloads and the admin requests): a table dropped from
    # SPEC by mistake fails here.
    storage_tables = {t[1] for t in SPEC if t[0] == STORAGE}
    assert len(storage_tables) == 30
    assert {t[2] for t in SPEC if t[0] == CLIENT} == {
        "ReqId", "MountRequest", "MountResponse", "AppendRequest", "FeedRequest", "FeedData",
        "TransactionDataRequest", "TransactionDataResponse", "FlushRequest", "FlushResponse", "LockFailure"}
    assert sum(len(t[3]) for t in SPEC) == 160


def test_type_check_catches_a_wrong_width_a_lost_list_and_a_wrong_record():
    open_request = _descriptor("OpenRequest").fields_by_name
    assert type_problem(open_request["session_id"], "int") is not None  # int64 is not the spec's int
    records = _descriptor("StorageAppendRequest").fields_by_name["records"]
    assert type_problem(records, "Record") is not None  # a list where one record is spec'd
    assert type_problem(records, "RecordHeader[]") is not None
    assert type_problem(records, "Record[]") is None


def test_list_fields_are_repeated():
    for message, field in [("AppendRequest", "append_locks"), ("PartitionMetadata", "replica_states")]:
        assert _descriptor(message).fields_by_name[field].is_repeated, (message, field)


def test_every_storage_request_and_response_rides_the_stream():
    request_types = {f.message_type.name for f in storage_pb2.StorageRequest.DESCRIPTOR.fields}
    response_types = {f.message_type.name for f in storage_pb2.StorageResponse.DESCRIPTOR.fields}
    assert request_types == {"OpenRequest", "LastSessionInfoRequest", "MaxTransactionIdRequest", "TruncateRequest",
                             "SetLowWaterMarkRequest", "StorageAppendRequest", "RecordHeaderRequest",
                             "RecordRequest", "RecordHeaderListRequest", "RecordListRequest",
                             "RepairRequest"}  # issue 33: damaged records rewritten from an intact replica
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


def test_permission_denied_answers_and_the_client_identity_binding():
    # issue 25: clients in other languages match these numbers (docs/protocol.md, sections 2, 4 and 9)
    assert server_pb2.MountResponse.PartitionState.Value("PERMISSION_DENIED") == 6
    assert server_pb2.AppendRejected.Reason.Value("PERMISSION_DENIED") == 9
    assert {f.name for f in server_pb2.MountResponse.DESCRIPTOR.fields} >= {"state", "message"}
    assert {f.name for f in server_pb2.AppendRejected.DESCRIPTOR.fields} >= {"reason", "message"}
    fields = metadata_pb2.ClientIdentity.DESCRIPTOR.fields_by_name
    assert fields["role_uris"].is_repeated and fields["role_uris"].type == FieldDescriptor.TYPE_STRING
    assert fields["subject"].type == FieldDescriptor.TYPE_STRING
