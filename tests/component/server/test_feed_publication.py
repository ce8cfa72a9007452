"""A committed batch's feed message: prepared while the batch is at the store, published to the feeds waiting
for it at the commit itself, and the rest of a commit's effects one turn of the loop later."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz.v1 import server_pb2
from waltz_server.feed_cursor import FeedCursor
from waltz_server.partition_feeds import WHOLE_BATCH, PartitionFeeds

from .fakes import FakeStore, FakeStream
from .harness import mounted_client, run, settle
from .helpers import append, feed_of, mount, req


def requests(count: int, client_id: int = 1) -> list[server_pb2.AppendRequest]:
    return [append(client_id, seq) for seq in range(1, count + 1)]


async def feeds_with(*streams: FakeStream, next_id: int = 0) -> tuple[PartitionFeeds, asyncio.TaskGroup]:
    """PartitionFeeds at high-water mark next_id - 1, a feed per stream waiting at next_id."""
    feeds = PartitionFeeds(0, FakeStore(0), cache_size=100, batch_size=10, fetch_size=100)
    group = asyncio.TaskGroup()
    await group.__aenter__()
    feeds.open(group)
    feeds.reset(next_id - 1)
    for stream in streams:
        feeds.start(stream, FeedCursor(next_id), None)
    await settle()
    return feeds, group


async def closed(feeds: PartitionFeeds, group: asyncio.TaskGroup) -> None:
    feeds.close()
    await group.__aexit__(None, None, None)


def test_a_waiting_feed_gets_the_batch_from_the_commit_itself_and_every_feed_the_same_message():
    async def scenario():
        one, two = FakeStream(), FakeStream()
        feeds, group = await feeds_with(one, two, next_id=5)
        message = feed_of(5, requests(3))
        feeds.publish(5, message)
        # no task ran in between: the commit queued the message on both streams
        assert one.messages == [message] and two.messages[0] is message
        assert one.fed() == [(5, 1), (6, 2), (7, 3)]
        assert feeds.high_water_mark == 7 and feeds.cached_feed(5, 3) is message
        await settle()  # the feeds' tasks wake, find nothing more to send, and wait again
        assert len(one.messages) == 1 and feeds.lag() == 0
        feeds.publish(8, feed_of(8, requests(2)))
        assert [t for t, _ in one.fed()] == [5, 6, 7, 8, 9]
        await closed(feeds, group)

    run(scenario)


def test_a_feed_without_room_or_elsewhere_is_left_to_its_task_and_loses_nothing():
    async def scenario():
        full = FakeStream(room=0)
        behind = FakeStream()
        feeds, group = await feeds_with(full, next_id=5)
        feeds.start(behind, FeedCursor(7), None)  # waits for 7: the batch from 5 is not exactly what it needs
        await settle()
        feeds.publish(5, feed_of(5, requests(3)))
        assert full.messages == [] and behind.messages == []
        await settle()
        assert behind.fed() == [(7, 3)]  # its task sent the rest of the batch
        full.room = 10
        full.drained.set()
        await full.wait_for(lambda s: len(s.fed()) == 3)
        assert [t for t, _ in full.fed()] == [5, 6, 7]
        await closed(feeds, group)

    run(scenario)


def test_a_batch_committed_with_other_ids_than_prepared_is_renumbered():
    async def scenario():
        stream = FakeStream()
        feeds, group = await feeds_with(stream, next_id=7)
        message = feed_of(5, requests(2))  # numbered before a store session ended, say
        feeds.publish(7, message)
        assert stream.fed() == [(7, 1), (8, 2)]
        await closed(feeds, group)

    run(scenario)


def test_the_batch_at_the_store_is_fed_with_its_ids_and_a_flush_waits_for_the_commit():
    async def scenario():
        partition, store, stream = await mounted_client()
        other = FakeStream()
        partition.mount(other, mount(client_id=2))
        await other.wait_for(lambda s: s.of("mount"))
        store.gate.clear()
        await partition.submit(stream, requests(3))
        await settle()
        partition.flush(stream, server_pb2.FlushRequest(req_id=req(seq=3)))
        await settle()
        assert stream.fed() == [] and not stream.of("flush")
        store.gate.set()
        await stream.wait_for(lambda s: s.of("flush"))
        assert stream.fed() == other.fed() == [(0, 1), (1, 2), (2, 3)]
        assert stream.of("flush")[0].transaction_id == 2
        assert partition.data_cache.get(2) is not None
        await partition.close()

    run(scenario)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from((1, 5, WHOLE_BATCH - 1, WHOLE_BATCH, WHOLE_BATCH + 7)), min_size=1, max_size=12),
       start=st.integers(0, 300), count=st.integers(1, 200), cache_size=st.sampled_from((40, 150, 1000)))
def test_cached_feeds_are_the_cached_entries_in_order_with_whole_batches_shared_not_copied(sizes, start, count,
                                                                                             cache_size):
    feeds = PartitionFeeds(0, FakeStore(0), cache_size=cache_size, batch_size=10, fetch_size=100)
    feeds.reset(-1)
    published, first = {}, 0
    for size in sizes:
        published[first] = feed_of(first, requests(size))
        feeds.publish(first, published[first])
        first += size
    got = feeds.cached_feeds(start, count)
    whole = feeds.cached_feed(start, count)  # one message of every entry, as before
    assert (got is None) == (whole is None)
    if got is None:
        return
    assert [e for m in got for e in m.feed.transactions] == list(whole.feed.transactions)
    for message in got:  # a batch taken whole (WHOLE_BATCH or more) is the published message itself
        batch = published.get(message.feed.transactions[0].transaction_id)
        if batch is not None and len(batch.feed.transactions) >= WHOLE_BATCH and len(message.feed.transactions) == len(
                batch.feed.transactions):
            assert message is batch
