"""Partition flush, mount (READY / NOT_READY / CLIENT_AHEAD), feeds, stale streams and failed batches."""

from __future__ import annotations

from dataclasses import replace

from waltz.v1 import server_pb2

from .fakes import Failure, FakeStore, FakeStream
from .harness import SMALL, mounted_client, opened, run, settle, stored
from .helpers import append, mount, req

Reason = server_pb2.AppendRejected.Reason
State = server_pb2.MountResponse


def kinds(stream: FakeStream) -> list[str]:
    return [m.WhichOneof("message") for m in stream.messages]


def test_flush_answers_once_every_earlier_append_resolved():
    async def scenario():
        partition, store, stream = await mounted_client()
        store.gate.clear()
        await partition.submit(stream, [append(seq=1)])
        await settle()
        await partition.submit(stream, [append(seq=2), append(seq=3)])
        partition.flush(stream, server_pb2.FlushRequest(req_id=req(seq=3)))
        other = FakeStream()
        partition.mount(other, mount(client_id=2))
        partition.flush(other, server_pb2.FlushRequest(req_id=req(client_id=2, seq=1)))
        await settle()
        assert not stream.of("flush")
        assert other.of("flush")[0].transaction_id == -1  # client 2 had nothing pending
        store.gate.set()
        await stream.wait_for(lambda s: s.of("flush"))
        assert stream.of("flush")[0].transaction_id == 2
        assert stream.of("flush")[0].req_id.seq_num == 3
        await partition.close()

    run(scenario)


def test_mount_feeds_the_catch_up_then_answers_ready_then_keeps_feeding():
    async def scenario():
        partition, _ = await opened(FakeStore(0, stored(5)))
        stream = FakeStream()
        partition.mount(stream, mount(hwm=1))
        await stream.wait_for(lambda s: s.of("mount"))
        assert kinds(stream) == ["feed", "mount"]
        assert [t for t, _ in stream.fed()] == [2, 3, 4]
        [ready] = stream.of("mount")
        assert ready.state == State.READY and ready.partition_ready and ready.high_water_mark == 4
        await partition.submit(stream, [append(seq=1)])
        await stream.wait_for(lambda s: len(s.fed()) == 4)
        assert stream.fed()[-1] == (5, 1)
        await partition.close()

    run(scenario)


def test_mount_of_an_up_to_date_client_is_ready_at_once():
    async def scenario():
        partition, _ = await opened(FakeStore(0, stored(3)))
        stream = FakeStream()
        partition.mount(stream, mount(hwm=2))
        await stream.wait_for(lambda s: s.of("mount"))
        assert kinds(stream) == ["mount"] and stream.of("mount")[0].state == State.READY
        await partition.close()

    run(scenario)


def test_mount_client_ahead():
    async def scenario():
        partition, _ = await opened(FakeStore(0, stored(3)))
        stream = FakeStream()
        partition.mount(stream, mount(hwm=9))
        await stream.wait_for(lambda s: s.of("mount"))
        [response] = stream.of("mount")
        assert response.state == State.CLIENT_AHEAD and not response.partition_ready
        assert response.high_water_mark == 2
        await partition.close()

    run(scenario)


def test_mount_not_ready_before_the_store_is_recovered_or_with_another_generation():
    async def scenario():
        store = FakeStore(0)
        store.ready_delay = 0.3
        from waltz_server.partition import Partition

        partition = Partition(0, 2, store, SMALL)
        await partition.open()
        early = FakeStream()
        partition.mount(early, mount(generation=2))
        assert early.of("mount")[0].state == State.NOT_READY
        await partition.wait_ready(10)
        stale = FakeStream()
        partition.mount(stale, mount(generation=1))
        assert stale.of("mount")[0].state == State.NOT_READY
        await partition.close()

    run(scenario)


def test_mount_first_resolves_the_clients_pending_appends():
    async def scenario():
        partition, store = await opened()
        stream = FakeStream()
        partition.mount(stream, mount(net_seq=1))
        await stream.wait_for(lambda s: s.of("mount"))
        store.gate.clear()
        await partition.submit(stream, [append(seq=1)])
        await settle()
        await partition.submit(stream, [append(seq=2)])
        again = FakeStream()
        partition.mount(again, mount(seq=3, net_seq=2))
        await settle()
        assert not again.messages
        store.gate.set()
        await again.wait_for(lambda s: s.of("mount"))
        assert kinds(again) == ["feed", "mount"]
        assert again.fed() == [(0, 1), (1, 2)]
        await partition.close()

    run(scenario)


def test_feed_batches_from_the_store_for_a_far_behind_client():
    async def scenario():
        settings = replace(SMALL, feed_cache_size=100, feed_batch_size=1000, feed_fetch_size=2000)
        partition, store = await opened(FakeStore(0, stored(2500)), settings)
        assert store.header_reads == [(0, 2000), (2000, 500)]  # the re-send window, read from the log's tail
        store.header_reads.clear()
        stream = FakeStream()
        partition.mount(stream, mount())
        await stream.wait_for(lambda s: s.of("mount"))
        assert [t for t, _ in stream.fed()] == list(range(2500))
        assert [len(b.transactions) for b in stream.of("feed")] == [1000, 1000, 500]
        assert store.header_reads == [(0, 2000), (2000, 500)]
        await partition.close()

    run(scenario)


def test_realtime_feed_is_served_from_the_cache_in_batches():
    async def scenario():
        partition, store = await opened(settings=replace(SMALL, feed_cache_size=2000))
        reader = FakeStream()
        partition.mount(reader, mount(client_id=5))
        await reader.wait_for(lambda s: s.of("mount"))
        writer = FakeStream()
        partition.mount(writer, mount(client_id=6))
        store.gate.clear()
        await partition.submit(writer, [append(6, 1)])
        await settle()
        await partition.submit(writer, [append(6, s) for s in range(2, 1501)])
        store.gate.set()
        await reader.wait_for(lambda s: len(s.fed()) == 1500)
        assert [t for t, _ in reader.fed()] == list(range(1500))
        assert len(reader.of("feed")) < 10
        assert store.header_reads == []
        await partition.close()

    run(scenario)


def test_a_slow_reader_does_not_hold_back_appends_or_other_feeds():
    async def scenario():
        partition, _ = await opened()
        slow = FakeStream(room=2)  # stops taking feed messages after two
        partition.mount(slow, mount(client_id=5))
        fast = FakeStream()
        partition.mount(fast, mount(client_id=6))
        for seq in range(1, 6):
            await partition.submit(fast, [append(6, seq)])
            await fast.wait_for(lambda s, n=seq: len(s.fed()) == n)
        assert len(slow.messages) == 2
        assert partition.feed_lag() >= 3
        await partition.close()

    run(scenario)


def test_feed_request_restarts_the_feed_from_the_client_high_water_mark():
    async def scenario():
        partition, _ = await opened(FakeStore(0, stored(4)))
        stream = FakeStream()
        partition.mount(stream, mount(hwm=3))
        await stream.wait_for(lambda s: s.of("mount"))
        partition.feed(stream, server_pb2.FeedRequest(req_id=req(seq=2), client_high_water_mark=1))
        await stream.wait_for(lambda s: len(s.fed()) == 2)
        assert [t for t, _ in stream.fed()] == [2, 3]
        await partition.close()
        # the restarted feed still ends with a NOT_READY for the mount that started the first one
        assert [(m.state, m.req_id) for m in stream.of("mount")] == [
            (State.READY, mount(hwm=3).req_id),
            (State.NOT_READY, mount(hwm=3).req_id),
        ]

    run(scenario)


def test_a_newer_stream_of_the_client_makes_the_old_one_stale():
    async def scenario():
        partition, _ = await opened()
        old = FakeStream()
        partition.mount(old, mount(net_seq=1))
        await old.wait_for(lambda s: s.of("mount"))
        new = FakeStream()
        partition.mount(new, mount(seq=5, net_seq=2))
        await new.wait_for(lambda s: s.of("mount"))
        await partition.submit(old, [append(seq=2)])  # refused: a stale network client
        await partition.submit(new, [append(seq=6)])
        await new.wait_for(lambda s: len(s.fed()) == 1)
        await settle()
        assert new.fed() == [(0, 6)]
        assert old.fed() == [] and [r.reason for r in old.of("append_rejected")] == [Reason.SUPERSEDED]
        stale_again = FakeStream()
        partition.mount(stale_again, mount(net_seq=1))  # an older network client cannot take it back
        await settle()
        assert [m.state for m in stale_again.of("mount")] == [server_pb2.MountResponse.SUPERSEDED]
        assert new.fed() == [(0, 6)] and len(new.of("mount")) == 1
        await partition.close()

    run(scenario)


def test_append_failed_with_known_outcome_commits_the_prefix_only():
    async def scenario():
        partition, store, stream = await mounted_client()
        store.gate.clear()
        store.failures.append(Failure(commit=2, known=True))
        await partition.submit(stream, [append(seq=s) for s in range(1, 6)])
        await settle()
        partition.flush(stream, server_pb2.FlushRequest(req_id=req(seq=5)))
        store.gate.set()
        await stream.wait_for(lambda s: s.of("flush"))
        assert stream.fed() == [(0, 1), (1, 2)]
        assert stream.of("flush")[0].transaction_id == 1
        await partition.submit(stream, [append(seq=6)])
        await stream.wait_for(lambda s: len(s.fed()) == 3)
        assert stream.fed()[-1] == (2, 6)
        await partition.close()

    run(scenario)


def test_append_failed_with_outcome_known_only_after_recovery():
    async def scenario():
        partition, store, stream = await mounted_client()
        store.gate.clear()
        await partition.submit(stream, [append(seq=1, write=(7,))])
        await settle()
        store.failures += [None, Failure(commit=1, known=False)]
        await partition.submit(stream, [append(seq=2, write=(8,)), append(seq=3, write=(9,))])
        await settle()
        partition.flush(stream, server_pb2.FlushRequest(req_id=req(seq=3)))
        store.gate.set()
        await stream.wait_for(lambda s: s.of("flush"))
        assert stream.fed() == [(0, 1), (1, 2)]
        assert stream.of("flush")[0].transaction_id == 1
        # the failed append's lock is free again; the committed one's is recorded
        other = FakeStream()
        partition.mount(other, mount(client_id=2))
        await partition.submit(other, [append(2, 1, write=(9,)), append(2, 2, write=(8,))])
        await other.wait_for(lambda s: s.of("lock_failure"))
        assert [f.req_id.seq_num for f in other.of("lock_failure")] == [2]
        assert other.of("lock_failure")[0].transaction_id == 1
        await partition.close()

    run(scenario)


def test_store_unavailable_before_sending_retries_the_batch():
    async def scenario():
        partition, store, stream = await mounted_client()
        store.unavailable_once = True
        await partition.submit(stream, [append(seq=1)])
        await stream.wait_for(lambda s: len(s.fed()) == 1)
        assert store.batches == [1]
        await partition.close()

    run(scenario)


def _one_append_per_batch():
    return replace(SMALL, max_batch_size=1, max_batches_in_flight=3)


def test_batches_in_flight_together_commit_and_feed_in_order():
    async def scenario():
        partition, store, stream = await mounted_client(settings=_one_append_per_batch())
        store.gate.clear()
        await partition.submit(stream, [append(seq=s) for s in range(1, 8)])
        await settle()
        assert store.most_in_flight == 3  # never more than storage.maxBatchesInFlight
        store.gate.set()
        await stream.wait_for(lambda s: len(s.fed()) == 7)
        assert stream.fed() == [(i, i + 1) for i in range(7)]
        assert store.batches == [1] * 7 and store.most_in_flight == 3
        await partition.close()

    run(scenario)


def test_a_failure_with_batches_in_flight_resolves_them_in_order_after_recovery():
    async def scenario():
        partition, store, stream = await mounted_client(settings=_one_append_per_batch())
        store.gate.clear()
        # the second of three batches in flight breaks the session; the third never reaches the store
        store.failures += [None, Failure(commit=0, known=False)]
        await partition.submit(stream, [append(seq=s) for s in range(1, 4)])
        await settle()
        partition.flush(stream, server_pb2.FlushRequest(req_id=req(seq=3)))
        store.gate.set()
        await stream.wait_for(lambda s: s.of("flush"))
        assert stream.fed() == [(0, 1)] and stream.of("flush")[0].transaction_id == 0
        assert store.session_id == 1
        # the next session takes the ids the failed batches did not use
        await partition.submit(stream, [append(seq=4)])
        await stream.wait_for(lambda s: len(s.fed()) == 2)
        assert stream.fed()[-1] == (1, 4) and partition.high_water_mark == 1
        await partition.close()

    run(scenario)


def test_a_lone_append_goes_to_the_store_from_the_submit_and_the_next_ones_gather_behind_it():
    """A round is straight-line code: the batch is at the store when submit returns (no task step of the append
    task between), and appends offered while it is in flight (storage.maxBatchesInFlight 1) form the next batch by
    themselves, sent when it commits."""

    async def scenario():
        partition, store, stream = await mounted_client()
        store.gate.clear()
        await partition.submit(stream, [append(seq=1)])
        assert store.most_in_flight == 1  # before anything else ran on the loop
        for seq in range(2, 6):  # separate client messages while the first batch is in flight
            await partition.submit(stream, [append(seq=seq)])
        assert store.most_in_flight == 1
        store.gate.set()
        await stream.wait_for(lambda s: len(s.fed()) == 5)
        assert store.batches == [1, 4]
        assert stream.fed() == [(i, i + 1) for i in range(5)]
        await partition.close()

    run(scenario)


def test_once_busy_the_next_batch_waits_a_turn_for_the_messages_arriving_with_it():
    """Group commit under load (issue 42's open loop at 5,000-10,000/s offered): after a batch of several client
    messages, a message that finds the store idle does not go alone from its submit; the messages submitted in the
    same turn join its batch. A partition quiet again (a lone message's batch) sends from the submit."""

    async def scenario():
        partition, store, stream = await mounted_client()
        store.gate.clear()
        await partition.submit(stream, [append(seq=1)])
        for seq in (2, 3):  # two client messages behind it
            await partition.submit(stream, [append(seq=seq)])
        store.gate.set()
        await stream.wait_for(lambda s: len(s.fed()) == 3)
        assert store.batches == [1, 2]
        store.gate.clear()
        await partition.submit(stream, [append(seq=4)])
        assert store.most_in_flight == 1 and store.in_flight == 0  # not sent from the submit: the partition is busy
        await partition.submit(stream, [append(seq=5)])  # (the same turn)
        store.gate.set()
        await stream.wait_for(lambda s: len(s.fed()) == 5)
        assert store.batches == [1, 2, 2]
        store.gate.clear()
        await partition.submit(stream, [append(seq=6)])  # after a batch of two messages: still busy
        store.gate.set()
        await stream.wait_for(lambda s: len(s.fed()) == 6)
        store.gate.clear()
        await partition.submit(stream, [append(seq=7)])  # after a lone message's batch: quiet, sent at once
        assert store.in_flight == 1
        store.gate.set()
        await stream.wait_for(lambda s: len(s.fed()) == 7)
        assert store.batches == [1, 2, 2, 1, 1]
        assert stream.fed() == [(i, i + 1) for i in range(7)]
        await partition.close()

    run(scenario)
