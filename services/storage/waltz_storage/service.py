"""The WaltzStorage.Session stream: Open, then requests multiplexed over partitions, each in its own lane."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from waltz.v1 import storage_pb2, storage_pb2_grpc
from waltz_storage import protocol
from waltz_storage.errors import InvalidRequest, StorageError
from waltz_storage.node import StorageNode, StreamReader

PARTITION_QUEUE_SIZE = 100  # requests waiting per partition per stream; then the stream is not read
RESPONSE_QUEUE_SIZE = 1000  # answers waiting to be written to one stream
MAX_GROUP_REQUESTS = 1000  # appends merged into one write and fdatasync

log = logging.getLogger(__name__)

_END = object()


def _batch_bytes(msg: storage_pb2.StorageAppendRequest) -> int:
    """An upper bound of the batch's size on disk, without touching each record (the hot path)."""
    return msg.ByteSize() + 40 * len(msg.records)


class StorageConnection:
    """One server connection: reads requests, feeds per-partition lanes, writes answers in completion order."""

    def __init__(self, node: StorageNode, context: grpc.aio.ServicerContext) -> None:
        self.node = node
        self.context = context
        self.opened = False
        self._responses: asyncio.Queue[Any] = asyncio.Queue(RESPONSE_QUEUE_SIZE)
        self._lanes: dict[int, tuple[asyncio.Queue[Any], asyncio.Task[None]]] = {}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._write_loop())
            with StreamReader(self.context, self.node) as reader:
                while (request := await reader.read()) is not None:
                    await self._dispatch(request, tasks)
            for queue, _ in self._lanes.values():
                await queue.put(_END)
            await asyncio.gather(*(task for _, task in self._lanes.values()))
            await self._responses.put(_END)

    async def _write_loop(self) -> None:
        writing = True
        while (response := await self._responses.get()) is not _END:
            if not writing:
                continue  # keep taking answers, so that lanes never wait for a writer that is gone
            try:
                await self.context.write(response)
            except Exception as exc:  # the server went away (a crash, kill -9): nobody is left to answer
                writing = False
                log.info("a server stream ended while it was being answered: %s: %s", type(exc).__name__, exc)

    async def _fail(self, msg: Any, exc: StorageError) -> None:
        await self._responses.put(self.node.executor.failure(msg, exc))

    async def _dispatch(self, request: storage_pb2.StorageRequest, tasks: asyncio.TaskGroup) -> None:
        kind = request.WhichOneof("request")
        if kind is None:
            await self._fail(None, InvalidRequest("the request carries no message (none of the oneof is set)"))
            return
        msg = getattr(request, kind)
        if kind == "open":
            await self._responses.put(self._open(msg))
            return
        if not self.opened:
            await self._fail(msg, protocol.NotOpen("the stream is not open: send an Open request with the cluster key"))
            return
        try:
            self.node.manager.control_file.check_partition_id(msg.partition_id)
        except StorageError as e:
            await self._fail(msg, e)
            return
        lane = self._lanes.get(msg.partition_id)
        if lane is None:
            queue: asyncio.Queue[Any] = asyncio.Queue(PARTITION_QUEUE_SIZE)
            lane = queue, tasks.create_task(self._lane_loop(msg.partition_id, queue))
            self._lanes[msg.partition_id] = lane
        await lane[0].put((kind, msg))

    def _open(self, msg: storage_pb2.OpenRequest) -> storage_pb2.StorageResponse:
        """Check the cluster key; a failed Open leaves the stream unopened, and another Open may follow."""
        try:
            self.node.check_cluster(protocol.parse_cluster_key(msg.cluster_key), msg.num_partitions)
        except StorageError as e:
            self.opened = False
            log.warning("refused an Open: %s", e)
            return self.node.executor.failure(msg, e)
        self.opened = True
        return protocol.success(msg.session_id, msg.seq_num, msg.partition_id)

    async def _lane_loop(self, partition_id: int, queue: asyncio.Queue[Any]) -> None:
        """Apply one partition's requests in arrival order; appends waiting together share one fdatasync."""
        executor = self.node.executor
        carry: Any = None
        while True:
            item = carry if carry is not None else await queue.get()
            carry = None
            if item is _END:
                return
            kind, msg = item
            if kind != "append":
                responses = [await self.node.run(partition_id, executor.execute, kind, msg)]
            else:
                group = [msg]
                size = _batch_bytes(msg) if not queue.empty() else 0  # sized only when there is more to merge
                while not queue.empty() and len(group) < MAX_GROUP_REQUESTS:
                    nxt = queue.get_nowait()
                    if nxt is _END or nxt[0] != "append" or not self._mergeable(msg, nxt[1]):
                        carry = nxt
                        break
                    more = _batch_bytes(nxt[1])
                    if size + more > self.node.limits.max_batch_bytes:
                        carry = nxt
                        break
                    group.append(nxt[1])
                    size += more
                responses = await self.node.run(partition_id, executor.execute_appends, group)
            for response in responses:
                await self._responses.put(response)

    @staticmethod
    def _mergeable(first: storage_pb2.StorageAppendRequest, other: storage_pb2.StorageAppendRequest) -> bool:
        return other.session_id == first.session_id and other.offline == first.offline


class StorageService(storage_pb2_grpc.WaltzStorageServicer):
    """grpc.aio servicer of WaltzStorage."""

    def __init__(self, node: StorageNode) -> None:
        self.node = node

    async def Session(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await StorageConnection(self.node, context).run()
