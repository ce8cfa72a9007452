"""Every message a client sends to a server, and every field of it, says in the protos what to put in it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2] / "protos"
CLIENT_SENDS = {
    "ReqId", "ClientMessage", "MountRequest", "AppendBatch", "AppendRequest", "FeedRequest", "FlushRequest",
    "TransactionDataRequest", "HighWaterMarkRequest", "ReadTransactionsRequest", "ServerPartitionsRequest",
    "StorageConnectivityRequest", "ClusterInfoRequest", "ClientIdRequest",
}


def comments() -> tuple[dict[tuple[int, ...], str], list[descriptor_pb2.FileDescriptorProto]]:
    """Leading comments of server.proto and common.proto by (file index, *path)."""
    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = ["protoc", f"-I{ROOT}", f"-I{include}", "--include_source_info", f"--descriptor_set_out={out}",
                "waltz/v1/common.proto", "waltz/v1/server.proto"]
        assert protoc.main(args) == 0
        files = list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)
    found: dict[tuple[int, ...], str] = {}
    for index, f in enumerate(files):
        for location in f.source_code_info.location:
            found[(index, *location.path)] = location.leading_comments.strip()
    return found, files


def test_every_message_and_field_a_client_sends_is_explained():
    found, files = comments()
    missing = []
    for index, f in enumerate(files):
        for m_index, message in enumerate(f.message_type):
            if message.name not in CLIENT_SENDS:
                continue
            if not found.get((index, 4, m_index)):
                missing.append(message.name)
            for f_index, field in enumerate(message.field):
                if not found.get((index, 4, m_index, 2, f_index)):
                    missing.append(f"{message.name}.{field.name}")
    seen = {m.name for f in files for m in f.message_type}
    assert seen >= CLIENT_SENDS
    assert missing == []
