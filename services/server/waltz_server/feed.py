"""Feed contexts: one task per (client stream, partition) streaming committed headers in batches."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from waltz.v1 import common_pb2, server_pb2
from waltz_server.feed_cursor import FeedCursor, Source
from waltz_server.store.api import StoreUnavailable


def mount_response(
    req_id: common_pb2.ReqId,
    state: server_pb2.MountResponse.PartitionState.ValueType,
    high_water_mark: int,
    message: str = "",
) -> server_pb2.ServerMessage:
    ready = state == server_pb2.MountResponse.READY
    return server_pb2.ServerMessage(
        mount=server_pb2.MountResponse(
            req_id=req_id, partition_ready=ready, state=state, high_water_mark=high_water_mark, message=message
        )
    )


class StreamPort(Protocol):
    """What a partition and its feeds need from one client stream."""

    stream_id: int

    def send_control(self, message: server_pb2.ServerMessage) -> None:
        """Queue an answer at once (at most one per request the stream sent, so it stays bounded)."""
        ...

    async def send_feed(self, message: server_pb2.ServerMessage) -> None:
        """Queue a feed message, waiting while the stream's outbound queue is full (back-pressure)."""
        ...

    def try_send_feed(self, message: server_pb2.ServerMessage) -> bool:
        """Queue a feed message if the outbound queue has room now; False (nothing queued) if not."""
        ...

    def written(self, partition_id: int) -> int | None:
        """The last transaction id of the partition the stream handed to the transport (None: none yet): what
        waits in its outbound queue is not read by the client yet."""
        ...


class FeedSource(Protocol):
    """What a feed reads: the partition's committed transactions."""

    partition_id: int

    @property
    def high_water_mark(self) -> int: ...

    @property
    def cache_first_id(self) -> int: ...

    def cached_feeds(self, first: int, count: int, inline: int = 0) -> list[server_pb2.ServerMessage] | None:
        """The feed messages of [first, first + count) (fewer at the tail) from the cache, in order (shared: never
        change them): the committed batches' own messages where the range takes a whole one, copies of the rest;
        None when the cache no longer holds first; inline > 0: with the data of transactions up to inline bytes
        when the source has it (else without)."""
        ...

    async def stored_headers(self, first: int, count: int) -> Sequence[common_pb2.RecordHeader]: ...

    async def wait_for_commit(self, after: int) -> None: ...


def stored_feed_message(headers: Sequence[common_pb2.RecordHeader]) -> server_pb2.ServerMessage:
    """A feed message of the storage's headers, built in place (a FeedData and a ReqId message per header, then
    copying them into the batch, cost several times as much: this is the path of far-behind feeds); each entry's
    fields set one by one and its ReqId copied whole (add() with keywords costs a third more)."""
    message = server_pb2.ServerMessage()
    add = message.feed.transactions.add
    for h in headers:
        entry = add()
        entry.transaction_id = h.transaction_id
        entry.header = h.header
        entry.req_id.CopyFrom(h.req_id)
    return message


def feed_message(entries: Sequence[server_pb2.FeedData]) -> server_pb2.ServerMessage:
    return server_pb2.ServerMessage(feed=server_pb2.FeedDataBatch(transactions=entries))


class FeedContext:
    """The feed of one partition to one client stream, with the mount it may still have to answer."""

    def __init__(
        self,
        source: FeedSource,
        stream: StreamPort,
        cursor: FeedCursor,
        mount_req_id: common_pb2.ReqId | None,
        batch_size: int,
        fetch_size: int,
        mount: common_pb2.ReqId | None = None,
    ) -> None:
        self.source = source
        self.stream = stream
        self.cursor = cursor
        self.mount_req_id = mount_req_id
        """The mount this feed still has to answer READY (None once answered, or for a feed request)."""
        self.mount = mount_req_id if mount_req_id is not None else mount
        """The mount that started this feed (or the feed it replaces), kept: PartitionFeeds.close may end the feed
        with a NOT_READY for it."""
        self._batch_size = batch_size
        self._fetch_size = fetch_size
        self.task: asyncio.Task[None] | None = None
        self.waiting_for: int | None = None
        """The next id to send while the task waits for it to commit (the source may then send it here)."""
        self._start = cursor.next_id
        self.inline = 0
        """The largest transaction data this feed carries inline (0: none; the source sets it)."""

    def lag(self) -> int:
        """Committed transactions the client has not read from its stream yet: those not sent, and those sent and
        still waiting in the stream's outbound queue (a client that reads slowly backs them up there)."""
        written = self.stream.written(self.source.partition_id)
        base = self._start - 1 if written is None or written < self._start - 1 else written
        return max(0, self.source.high_water_mark - base)

    async def run(self) -> None:
        source, cursor = self.source, self.cursor
        while True:
            step = cursor.step(source.high_water_mark, source.cache_first_id, self._batch_size, self._fetch_size)
            if step.source is Source.READY:
                await self.stream.send_feed(self._ready())
                cursor.ready_sent()
                self.mount_req_id = None
            elif step.source is Source.WAIT:
                self.waiting_for = cursor.next_id
                try:
                    await source.wait_for_commit(cursor.next_id - 1)
                finally:
                    self.waiting_for = None
            elif step.source is Source.CACHE:
                for message in source.cached_feeds(step.first, step.count, self.inline) or ():  # None: step again
                    if message.feed.transactions:
                        await self.stream.send_feed(message)
                        cursor.sent(len(message.feed.transactions))
            else:
                headers = await source.stored_headers(step.first, step.count)
                if not headers or headers[0].transaction_id != step.first:  # between sessions: read again
                    raise StoreUnavailable(f"partition {source.partition_id}: no headers from {step.first} yet")
                for start in range(0, len(headers), self._batch_size):
                    chunk = headers[start : start + self._batch_size]
                    await self.stream.send_feed(stored_feed_message(chunk))
                    cursor.sent(len(chunk))

    def _ready(self) -> server_pb2.ServerMessage:
        assert self.mount_req_id is not None
        return mount_response(self.mount_req_id, server_pb2.MountResponse.READY, self.source.high_water_mark)
