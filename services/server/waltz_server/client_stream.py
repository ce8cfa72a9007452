"""One client's ordered Stream: a reader dispatching by partition and a writer draining a bounded queue."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Iterable

import grpc

from waltz.v1 import common_pb2, server_pb2
from waltz_server.feed import mount_response
from waltz_server.ownership import PartitionManager
from waltz_server.partition import rejected

Reason = server_pb2.AppendRejected.Reason
_stream_ids = itertools.count(1)


def coalesce(messages: list[server_pb2.ServerMessage], max_entries: int) -> list[server_pb2.ServerMessage]:
    """Merge adjacent feed batches of one partition with consecutive ids (fewer, larger messages).

    The messages given are never changed (a feed batch is shared by every stream it goes to): a
    merge builds a new message.
    """
    out: list[server_pb2.ServerMessage] = []
    merged = False  # out[-1] is a message built here
    for message in messages:
        if out and message.WhichOneof("message") == "feed" and out[-1].WhichOneof("message") == "feed":
            last, this = out[-1].feed.transactions, message.feed.transactions
            if (
                this
                and last
                and len(last) + len(this) <= max_entries
                and last[-1].req_id.partition_id == this[0].req_id.partition_id
                and last[-1].transaction_id + 1 == this[0].transaction_id
            ):
                if not merged:
                    out[-1] = server_pb2.ServerMessage(feed=out[-1].feed)
                    merged = True
                out[-1].feed.transactions.extend(this)
                continue
        out.append(message)
        merged = False
    return out


class Outbound:
    """Messages waiting for the writer. Feeds wait while it is full; answers never wait, because the
    reader stops reading (so the client stops sending) while it is full, which bounds them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[server_pb2.ServerMessage] = deque()
        self._nonempty = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, message: server_pb2.ServerMessage) -> None:
        if self.closed:
            return
        self._items.append(message)
        self._nonempty.set()
        if len(self._items) >= self.limit:
            self._room.clear()

    def try_put(self, message: server_pb2.ServerMessage) -> bool:
        """put_nowait if there is room (a feed may not wait here); False if not."""
        if len(self._items) >= self.limit:
            return False
        self.put_nowait(message)
        return True

    async def wait_room(self) -> None:
        while len(self._items) >= self.limit and not self.closed:
            self._room.clear()
            await self._room.wait()

    async def put(self, message: server_pb2.ServerMessage) -> None:
        await self.wait_room()
        self.put_nowait(message)

    async def take(self) -> list[server_pb2.ServerMessage]:
        while not self._items:
            self._nonempty.clear()
            await self._nonempty.wait()
        items = list(self._items)
        self._items.clear()
        self._room.set()
        return items

    def close(self) -> None:
        self.closed = True
        self._room.set()


class StreamAborted(Exception):
    """The client sent something that ends the stream with a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ClientStream:
    """The server side of one client's Stream; partitions see it as a StreamPort."""

    def __init__(self, manager: PartitionManager, server_id: int, queue_size: int, max_feed_entries: int) -> None:
        self.stream_id = next(_stream_ids)
        self._manager = manager
        self._server_id = server_id
        self.outbound = Outbound(queue_size)
        self._max_feed_entries = max_feed_entries
        self._mounted: set[int] = set()

    # StreamPort

    def send_control(self, message: server_pb2.ServerMessage) -> None:
        self.outbound.put_nowait(message)

    async def send_feed(self, message: server_pb2.ServerMessage) -> None:
        await self.outbound.put(message)

    def try_send_feed(self, message: server_pb2.ServerMessage) -> bool:
        return self.outbound.try_put(message)

    # the two loops

    async def read(self, messages: AsyncIterator[server_pb2.ClientMessage]) -> None:
        async for message in messages:
            await self.outbound.wait_room()
            await self.dispatch(message)

    async def write(self, context: grpc.aio.ServicerContext) -> None:
        while True:
            for message in coalesce(await self.outbound.take(), self._max_feed_entries):
                await context.write(message)

    async def drain(self, context: grpc.aio.ServicerContext) -> None:
        """Write what is still queued (the client closed its side)."""
        while len(self.outbound):
            for message in coalesce(await self.outbound.take(), self._max_feed_entries):
                await context.write(message)

    def detach(self) -> None:
        self.outbound.close()
        for pid in self._mounted:
            partition = self._manager.get(pid)
            if partition is not None:
                partition.detach(self)

    # dispatch

    async def dispatch(self, message: server_pb2.ClientMessage) -> None:
        kind = message.WhichOneof("message")
        if kind == "appends":
            await self._appends(message.appends.requests)
        elif kind == "mount":
            pid = message.mount.req_id.partition_id
            if not self._exists(message.mount.req_id):
                return
            partition = self._manager.get(pid)
            if partition is None or not partition.ready:
                state = server_pb2.MountResponse.NOT_READY
                self.send_control(mount_response(message.mount.req_id, state, -1))
                return
            self._mounted.add(pid)
            partition.mount(self, message.mount)
        elif kind == "feed":
            if not self._exists(message.feed.req_id):
                return
            partition = self._manager.get(message.feed.req_id.partition_id)
            if partition is not None:
                partition.feed(self, message.feed)
            else:  # not here (any more): mount again, wherever it is
                self.send_control(mount_response(message.feed.req_id, server_pb2.MountResponse.NOT_READY, -1))
        elif kind == "flush":
            if not self._exists(message.flush.req_id):
                return
            partition = self._manager.get(message.flush.req_id.partition_id)
            if partition is not None:
                partition.flush(self, message.flush)
            else:  # not here (any more): the appends it asks about are not this server's to tell
                self.send_control(mount_response(message.flush.req_id, server_pb2.MountResponse.NOT_READY, -1))

    async def _appends(self, requests: Iterable[server_pb2.AppendRequest]) -> None:
        by_partition: dict[int, list[server_pb2.AppendRequest]] = {}
        for request in requests:
            by_partition.setdefault(request.req_id.partition_id, []).append(request)
        for pid, batch in by_partition.items():
            partition = self._manager.get(pid)
            if partition is not None:
                await partition.submit(self, batch)
                continue
            if 0 <= pid < self._manager.num_partitions:
                reason, text = Reason.PARTITION_NOT_READY, self._not_here(pid)
            else:
                reason, text = Reason.INVALID, self._no_such(pid)
            for request in batch:
                self.send_control(rejected(request.req_id, reason, text))

    def _exists(self, req_id: common_pb2.ReqId) -> bool:
        """Whether the request's partition exists; if not, it is answered NO_SUCH_PARTITION (the stream goes on)."""
        if 0 <= req_id.partition_id < self._manager.num_partitions:
            return True
        state = server_pb2.MountResponse.NO_SUCH_PARTITION
        self.send_control(mount_response(req_id, state, -1, self._no_such(req_id.partition_id)))
        return False

    def _no_such(self, pid: int) -> str:
        return f"partition {pid} does not exist: the cluster has partitions 0-{self._manager.num_partitions - 1}"

    def _not_here(self, pid: int) -> str:
        return f"partition {pid} is not owned by server {self._server_id}: find its owner and remount"
