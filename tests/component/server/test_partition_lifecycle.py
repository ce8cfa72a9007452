"""Partition lifecycle: metrics, a generation change, appends held while ZooKeeper is suspended."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from waltz.v1 import server_pb2
from waltz_common.types import Record, ReqId, crc32
from waltz_server.cache_budget import DATA_ENTRY_BYTES, FEED_ENTRY_BYTES, CacheBudget
from waltz_server.metrics import REPLICA_STATES, ServerMetrics
from waltz_server.partition import Partition

from .fakes import FakeStore, FakeStream
from .harness import SMALL, mounted_client, run, settle, stored
from .helpers import append, mount, req

Reason = server_pb2.AppendRejected.Reason


def sample(metrics: ServerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def measured(stream: FakeStream) -> tuple[ServerMetrics, FakeStore, Partition]:
    """Partition 3 (generation 2) with metrics, open, and mounted by stream."""
    metrics = ServerMetrics()
    store = FakeStore(3)
    partition = Partition(3, 2, store, SMALL, metrics.for_partition(3))
    await partition.open()
    await partition.wait_ready(10)
    partition.mount(stream, mount(partition_id=3, generation=2))
    return metrics, store, partition


def test_metrics_follow_appends_and_disappear_with_the_partition():
    async def scenario():
        stream = FakeStream()
        metrics, store, partition = await measured(stream)
        await partition.submit(stream, [append(seq=1, partition_id=3, generation=2, write=(5,))])
        await partition.submit(stream, [append(2, 1, partition_id=3, generation=2, write=(5,))])
        await partition.submit(stream, [append(seq=3, partition_id=3, generation=1)])
        await stream.wait_for(lambda s: s.fed())
        assert sample(metrics, "waltz_server_append_requests_total", partition="3", result="ok") == 1
        assert sample(metrics, "waltz_server_append_requests_total", partition="3", result="rejected") == 2
        assert sample(metrics, "waltz_server_partition_high_water_mark", partition="3") == 0
        assert sample(metrics, "waltz_server_partition_generation", partition="3") == 2
        assert sample(metrics, "waltz_server_commit_latency_seconds_count") == 1
        assert b"waltz_server_feed_lag_transactions" in generate_latest(metrics.registry)
        replicas = {
            state: sample(metrics, "waltz_server_partition_replicas", partition="3", state=state)
            for state in REPLICA_STATES
        }
        assert replicas == {"assigned": 1, "connected": 1, "write_set": 1}
        assert sample(metrics, "waltz_server_partition_session_id", partition="3") == store.session_id
        await partition.close()
        assert sample(metrics, "waltz_server_partition_high_water_mark", partition="3") is None
        assert sample(metrics, "waltz_server_partition_replicas", partition="3", state="write_set") is None

    run(scenario)


def test_a_new_generation_refuses_queued_appends_of_the_old_one():
    async def scenario():
        partition, store, stream = await mounted_client()
        store.gate.clear()
        await partition.submit(stream, [append(seq=1)])
        await settle()
        await partition.submit(stream, [append(seq=2)])
        await partition.set_generation(2)
        assert store.generation == 2
        [rejection] = stream.of("append_rejected")
        assert rejection.reason == Reason.WRONG_GENERATION and rejection.req_id.seq_num == 2
        store.gate.set()
        await stream.wait_for(lambda s: s.fed())
        assert stream.fed() == [(0, 1)]  # the one already at the store committed
        await partition.close()

    run(scenario)


def test_a_partition_reopened_here_does_not_answer_a_flush_for_appends_of_its_previous_life():
    """The ZooKeeper double commit: the server lost its session with an append of client 1 at the replicas,
    closed the partition and took it back at a higher generation; the new partition is still recovering
    (that append will be in what it recovers). The client has not seen the new generation yet and flushes
    under its old mount, on the same stream. Answering that flush with the new partition's high-water mark
    told the client the append had failed; the client sent it again, and the log held it twice."""

    async def scenario():
        old, old_store, stream = await mounted_client(FakeStore(0, stored(10)))
        old_store.gate.clear()
        await old.submit(stream, [append(seq=11, hwm=9)])
        await settle()
        await old.close()  # the session was lost: the batch is at the replicas, its outcome unknown here
        recovered = FakeStore(0, stored(10))
        recovered.records.append(Record(10, ReqId(1, 1, 0, 11), 0, b"x", crc32(b"x")))  # a quorum had it
        recovered.ready_delay = 0.5  # recovery takes a while
        new = Partition(0, 2, recovered, SMALL)
        await new.open()
        before = len(stream.messages)
        new.flush(stream, server_pb2.FlushRequest(req_id=req(seq=11)))  # the client's nudge, under generation 1
        await asyncio.sleep(0.7)  # recovered meanwhile
        answers = stream.messages[before:]
        assert not [a.flush for a in answers if a.WhichOneof("message") == "flush"], (
            "a flush answered by a partition that never saw the client's appends"
        )
        # the client hears instead that it must mount again (an unasked NOT_READY for the flush's ReqId)
        (answer,) = answers
        assert answer.mount.state == server_pb2.MountResponse.NOT_READY
        assert answer.mount.req_id == req(seq=11)
        # mounted again under the new generation, the client is fed the append before the mount completes
        remount = mount(seq=12, hwm=9, generation=2, net_seq=2)
        new.mount(stream, remount)
        await stream.wait_for(lambda s: [m for m in s.of("mount") if m.req_id == remount.req_id])
        assert (10, 11) in stream.fed()
        await new.close()

    run(scenario)


def test_a_closed_partition_tells_each_mounted_client_and_a_feed_request_off_the_mount_is_answered_not_ready():
    """Closed for any reason (moved away, or this server's session expired), the partition ends each feed with a
    NOT_READY for its mount: a client that only reads learns it too. A Feed Request that is not under the
    client's current mount (another stream, another generation) gets a NOT_READY for its ReqId, not silence."""

    async def scenario():
        partition, _, stream = await mounted_client()
        other = FakeStream()
        partition.feed(other, server_pb2.FeedRequest(req_id=req(seq=5), client_high_water_mark=-1))
        assert [m.state for m in other.of("mount")] == [server_pb2.MountResponse.NOT_READY]
        assert other.of("mount")[0].req_id == req(seq=5)
        await partition.close()
        ends = [m for m in stream.of("mount") if m.state == server_pb2.MountResponse.NOT_READY]
        assert [m.req_id for m in ends] == [mount().req_id]

    run(scenario)


def test_partitions_share_the_cache_budget_and_a_closed_one_frees_its_share():
    async def scenario():
        budget = CacheBudget(10**9)
        partitions = [Partition(p, 1, FakeStore(p), SMALL, budget=budget) for p in (0, 1)]
        for partition in partitions:
            await partition.open()
            await partition.wait_ready(10)
        assert len(budget) == 6  # a feed cache, its inline data's (empty while no feed asks) and a data cache each
        for partition in partitions:
            stream = FakeStream()
            p = partition.partition_id
            partition.mount(stream, mount(partition_id=p))
            await partition.submit(stream, [append(seq=1, partition_id=p), append(seq=2, partition_id=p)])
            await stream.wait_for(lambda s: len(s.fed()) == 2)
        await settle()
        use = budget.use_by_kind()
        assert use["feed"] == 4 * FEED_ENTRY_BYTES and use["data"] > 4 * DATA_ENTRY_BYTES
        await partitions[0].close()
        assert len(budget) == 3 and budget.used == 2 * FEED_ENTRY_BYTES + partitions[1].data_cache.charged
        await partitions[1].close()
        assert budget.used == 0 and len(budget) == 0

    run(scenario)


class _SlowReader(FakeStream):
    """A stream whose client has read only up to `read` (the rest waits in its outbound queue)."""

    read: int | None = None

    def written(self, partition_id: int) -> int | None:
        return self.read


def test_the_feed_lag_metric_counts_what_the_client_has_not_read_at_each_scrape():
    async def scenario():
        stream = _SlowReader()
        metrics, _, partition = await measured(stream)
        for seq in range(1, 11):
            await partition.submit(stream, [append(seq=seq, partition_id=3, generation=2)])
        await stream.wait_for(lambda s: len(s.fed()) == 10)  # all queued for the client: nothing read yet
        lag = "waltz_server_feed_lag_transactions"
        assert sample(metrics, lag, partition="3") == 10  # issue 31: it read 0, the feed having "sent" them
        stream.read = 3
        assert sample(metrics, lag, partition="3") == 6  # at the next scrape, no commit needed
        stream.read = 9
        assert sample(metrics, lag, partition="3") == 0
        await partition.close()

    run(scenario)
