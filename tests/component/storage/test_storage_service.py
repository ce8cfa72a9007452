"""The WaltzStorage.Session stream over real gRPC and real files: every request, every refusal."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

import pytest

from tests.component.storage.node_harness import (
    KEY,
    BlockedPartition,
    NodeThread,
    SessionClient,
    assert_failure,
    record,
    records,
)
from waltz.v1 import common_pb2, storage_pb2
from waltz_server.store.api import NewRecord
from waltz_server.store.wire import encode_pending
from waltz_storage.admin_client import StorageAdminClient

Code = storage_pb2.StorageRpcException.ErrorCode


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def node(tmp_path) -> Iterator[NodeThread]:
    with NodeThread(tmp_path / "storage", max_record_bytes=1000, max_batch_bytes=20_000) as running:
        with StorageAdminClient("127.0.0.1", running.servers.admin_port, str(KEY), 3) as admin:
            admin.assign(0)
            admin.assign(1)
        yield running


def test_every_request_answers_with_echoed_ids(node):
    async def scenario():
        async with SessionClient(node.address, session_id=4) as c:
            assert (await c.open())[0] == "success"
            kind, msg = await c.ask("last_session_info", partition_id=1, seq_num=100)
            assert kind == "last_session_info"
            assert (msg.session_id, msg.seq_num, msg.partition_id) == (4, 100, 1)
            assert (msg.last_session_id, msg.low_water_mark, msg.local_low_water_mark) == (-1, -1, -1)
            assert await c.ask("set_low_water_mark", partition_id=1, seq_num=101, low_water_mark=-1) == (
                "success",
                storage_pb2.SuccessResponse(session_id=4, seq_num=101, partition_id=1),
            )
            kind, msg = await c.append(1, records(0, 5), seq_num=102)
            assert (kind, msg.session_id, msg.seq_num, msg.partition_id) == ("success", 4, 102, 1)
            kind, msg = await c.ask("max_transaction_id", partition_id=1, seq_num=103)
            assert (kind, msg.seq_num, msg.partition_id, msg.transaction_id) == ("max_transaction_id", 103, 1, 4)
            kind, msg = await c.ask("record_header", partition_id=1, transaction_id=2)
            assert kind == "record_header" and msg.record_header.transaction_id == 2
            assert msg.record_header.req_id == record(2).req_id and msg.record_header.header == record(2).header
            kind, msg = await c.ask("record_header", partition_id=1, transaction_id=9)
            assert kind == "record_header" and not msg.HasField("record_header")
            kind, msg = await c.ask("record", partition_id=1, transaction_id=3)
            assert kind == "record" and msg.record == record(3) and msg.partition_id == 1
            kind, msg = await c.ask("record", partition_id=1, transaction_id=5)
            assert kind == "record" and not msg.HasField("record")
            kind, msg = await c.ask("record_header_list", partition_id=1, transaction_id=1, max_records=10)
            assert kind == "record_header_list" and msg.record_header_list_length == 4
            assert [h.transaction_id for h in msg.record_headers] == [1, 2, 3, 4]
            kind, msg = await c.ask("record_list", partition_id=1, transaction_id=2, max_records=2)
            assert kind == "record_list" and msg.record_list_length == 2 and list(msg.records) == records(2, 2)
            kind, msg = await c.ask("record_list", partition_id=1, transaction_id=7, max_records=2)
            assert kind == "record_list" and msg.record_list_length == 0
            kind, msg = await c.ask("truncate", partition_id=1, seq_num=110, transaction_id=2)
            assert (kind, msg.seq_num, msg.session_id, msg.transaction_id) == ("max_transaction_id", 110, 4, 2)
            assert_failure(
                await c.ask("set_low_water_mark", partition_id=1, low_water_mark=1), Code.INVALID_REQUEST, "truncate"
            )
            assert (await c.ask("set_low_water_mark", partition_id=1, low_water_mark=2))[0] == "success"
            kind, msg = await c.ask("last_session_info", partition_id=1)
            assert (msg.last_session_id, msg.low_water_mark, msg.local_low_water_mark) == (4, 2, 2)
            await c.close()

    node.call(scenario())
    assert node.node.metrics.registry.get_sample_value("waltz_storage_appended_records_total") == 5
    gauge = node.node.metrics.registry.get_sample_value
    assert gauge("waltz_storage_partition_max_transaction_id", {"partition": "1"}) == 2
    assert gauge("waltz_storage_partition_low_water_mark", {"partition": "1"}) == 2
    assert gauge("waltz_storage_partition_session_id", {"partition": "1"}) == 4


def test_open_is_required_and_checks_cluster_key_and_partition_count(node):
    other = uuid.uuid4()

    async def scenario():
        async with SessionClient(node.address) as c:
            assert_failure(await c.ask("max_transaction_id"), Code.NOT_OPEN, "not open")
            answer = await c.open(key=other)
            assert_failure(answer, Code.CLUSTER_KEY_MISMATCH, "another cluster key")
            # issue 25: neither key is ever told (without TLS the key is the port's only credential)
            assert str(KEY) not in answer[1].exception.message and str(other) not in answer[1].exception.message
            assert answer[1].seq_num == -1 and answer[1].partition_id == -1
            assert_failure(await c.open(num_partitions=4), Code.CLUSTER_KEY_MISMATCH, "4 partitions")
            assert_failure(await c.ask("open", cluster_key="not-a-uuid", num_partitions=3), Code.CLUSTER_KEY_MISMATCH)
            assert_failure(await c.ask("max_transaction_id"), Code.NOT_OPEN)
            assert (await c.open())[0] == "success"  # the same stream, now opened
            assert (await c.ask("max_transaction_id"))[0] == "max_transaction_id"

    node.call(scenario())


def test_a_previous_release_servers_recovery_order_is_served(node):
    """Issue 44: a server of release 7175f3a recovers a replica that is behind by setting the session's low-water
    mark first and copying the replica up to it after; the node answers each step success (it refused the mark
    INVALID_REQUEST, and that server repeated it every retry: the replica never rejoined), and still refuses any
    Truncate below the mark."""

    async def scenario():
        async with SessionClient(node.address, session_id=3) as c:
            await c.open()
            assert (await c.ask("set_low_water_mark", low_water_mark=-1))[0] == "success"
            assert (await c.append(0, records(0, 3)))[0] == "success"
        async with SessionClient(node.address, session_id=4) as c:
            await c.open()
            assert await c.ask("set_low_water_mark", seq_num=7, low_water_mark=6) == (
                "success",
                storage_pb2.SuccessResponse(session_id=4, seq_num=7, partition_id=0),
            )
            _, msg = await c.ask("last_session_info")
            assert (msg.last_session_id, msg.low_water_mark, msg.local_low_water_mark) == (4, 6, 2)
            assert_failure(await c.ask("truncate", transaction_id=1), Code.COMMITTED_DATA, "refusing to truncate")
            assert (await c.append(0, records(3, 4)))[0] == "success"  # the catch-up, in the same session
            assert (await c.ask("max_transaction_id"))[1].transaction_id == 6

    node.call(scenario())


def test_fencing_refuses_older_sessions_and_follows_newer_ones(node):
    async def scenario():
        async with SessionClient(node.address, session_id=5) as c:
            await c.open()
            assert (await c.ask("set_low_water_mark", low_water_mark=-1))[0] == "success"  # raises the fence to 5
            assert (await c.append(0, records(0, 3)))[0] == "success"
            answer = await c.append(0, records(3, 1), session_id=3)
            assert_failure(answer, Code.STALE_SESSION, "stale session 3")
            assert "session 5" in answer[1].exception.message and answer[1].session_id == 3
            assert_failure(await c.ask("record", transaction_id=0, session_id=4), Code.STALE_SESSION)
            assert (await c.ask("max_transaction_id", partition_id=1, session_id=1))[0] == "max_transaction_id"
            assert (await c.append(0, records(3, 1), session_id=8))[0] == "success"
            # a request of a newer session from the server role (plaintext: the cluster key's holder) raises the fence
            assert_failure(await c.append(0, records(4, 1)), Code.STALE_SESSION, "session 8")
            _kind, msg = await c.ask("max_transaction_id", session_id=8)
            assert msg.transaction_id == 3

    node.call(scenario())


def test_unknown_and_unassigned_partitions(node):
    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            for pid in (3, -1, 1 << 30):
                answer = await c.ask("max_transaction_id", partition_id=pid)
                assert_failure(answer, Code.UNKNOWN_PARTITION, f"partition {pid} does not exist")
                assert answer[1].partition_id == pid
            assert_failure(await c.append(2, records(0, 1)), Code.UNKNOWN_PARTITION, "not assigned")
            assert (await c.ask("max_transaction_id"))[0] == "max_transaction_id"

    node.call(scenario())


def test_unreadable_and_unwritable_partitions_and_offline_requests(node):
    admin = StorageAdminClient("127.0.0.1", node.servers.admin_port, str(KEY), 3)

    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            await c.append(0, records(0, 2))
            await asyncio.to_thread(admin.set_readable, 0, False)
            assert_failure(await c.ask("record", transaction_id=0), Code.PARTITION_UNAVAILABLE, "not readable")
            assert_failure(await c.ask("record_list", transaction_id=0, max_records=5), Code.PARTITION_UNAVAILABLE)
            assert (await c.append(0, records(2, 1)))[0] == "success"
            await asyncio.to_thread(admin.set_readable, 0, True)
            await asyncio.to_thread(admin.set_writable, 0, False)
            assert_failure(await c.append(0, records(3, 1)), Code.PARTITION_UNAVAILABLE, "not writable")
            assert_failure(await c.ask("truncate", transaction_id=0), Code.PARTITION_UNAVAILABLE, "not writable")
            assert (await c.ask("record", transaction_id=2))[1].record == record(2)
            # Offline recovery works only on an unwritable partition, whatever its session id.
            assert (await c.append(0, records(3, 1), offline=True, session_id=0))[0] == "success"
            kind, msg = await c.ask("truncate", transaction_id=1, offline=True, session_id=0)
            assert (kind, msg.transaction_id) == ("max_transaction_id", 1)
            kind, msg = await c.ask("record_list", transaction_id=0, max_records=9, offline=True, session_id=0)
            assert msg.record_list_length == 2
            await asyncio.to_thread(admin.set_writable, 0, True)
            assert_failure(
                await c.ask("max_transaction_id", offline=True), Code.PARTITION_UNAVAILABLE, "only while the partition"
            )

    try:
        node.call(scenario())
    finally:
        admin.close()


def test_bad_appends_are_refused_and_write_nothing(node):
    directory = node.directory / "0"

    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            await c.append(0, records(0, 2))
            before = snapshot(directory)
            bad_checksum = record(3)
            bad_checksum.checksum ^= 1
            short = record(2)
            short.data_length = 3
            bad_first, short_second = record(2), record(3)
            bad_first.checksum ^= 1
            short_second.data_length = 3
            cases = [
                ([record(2, size=1001)], {}, "exceed the maximum 1000"),
                (records(2, 30, size=900), {}, "exceeds the maximum 20000"),
                ([record(3)], {}, "expected 2"),
                ([record(2), record(4)], {}, "expected 3"),
                ([record(2), bad_checksum], {}, "is not the CRC32"),
                (records(2, 2), {"record_list_length": 3}, "record_list_length is 3"),
                (records(2, 2), {"record_list_length": -1}, "record_list_length is -1"),
                ([short], {}, "data_length 3"),
                # Several faults: the answer names the one it named before appends were encoded in one pass.
                ([bad_first, short_second], {}, "record 3: data_length 3"),
            ]
            for recs, fields, match in cases:
                answer = await c.append(0, recs, **fields)
                assert_failure(answer, Code.INVALID_REQUEST, match)
                assert "nothing was written" in answer[1].exception.message
            assert snapshot(directory) == before
            assert (await c.ask("max_transaction_id"))[1].transaction_id == 1
            assert (await c.append(0, records(2, 1)))[0] == "success"

    node.call(scenario())
    failures = node.node.metrics.registry.get_sample_value
    assert failures("waltz_storage_request_failures_total", {"code": "INVALID_REQUEST"}) == 9


def encoded(recs: list[common_pb2.Record], first: int) -> bytes:
    """The records as the server sends them (StorageAppendRequest.encoded_records)."""
    return encode_pending(first, [NewRecord(r.req_id, r.header, r.data, r.checksum) for r in recs])


def test_encoded_appends_are_written_as_sent_and_bad_ones_refused(node):
    directory = node.directory / "0"

    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            answer = await c.ask("append", record_list_length=2, encoded_records=encoded(records(0, 2), 0))
            assert answer[0] == "success"
            _, msg = await c.ask("record_list", transaction_id=0, max_records=10)
            assert list(msg.records) == records(0, 2)
            before = snapshot(directory)
            good = encoded(records(2, 2), 2)
            cases = [
                ({"encoded_records": encoded(records(2, 2), 3)}, "expected 2"),
                ({"encoded_records": encoded([record(2), record(3, size=1001)], 2)}, "exceed the maximum 1000"),
                ({"encoded_records": good[:-1]}, "encoded record 1 of 111 bytes: record at offset 56"),
                ({"encoded_records": good[:-5] + b"!" + good[-4:]}, "record checksum"),
                ({"encoded_records": good, "record_list_length": 3}, "record_list_length is 3"),
                ({"encoded_records": good, "records": records(2, 2)}, "both records (2) and encoded_records"),
            ]
            for fields, match in cases:
                fields.setdefault("record_list_length", 2)
                answer = await c.ask("append", **fields)
                assert_failure(answer, Code.INVALID_REQUEST, match)
                assert "nothing was written" in answer[1].exception.message
            assert snapshot(directory) == before
            assert (await c.ask("append", record_list_length=2, encoded_records=good))[0] == "success"
            _, msg = await c.ask("record_list", transaction_id=0, max_records=10)
            assert list(msg.records) == records(0, 4)

    node.call(scenario())


def test_malformed_requests_get_failures_and_the_stream_lives_on(node):
    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            await c.write_raw(storage_pb2.StorageRequest())
            kind, msg = (await c.recv()).WhichOneof("response"), None
            assert kind == "failure"
            await c.append(0, records(0, 3))
            for kind, fields, match in [
                ("record_list", {"transaction_id": 0, "max_records": -1}, "negative"),
                ("record_header_list", {"transaction_id": -2, "max_records": 1}, "negative"),
                ("record", {"transaction_id": -1}, "negative"),
                ("truncate", {"transaction_id": -2}, "cannot truncate"),
                ("set_low_water_mark", {"low_water_mark": -5}, "below -1"),
            ]:
                assert_failure(await c.ask(kind, **fields), Code.INVALID_REQUEST, match)
            kind, msg = await c.ask("record_list", transaction_id=0, max_records=1 << 30)
            assert msg.record_list_length == 3

    node.call(scenario())


def test_pipelined_appends_answer_as_if_one_at_a_time(node):
    """Queued appends may share a write and fdatasync; a bad one in the middle still fails alone."""

    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            plan = [(0, 10), (10, 10), (30, 5), (20, 10), (30, 5), (35, 1)]
            seqs = []
            for start, n in plan:
                seqs.append(await c.send("append", records=records(start, n), record_list_length=n))
            for _ in range(40):
                seqs.append(
                    await c.send("append", partition_id=1, records=records(len(seqs) - 6, 1), record_list_length=1)
                )
            answers = {}
            for _ in seqs:
                response = await c.recv()
                kind = response.WhichOneof("response")
                answers[getattr(response, kind).seq_num] = kind
            assert [answers[s] for s in seqs[:6]] == ["success", "success", "failure", "success", "success", "success"]
            assert all(answers[s] == "success" for s in seqs[6:])
            kind, msg = await c.ask("record_list", transaction_id=0, max_records=100)
            assert list(msg.records) == records(0, 36)
            assert (await c.ask("max_transaction_id", partition_id=1))[1].transaction_id == 39

    node.call(scenario())


def test_a_busy_partition_does_not_hold_up_the_others(node):
    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            async with BlockedPartition(node, 0):
                waiting = await c.send("append", records=records(0, 1), record_list_length=1)
                assert (await c.append(1, records(0, 3)))[0] == "success"
                assert (await c.ask("record_list", partition_id=1, transaction_id=0, max_records=9))[
                    1
                ].record_list_length == 3
            response = await c.recv()
            assert response.success.seq_num == waiting

    node.call(scenario())


def test_record_list_responses_are_capped_in_bytes(node):
    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            for start in range(0, 60, 20):
                await c.append(0, records(start, 20, size=900))
            _kind, msg = await c.ask("record_list", transaction_id=0, max_records=60)
            assert 0 < msg.record_list_length < 60
            assert sum(len(r.data) + 40 for r in msg.records) <= 20_000
            assert list(msg.records) == records(0, msg.record_list_length, size=900)
            _kind, raw = await c.ask("record_list", transaction_id=0, max_records=60, raw=True)
            run = raw.run  # the same records, as the data file holds them
            assert raw.record_list_length == run.count == msg.record_list_length and not raw.records
            assert run.first_transaction_id == 0 and run.records == encode_pending(0, list(msg.records))
            assert run.ends == struct.pack(f"<{run.count}I", *accumulate(len(r.data) + 40 for r in msg.records))
            _kind, empty = await c.ask("record_list", transaction_id=60, max_records=5, raw=True)
            assert empty.HasField("run") and (empty.run.first_transaction_id, empty.run.count) == (60, 0)

    node.call(scenario())


def test_a_damaged_record_is_answered_corrupted_never_served(node, tmp_path):
    async def scenario():
        async with SessionClient(node.address) as c:
            await c.open()
            await c.append(0, records(0, 6, size=50))
            data_file = tmp_path / "storage" / "0" / f"{0:019d}.seg"
            damaged = bytearray(data_file.read_bytes())
            damaged[-10] ^= 0x40  # inside the data of the last record
            data_file.write_bytes(bytes(damaged))
            kind, msg = await c.ask("record_list", transaction_id=0, max_records=5)
            assert kind == "record_list" and list(msg.records) == records(0, 5, size=50)
            _, raw = await c.ask("record_list", transaction_id=0, max_records=5, raw=True)
            assert raw.run.records == encode_pending(0, records(0, 5, size=50))
            for ask, fields in (
                ("record", {"transaction_id": 5}),
                ("record_list", {"transaction_id": 2, "max_records": 10}),
                ("record_list", {"transaction_id": 2, "max_records": 10, "raw": True}),
            ):
                answer = await c.ask(ask, **fields)
                assert_failure(answer, Code.CORRUPTED, "record checksum")

    node.call(scenario())
