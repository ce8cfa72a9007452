"""How a Session stream's requests flow: back-pressure per partition, and appends placed on the event loop or on
their partition's thread (still in order, and still sharing fdatasyncs when the server pipelines them)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import pytest

from tests.component.storage.node_harness import KEY, BlockedPartition, NodeThread, records
from waltz_storage import placement
from waltz_storage.admin_client import StorageAdminClient
from waltz_storage.placement import PROBE_EVERY
from waltz_storage.service import PARTITION_QUEUE_SIZE


@pytest.fixture(params=[False, True], ids=["grpc", "framed"])
def node(request, tmp_path) -> Iterator[NodeThread]:
    """A node whose Session stream the tests use over gRPC, and over the framed session port."""
    with NodeThread(tmp_path / "storage", framed=request.param) as running:
        with StorageAdminClient("127.0.0.1", running.servers.admin_port, str(KEY), 3) as admin:
            admin.assign(0)
            admin.assign(1)
        yield running


def fsyncs(node: NodeThread) -> float:
    return node.node.metrics.registry.get_sample_value("waltz_storage_fsync_duration_seconds_count") or 0.0


def test_a_partition_with_a_full_queue_stops_the_stream_being_read_until_it_drains(node):
    async def scenario():
        async with node.session_client() as c:
            await c.open()
            async with BlockedPartition(node, 0):
                for txn in range(PARTITION_QUEUE_SIZE):
                    await c.send("append", records=records(txn, 1), record_list_length=1)
                behind = await c.send("append", partition_id=1, records=records(0, 1), record_list_length=1)
                await asyncio.sleep(0.5)
                assert node.node.manager.partition(1).max_transaction_id == -1  # not read: partition 0 is full
            answers = {}
            for _ in range(PARTITION_QUEUE_SIZE + 1):
                response = await c.recv()
                answers[response.success.seq_num] = response.WhichOneof("response")
            assert set(answers.values()) == {"success"} and behind in answers
            assert node.node.manager.partition(1).max_transaction_id == 0
            _kind, msg = await c.ask("record_list", transaction_id=0, max_records=1000)
            assert list(msg.records) == records(0, PARTITION_QUEUE_SIZE)

    node.call(scenario())


def test_appends_one_at_a_time_run_on_the_loop_unless_partitions_take_turns(node, monkeypatch):
    """The cheap place for an append is the loop, while one partition is busy; several keep to their threads."""
    where: list[str] = []
    execute_appends = node.node.executor.execute_appends

    def recorded(msgs, caller):
        where.append(threading.current_thread().name)
        return execute_appends(msgs, caller)

    monkeypatch.setattr(node.node.executor, "execute_appends", recorded)
    # An fdatasync slower than SLOW_APPEND_S on a busy CI disk sends the next appends to the thread (on purpose):
    # this test is about placement by partition and overlap, not by the disk's speed.
    monkeypatch.setattr(placement, "SLOW_APPEND_S", float("inf"))

    async def scenario():
        async with node.session_client() as c:
            await c.open()
            for i in range(2 * PROBE_EVERY):
                assert (await c.append(0, records(2 * i, 2)))[0] == "success"
            on_loop = sum(not name.startswith("partition-") for name in where)
            if node.framed:  # the first (no append before it) went to the thread; appends that overlap show there
                assert on_loop == 2 * PROBE_EVERY - 1
            else:  # the first and one probe (a gRPC stream does not show what has arrived) went to the thread
                assert on_loop == 2 * PROBE_EVERY - 2
            where.clear()
            next_ids = {0: 4 * PROBE_EVERY, 1: 0}
            for _ in range(10):
                for partition_id in (0, 1):
                    assert (await c.append(partition_id, records(next_ids[partition_id], 1)))[0] == "success"
                    next_ids[partition_id] += 1
            # The first continues partition 0's appends (on the loop, framed; the gRPC stream's probe is due then).
            assert where[1:] == ["partition-1"] + ["partition-0", "partition-1"] * 9

    node.call(scenario())


def test_appends_one_at_a_time_and_requests_on_the_thread_between_them_keep_their_order(node):
    async def scenario():
        async with node.session_client() as c:
            await c.open()
            for txn in range(0, 3 * PROBE_EVERY, 3):
                assert (await c.append(0, records(txn, 3)))[0] == "success"
                kind, msg = await c.ask("max_transaction_id")
                assert (kind, msg.transaction_id) == ("max_transaction_id", txn + 2)
            assert (await c.ask("truncate", transaction_id=9))[1].transaction_id == 9
            assert (await c.append(0, records(10, 2)))[0] == "success"
            _kind, msg = await c.ask("record_list", transaction_id=0, max_records=1000)
            assert list(msg.records) == records(0, 12)

    node.call(scenario())


def test_pipelined_appends_come_to_share_fdatasyncs_even_after_a_run_of_appends_one_at_a_time(node, monkeypatch):
    """Appends one at a time run on the loop; once they overlap, they go to the thread and queue up there."""
    count = 4 * PROBE_EVERY
    fdatasync = os.fdatasync

    def slow_fdatasync(fd: int) -> None:  # a slow disk: a pipelining server's appends surely overlap
        fdatasync(fd)
        time.sleep(0.003)

    async def scenario():
        async with node.session_client() as c:
            await c.open()
            first = PROBE_EVERY // 2
            for txn in range(first):
                assert (await c.append(0, records(txn, 1)))[0] == "success"
            monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
            before = fsyncs(node)
            for txn in range(first, first + count):
                await c.send("append", records=records(txn, 1), record_list_length=1)
            for _ in range(count):
                assert (await c.recv()).WhichOneof("response") == "success"
            assert fsyncs(node) - before < count // 2  # one at a time until the probe, then in groups
            _kind, msg = await c.ask("record_list", transaction_id=0, max_records=1000)
            assert list(msg.records) == records(0, first + count)

    node.call(scenario())
