"""The feeds of one partition: a FeedContext per client stream, the cache of recent feed entries, and the
publication of each committed batch to them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from waltz.v1 import common_pb2, server_pb2
from waltz_server.cache_budget import FEED_ENTRY_BYTES, CacheBudget
from waltz_server.caches import FeedCache
from waltz_server.feed import FeedContext, StreamPort, feed_message, mount_response
from waltz_server.feed_cursor import FeedCursor, Source
from waltz_server.store.api import StorePartition, StoreUnavailable
from waltz_server.store_batches import RETRY_S

log = logging.getLogger(__name__)

INLINE_BATCHES = 5
"""Feed batches (server.feedBatchSize transactions each) whose inline data is kept for feeds slightly behind."""
WHOLE_BATCH = 32
"""A committed batch of at least this many transactions goes to a feed behind as its own message when the feed's
step takes all of it (shared, not copied); smaller ones, and parts, are copied into a message of their own."""


class PartitionClosed(Exception):
    """The partition was closed (it moved to another server, or the server is stopping)."""


class FeedEntrySource(Protocol):
    """What a feed entry is made of, with its partition's id: the partition's queued append, which read these from
    its request when it took it (each field of a ReqId set from them costs less than copying the request's ReqId)."""

    @property
    def client_id(self) -> int: ...

    @property
    def generation(self) -> int: ...

    @property
    def seq_num(self) -> int: ...

    @property
    def header(self) -> int: ...


def prepared_feed(first: int, partition_id: int, appends: Iterable[FeedEntrySource]) -> server_pb2.ServerMessage:
    """The feed message of a batch of appends to partition_id as transactions first.., built in place before the
    batch commits (while the replicas write it); should it commit with other ids, publish renumbers it."""
    message = server_pb2.ServerMessage()
    add_entry = message.feed.transactions.add
    for transaction_id, a in enumerate(appends, first):
        entry = add_entry()  # then filled: a quarter cheaper than add(**fields) with this protobuf (upb)
        entry.transaction_id = transaction_id
        req_id = entry.req_id
        req_id.client_id = a.client_id
        req_id.generation = a.generation
        req_id.partition_id = partition_id
        req_id.seq_num = a.seq_num
        entry.header = a.header
    return message


def inline_feed(first: int, requests: Iterable[server_pb2.AppendRequest], max_bytes: int) -> server_pb2.ServerMessage:
    """The feed message of a committed batch with the data of each transaction of at most max_bytes (has_data),
    for the feeds that ask for inline data: built once per batch, shared as the header-only one."""
    message = server_pb2.ServerMessage()
    add_entry = message.feed.transactions.add
    for transaction_id, r in enumerate(requests, first):
        entry = add_entry()
        entry.transaction_id = transaction_id
        entry.req_id.CopyFrom(r.req_id)
        entry.header = r.header
        data = r.data
        if len(data) <= max_bytes:
            entry.has_data = True
            entry.data = data
            entry.checksum = r.checksum
    return message


def within(entries: Sequence[server_pb2.FeedData], max_bytes: int) -> server_pb2.ServerMessage:
    """A feed message of inline entries keeping only the data of at most max_bytes (a client that asked for less
    than the server's limit)."""
    message = server_pb2.ServerMessage()
    add = message.feed.transactions.add
    for entry in entries:
        if entry.has_data and len(entry.data) > max_bytes:
            add(req_id=entry.req_id, transaction_id=entry.transaction_id, header=entry.header)
        else:
            add().CopyFrom(entry)
    return message


class PartitionFeeds:
    """The FeedSource of one partition's feeds: the high-water mark, the recent committed entries, and the
    contexts (one per client stream) that stream them.

    A committed batch's feed message is built once and shared: every caught-up feed sends that very
    message. A feed waiting for this batch gets it queued on its stream at once (publish), one task
    hop less than waking its task to step; any other feed steps in its own task.

    Inline data (MountRequest.inline_data_max_bytes): while some feed of the partition asks for it, each
    committed batch also gets a feed message with its transactions' data (of at most inline_max_bytes each),
    built once and shared as the other; the last INLINE_BATCHES x batch_size transactions' are kept. A feed
    that asked for less than inline_max_bytes gets its own copy of a batch with larger data; a feed behind
    that window gets no data (its client fetches it).
    """

    def __init__(
        self,
        partition_id: int,
        store: StorePartition,
        cache_size: int,
        batch_size: int,
        fetch_size: int,
        budget: CacheBudget | None = None,
        inline_max_bytes: int = 0,
    ) -> None:
        self.partition_id = partition_id
        self._store = store
        self._batch_size = batch_size
        self._fetch_size = fetch_size
        self.high_water_mark = -1
        self._cache: FeedCache[server_pb2.FeedData] = FeedCache(cache_size, budget=budget)
        self._last: tuple[int, server_pb2.ServerMessage] = (-1, server_pb2.ServerMessage())
        self._contexts: dict[int, FeedContext] = {}  # stream id -> its feed of this partition
        self.inline_max_bytes = inline_max_bytes
        self._inline: FeedCache[server_pb2.FeedData] = FeedCache(
            INLINE_BATCHES * batch_size, entry_bytes=FEED_ENTRY_BYTES + inline_max_bytes, budget=budget)
        self._last_inline: dict[int, server_pb2.ServerMessage] = {}  # the newest batch's by feed's limit
        self._inline_feeds = 0  # running feeds that ask for inline data
        self._commit = asyncio.Event()
        self._group: asyncio.TaskGroup | None = None
        self.closed = False

    def __len__(self) -> int:
        """Feeds running."""
        return len(self._contexts)

    def open(self, group: asyncio.TaskGroup) -> None:
        """Feeds run as tasks of group from now on."""
        self._group = group

    def reset(self, high_water_mark: int) -> None:
        """A store session recovered high_water_mark: the cache starts empty above it."""
        self.high_water_mark = high_water_mark
        self._cache.restart(high_water_mark)
        self._inline.restart(high_water_mark)
        self._last_inline = {}
        self._last = (-1, server_pb2.ServerMessage())

    def close(self) -> None:
        """End every feed (their tasks are cancelled with the partition's task group), and queue on each feed's
        stream, behind what the feed sent, a Mount Response NOT_READY for the mount that started it, so that
        its client mounts again (nothing else would tell a client that only reads)."""
        self.closed = True
        self._cache.close()
        self._inline.close()
        self._last_inline = {}
        self._inline_feeds = 0
        self._wake()
        for context in self._contexts.values():
            if context.mount is not None:
                ended = mount_response(context.mount, server_pb2.MountResponse.NOT_READY, self.high_water_mark)
                context.stream.send_control(ended)
        self._contexts.clear()

    # the feeds

    def start(
        self,
        stream: StreamPort,
        cursor: FeedCursor,
        mount_req_id: common_pb2.ReqId | None,
        mount: common_pb2.ReqId | None = None,
        inline_max_bytes: int = 0,
    ) -> None:
        """A feed for stream from cursor, still to answer mount_req_id READY (if not None); mount: the mount that
        started the feed this one replaces (a feed request), when it is not mount_req_id itself; with the data of
        transactions up to inline_max_bytes (and self.inline_max_bytes), when the server has it at hand."""
        if self._group is None or self.closed:
            return
        context = FeedContext(self, stream, cursor, mount_req_id, self._batch_size, self._fetch_size, mount)
        context.inline = max(0, min(inline_max_bytes, self.inline_max_bytes))
        self._inline_feeds += context.inline > 0
        context.task = self._group.create_task(self._run(context))
        self._contexts[stream.stream_id] = context

    def get(self, stream_id: int) -> FeedContext | None:
        return self._contexts.get(stream_id)

    def end(self, stream_id: int, superseded: bool = False) -> None:
        """End the stream's feed; superseded: a newer stream of its client mounted the partition, so tell the stream
        (an unasked SUPERSEDED for the mount that started the feed)."""
        context = self._contexts.pop(stream_id, None)
        if context is None:
            return
        self._inline_feeds -= context.inline > 0
        if context.task is not None:
            context.task.cancel()
        if superseded and context.mount is not None:
            message = f"partition {self.partition_id}: a newer stream of this client mounted the partition"
            state = server_pb2.MountResponse.SUPERSEDED
            context.stream.send_control(mount_response(context.mount, state, self.high_water_mark, message))

    def lag(self) -> int:
        return max((context.lag() for context in self._contexts.values()), default=0)

    async def _run(self, context: FeedContext) -> None:
        while True:
            try:
                await context.run()
            except PartitionClosed:
                return
            except StoreUnavailable:
                await asyncio.sleep(RETRY_S)  # the store is between sessions: read again soon
            except Exception:
                log.exception("partition %d: feed of stream %d ended", self.partition_id, context.stream.stream_id)
                if self._contexts.get(context.stream.stream_id) is context:
                    del self._contexts[context.stream.stream_id]
                    self._inline_feeds -= context.inline > 0
                return

    # commits

    def publish(
        self, first: int, message: server_pb2.ServerMessage, requests: Iterable[server_pb2.AppendRequest] = ()
    ) -> None:
        """The batch of message (prepared_feed) committed as transactions first..: keep it, and send it to the
        feeds waiting for it. The message must not be changed afterwards. requests: the batch's appends, read
        only while a feed asks for inline data."""
        entries = message.feed.transactions
        if entries and entries[0].transaction_id != first:
            for transaction_id, entry in enumerate(entries, first):
                entry.transaction_id = transaction_id
        self._cache.append(first, entries, message if len(entries) >= WHOLE_BATCH else None)
        self._last = (first, message)
        inline = inline_feed(first, requests, self.inline_max_bytes) if self._inline_feeds else None
        if inline is not None and len(inline.feed.transactions) == len(entries):
            self._inline.append(first, inline.feed.transactions)
            self._last_inline = {self.inline_max_bytes: inline}
        elif self._last_inline:
            self._last_inline = {}  # (the next batch kept leaves a gap: the inline cache starts again there)
        self.high_water_mark = high_water_mark = max(self.high_water_mark, first + len(entries) - 1)
        wake = False  # a feed task waits for what committed now and did not get it here: it steps itself
        for context in self._contexts.values():
            waiting = context.waiting_for
            if waiting == first:
                self._deliver(context, first, message)
                waiting = context.waiting_for
            if waiting is not None and waiting <= high_water_mark:
                wake = True
        if wake:  # (the feeds this batch went to wait on, not woken for nothing once per commit)
            self._wake()

    def _deliver(self, context: FeedContext, first: int, message: server_pb2.ServerMessage) -> None:
        """Queue the newest batch on a feed waiting for it, when its cursor would send exactly that batch now
        and its stream has room (anything else is left to the feed's task)."""
        cursor = context.cursor
        step = cursor.step(self.high_water_mark, self._cache.first_id, self._batch_size, self._fetch_size)
        count = len(message.feed.transactions)
        exact = step.source is Source.CACHE and step.first == first and step.count == count
        if exact and context.inline:
            message = self.cached_feed(first, count, context.inline) or message
        if exact and context.stream.try_send_feed(message):
            cursor.sent(count)
            context.waiting_for = cursor.next_id  # (its task, once it runs, finds nothing to send yet)

    def _wake(self) -> None:
        self._commit.set()
        self._commit = asyncio.Event()

    # FeedSource

    @property
    def cache_first_id(self) -> int:
        return self._cache.first_id

    def cached_feed(self, first: int, count: int, inline: int = 0) -> server_pb2.ServerMessage | None:
        last_first, last = self._last
        newest = first == last_first and count == len(last.feed.transactions)
        if inline:
            message = self._inline_feed(first, count, inline, newest)
            if message is not None:
                return message
        if newest:
            return last  # a realtime feed: the newest batch, built once for every stream
        entries = self._cache.get(first, count)
        return None if entries is None else feed_message(entries)

    def cached_feeds(self, first: int, count: int, inline: int = 0) -> list[server_pb2.ServerMessage] | None:
        last_first, last = self._last
        if inline or (first == last_first and count == len(last.feed.transactions)):
            message = self.cached_feed(first, count, inline)
            return None if message is None else [message]
        spans = self._cache.spans(first, count)
        if spans is None:
            return None
        messages: list[server_pb2.ServerMessage] = []
        copied = 0  # entries before the current span still to copy into a message of their own
        for batch_first, offset, taken, whole in spans:
            if offset == 0 and isinstance(whole, server_pb2.ServerMessage) and len(whole.feed.transactions) == taken:
                if copied:
                    messages.append(self._copied(batch_first - copied, copied))
                    copied = 0
                messages.append(whole)
            else:
                copied += taken
        if copied:
            batch_first, offset, taken, _ = spans[-1]
            messages.append(self._copied(batch_first + offset + taken - copied, copied))
        return messages

    def _copied(self, first: int, count: int) -> server_pb2.ServerMessage:
        entries = self._cache.get(first, count)
        assert entries is not None and len(entries) == count  # spans just said the cache holds them
        return feed_message(entries)

    def _inline_feed(self, first: int, count: int, inline: int, newest: bool) -> server_pb2.ServerMessage | None:
        """[first, first + count) with inline data up to inline bytes, when all of it is held (None: not)."""
        if newest:
            message = self._last_inline.get(inline)
            if message is not None:
                return message
        entries = self._inline.get(first, count)
        if entries is None or len(entries) != count:
            return None
        message = feed_message(entries) if inline >= self.inline_max_bytes else within(entries, inline)
        if newest:
            self._last_inline[inline] = message  # built once for every feed with this limit
        return message

    async def stored_headers(self, first: int, count: int) -> Sequence[common_pb2.RecordHeader]:
        return await self._store.get_headers(first, count)

    async def wait_for_commit(self, after: int) -> None:
        while self.high_water_mark <= after:
            if self.closed:
                raise PartitionClosed(f"partition {self.partition_id} was closed")
            await self._commit.wait()  # replaced by a fresh event on every commit
