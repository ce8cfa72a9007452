"""Inline data in the feed (MountRequest.inline_data_max_bytes): built once per committed batch while some feed
asks for it, shared by every feed with the same limit, and never built for (nor sent to) feeds that do not ask."""

from __future__ import annotations

import asyncio

from waltz.v1 import server_pb2
from waltz_common.types import crc32
from waltz_server.feed_cursor import FeedCursor
from waltz_server.partition_feeds import PartitionFeeds

from .fakes import FakeStore, FakeStream
from .harness import run, settle
from .helpers import append, feed_of

SIZES = (1, 100, 300)  # the server's limit below is 200: the last one is never inline


def requests(first_seq: int = 1) -> list[server_pb2.AppendRequest]:
    return [append(1, seq, data=bytes([seq]) * size) for seq, size in enumerate(SIZES, first_seq)]


async def started(next_id: int, *feeds_of: tuple[FakeStream, int]) -> tuple[PartitionFeeds, asyncio.TaskGroup]:
    feeds = PartitionFeeds(0, FakeStore(0), cache_size=100, batch_size=10, fetch_size=100, inline_max_bytes=200)
    group = asyncio.TaskGroup()
    await group.__aenter__()
    feeds.open(group)
    feeds.reset(next_id - 1)
    for stream, inline in feeds_of:
        feeds.start(stream, FeedCursor(next_id), None, inline_max_bytes=inline)
    await settle()
    return feeds, group


def data_of(stream: FakeStream) -> list[bytes | None]:
    return [f.data if f.has_data else None for batch in stream.of("feed") for f in batch.transactions]


def test_feeds_that_ask_share_one_message_with_the_data_and_the_others_get_the_plain_one():
    async def scenario():
        plain, one, two, less = FakeStream(), FakeStream(), FakeStream(), FakeStream()
        feeds, group = await started(5, (plain, 0), (one, 4096), (two, 200), (less, 50))
        batch = requests()
        message = feed_of(5, batch)
        feeds.publish(5, message, iter(batch))
        assert plain.messages == [message]  # the header-only message, as without inline data
        assert one.messages[0] is two.messages[0] is not message  # capped at the server's 200: one shared message
        assert data_of(one) == [b"\x01", b"\x02" * 100, None]
        assert all(f.checksum == crc32(f.data) for f in one.messages[0].feed.transactions if f.has_data)
        assert data_of(less) == [b"\x01", None, None]
        assert data_of(plain) == [None, None, None]
        feeds.close()
        await group.__aexit__(None, None, None)

    run(scenario)


def test_nothing_is_built_while_no_feed_asks():
    async def scenario():
        plain = FakeStream()
        feeds, group = await started(0, (plain, 0))
        read = []

        def batch():
            read.append(True)
            yield from requests()

        feeds.publish(0, feed_of(0, requests()), batch())
        assert read == [] and feeds.cached_feed(0, 3, inline=100) is not None
        assert data_of(plain) == [None, None, None]
        feeds.close()
        await group.__aexit__(None, None, None)

    run(scenario)


def test_a_feed_a_little_behind_gets_the_data_of_the_recent_batches_and_one_further_behind_none():
    async def scenario():
        asker = FakeStream()
        feeds, group = await started(0, (asker, 4096))
        feeds.publish(0, feed_of(0, requests(1)), iter(requests(1)))
        feeds.publish(3, feed_of(3, requests(4)), iter(requests(4)))
        behind = FakeStream()
        feeds.start(behind, FeedCursor(1), None, inline_max_bytes=4096)  # two batches in one message, by its task
        await settle()
        assert data_of(behind) == [b"\x02" * 100, None, b"\x04", b"\x05" * 100, None]
        feeds.end(asker.stream_id)
        feeds.end(behind.stream_id)
        feeds.publish(6, feed_of(6, requests(7)), iter(requests(7)))  # nobody asks: not kept
        late = FakeStream()
        feeds.start(late, FeedCursor(4), None, inline_max_bytes=4096)
        await settle()
        assert [t for t, _ in late.fed()] == [4, 5, 6, 7, 8] and data_of(late) == [None] * 5
        feeds.close()
        await group.__aexit__(None, None, None)

    run(scenario)


def test_a_batch_published_without_its_appends_sends_no_inline_data_and_loses_nothing():
    async def scenario():
        asker = FakeStream()
        feeds, group = await started(0, (asker, 4096))
        feeds.publish(0, feed_of(0, requests()))  # no requests given: nothing inline for this batch
        await settle()
        assert [t for t, _ in asker.fed()] == [0, 1, 2] and data_of(asker) == [None] * 3
        feeds.close()
        await group.__aexit__(None, None, None)

    run(scenario)
