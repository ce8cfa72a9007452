"""docs/protocol.md and the proto comments say what the server does (issue 28, read by an implementer in another
language). What the server answers is checked by tests/conformance (a Node client) and the server's own tests;
this checks that the text says the same."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_proto_comments import comments
from waltz_server.service import SHUTTING_DOWN

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = (ROOT / "docs" / "protocol.md").read_text()


def section(number: int) -> str:
    return PROTOCOL.split(f"\n## {number}. ", 1)[1].split("\n## ", 1)[0]


def leading(message: str, field: str | None = None) -> str:
    found, files = comments()
    for index, f in enumerate(files):
        for m_index, m in enumerate(f.message_type):
            if m.name != message:
                continue
            if field is None:
                return found[(index, 4, m_index)]
            [f_index] = [i for i, fd in enumerate(m.field) if fd.name == field]
            return found[(index, 4, m_index, 2, f_index)]
    raise AssertionError(f"no message {message}")


def flat(text: str) -> str:
    return " ".join(text.split())


def test_feed_and_flush_of_a_partition_that_does_not_exist():
    moves = flat(section(8))
    assert "partition id that does not exist at all gets `MountResponse NO_SUCH_PARTITION`" in moves
    assert "a refused `FlushRequest` gets no `FlushResponse`" in moves
    for message in ("FeedRequest", "FlushRequest"):
        assert "NO_SUCH_PARTITION" in leading(message), message
    assert "no FlushResponse" in flat(leading("FlushRequest"))


def test_the_unary_errors_include_not_found_and_success_false():
    unary = flat(section(10))
    assert "| `ReadTransactions` | `to_transaction_id` above the high-water mark | status `NOT_FOUND`" in unary
    assert "status OK with `success=false`" in unary
    assert "NOT_FOUND" in leading("ReadTransactionsRequest", "to_transaction_id")
    assert "above the partition's high-water mark" in flat(leading("TransactionDataResponse", "success"))


def test_lower_means_serial_order():
    inference = flat(section(7))
    assert "lower sequence number, in the same 32-bit serial order" in inference
    assert "serial order" in flat(leading("ReqId", "seq_num"))


def test_the_first_req_id_seq_num_and_the_name_clash_are_explained():
    streams = flat(section(3))
    assert "| `ReqId.seq_num` (int32) | mount, feed and append requests | client id and partition | 1 |" in streams
    assert "start at 1" in streams and "start at 1" in flat(leading("ReqId", "seq_num"))
    assert "MountRequest.seq_num" in leading("ReqId", "seq_num")
    assert "Not ReqId.seq_num" in flat(leading("MountRequest", "seq_num"))


def test_the_unavailable_at_shutdown_is_documented_with_the_servers_words():
    streams = flat(section(3))
    assert f'`UNAVAILABLE` ("{SHUTTING_DOWN}")' in streams
    server_proto = (ROOT / "protos/waltz/v1/server.proto").read_text()
    stream_comment = server_proto.split("rpc Stream(", 1)[0].rsplit("service WaltzServer {", 1)[1]
    assert "UNAVAILABLE" in stream_comment and "shutting down" in stream_comment


def test_max_batch_appends_is_described_as_the_queue_size_it_is():
    discover = flat(section(1))
    assert "is not a cap on one `AppendBatch`" in discover and "`server.appendQueueSize`" in discover
    assert "not a cap on one AppendBatch" in flat(leading("Limits", "max_batch_appends"))
