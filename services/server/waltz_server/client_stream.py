"""One client's ordered Stream: a reader dispatching by partition and a writer draining a bounded queue."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence

import grpc

from waltz.v1 import common_pb2, server_pb2
from waltz_common.wire import varint
from waltz_server.feed import mount_response
from waltz_server.identity import BindingUnavailable, ClientIdentities, ClientIdentity
from waltz_server.ownership import PartitionManager
from waltz_server.partition_admission import rejected

Reason = server_pb2.AppendRejected.Reason
EMPTY_MESSAGE = (
    "a ClientMessage carries none of mount, appends, feed or flush (empty, or a kind this server does not know): "
    "the stream is ended"
)
_stream_ids = itertools.count(1)
_FEED_TAG = varint(server_pb2.ServerMessage.DESCRIPTOR.fields_by_name["feed"].number << 3 | 2)  # length-delimited


Outgoing = server_pb2.ServerMessage | bytes
"""What the Stream writes: a message, or feed batches merged by coalesce, serialized (stream_answer sends either)."""


def stream_answer(message: Outgoing) -> bytes:
    """The Stream's response serializer: a ServerMessage, or the bytes of one (coalesce's merges)."""
    return message if type(message) is bytes else message.SerializeToString()  # type: ignore[union-attr]


def coalesce(
    messages: list[server_pb2.ServerMessage], max_entries: int
) -> list[tuple[Outgoing, server_pb2.ServerMessage]]:
    """Merge adjacent feed batches of one partition with consecutive ids (fewer, larger messages): each with
    the last message it holds (whose last entry is the last it writes).

    A merge is one ServerMessage whose one `feed` field holds the batches' FeedDataBatch serializations
    joined: a repeated field's elements may come in any number of runs, which every protobuf parser
    appends, so the client reads one batch of all their entries in order, and no entry is copied (copying a
    batch's entries into a new message cost about as much as the rest of a catch-up feed's work on the
    server). Not the ServerMessages joined: that repeats the singular `feed` field, which protobuf says to
    merge but widely used parsers replace (protobufjs 7, under @grpc/proto-loader, keeps only the last
    occurrence), so such a client would lose every batch but the last. The messages given are never
    changed (a feed batch is shared by every stream it goes to).
    """
    out: list[tuple[Outgoing, server_pb2.ServerMessage]] = []
    run: list[server_pb2.ServerMessage] = []  # adjacent feed batches that merge, none empty
    count = 0
    for message in messages:
        entries = message.feed.transactions if message.WhichOneof("message") == "feed" else None
        if run and entries and count + len(entries) <= max_entries:
            last, first = run[-1].feed.transactions[-1], entries[0]
            consecutive = last.transaction_id + 1 == first.transaction_id
            if consecutive and last.req_id.partition_id == first.req_id.partition_id:
                run.append(message)
                count += len(entries)
                continue
        _merged(run, out)
        run, count = ([message], len(entries)) if entries else ([], 0)
        if not entries:
            out.append((message, message))
    _merged(run, out)
    return out


def _merged(run: list[server_pb2.ServerMessage], out: list[tuple[Outgoing, server_pb2.ServerMessage]]) -> None:
    if len(run) == 1:
        out.append((run[0], run[0]))
    elif run:
        body = b"".join([message.feed.SerializeToString() for message in run])
        out.append((_FEED_TAG + varint(len(body)) + body, run[-1]))


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

    def __init__(
        self,
        manager: PartitionManager,
        server_id: int,
        queue_size: int,
        max_feed_entries: int,
        identity: ClientIdentity | None = None,
        identities: ClientIdentities | None = None,
    ) -> None:
        """identity: the peer's (mutual TLS), checked against the client ids it mounts and appends under by
        identities; None (or no identities): nothing is checked."""
        self.stream_id = next(_stream_ids)
        self._manager = manager
        self._server_id = server_id
        self.outbound = Outbound(queue_size)
        self._max_feed_entries = max_feed_entries
        self._mounted: set[int] = set()
        self._identities = identities if identity is not None else None
        self._identity = identity
        self._permitted_ids: set[int] = set()  # client ids this stream's identity may use (checked once)
        self._written: dict[int, int] = {}  # partition -> the last transaction id handed to the transport (lag)

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
            for payload, message in coalesce(await self.outbound.take(), self._max_feed_entries):
                await context.write(payload)
                self._wrote(message)

    async def drain(self, context: grpc.aio.ServicerContext) -> None:
        """Write what is still queued (the client closed its side)."""
        while len(self.outbound):
            for payload, message in coalesce(await self.outbound.take(), self._max_feed_entries):
                await context.write(payload)
                self._wrote(message)

    def written(self, partition_id: int) -> int | None:
        return self._written.get(partition_id)

    def _wrote(self, message: server_pb2.ServerMessage) -> None:
        if message.WhichOneof("message") == "feed":
            entries = message.feed.transactions
            if entries:
                last = entries[-1]
                self._written[last.req_id.partition_id] = last.transaction_id

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
            if self._identities is not None and not await self._may_mount(message.mount.req_id):
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
        else:  # nothing to answer it with (no ReqId): say so and end the stream rather than drop it unseen
            raise StreamAborted(grpc.StatusCode.INVALID_ARGUMENT, EMPTY_MESSAGE)

    async def _appends(self, requests: Sequence[server_pb2.AppendRequest]) -> None:
        """Hand the appends to their partitions: the first one's partition takes its own and hands back the others
        (in order), which go the same way; each append's partition is read once, by the partition that takes it."""
        if self._identities is not None:
            requests = await self._permitted(requests)
        while requests:
            pid = requests[0].req_id.partition_id
            partition = self._manager.get(pid)
            if partition is not None:
                rest = await partition.submit(self, requests)
                if len(rest) >= len(requests):  # (it took none: a partition under another id would loop for ever)
                    raise RuntimeError(f"partition {pid} took none of its appends")
                requests = rest
                continue
            if 0 <= pid < self._manager.num_partitions:
                reason, text = Reason.PARTITION_NOT_READY, self._not_here(pid)
            else:
                reason, text = Reason.INVALID, self._no_such(pid)
            others: list[server_pb2.AppendRequest] = []
            for request in requests:
                req_id = request.req_id
                if req_id.partition_id == pid:
                    self.send_control(rejected(req_id, reason, text))
                else:
                    others.append(request)
            requests = others

    # client identity (mutual TLS): a client id is used only by the identity it is bound to

    async def _refusal(self, client_id: int) -> tuple[str, bool] | None:
        """None when this stream's identity may use client_id; else (why, whether for good: False when the binding
        could not be checked, a retry may do)."""
        if client_id in self._permitted_ids:
            return None
        assert self._identities is not None
        try:
            denied = await self._identities.check(client_id, self._identity)
        except BindingUnavailable as exc:
            return f"cannot check which identity client id {client_id} belongs to: {exc}; retry shortly", False
        if denied is None:
            self._permitted_ids.add(client_id)
            return None
        return denied, True

    async def _may_mount(self, req_id: common_pb2.ReqId) -> bool:
        """Whether the mount may go on; if not it is answered (PERMISSION_DENIED, or NOT_READY to retry), and
        the client id's real owner, mounted or not, hears nothing of it."""
        refusal = await self._refusal(req_id.client_id)
        if refusal is None:
            return True
        text, final = refusal
        state = server_pb2.MountResponse.PERMISSION_DENIED if final else server_pb2.MountResponse.NOT_READY
        self.send_control(mount_response(req_id, state, -1, f"partition {req_id.partition_id}: {text}"))
        return False

    async def _permitted(self, requests: Iterable[server_pb2.AppendRequest]) -> list[server_pb2.AppendRequest]:
        """The appends this stream's identity may make; the others are answered (PERMISSION_DENIED, or
        PARTITION_NOT_READY to remount and retry) and change nothing of the client id's."""
        kept: list[server_pb2.AppendRequest] = []
        permitted = self._permitted_ids
        for request in requests:
            client_id = request.req_id.client_id
            if client_id in permitted or (refusal := await self._refusal(client_id)) is None:
                kept.append(request)  # the common case costs a set lookup: the id was checked at its mount
                continue
            text, final = refusal
            reason = Reason.PERMISSION_DENIED if final else Reason.PARTITION_NOT_READY
            self.send_control(rejected(request.req_id, reason, f"partition {request.req_id.partition_id}: {text}"))
        return kept

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
