"""Answers for a server that has gone away are dropped quietly, and the partition threads are never held up."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import grpc

from waltz.v1 import storage_pb2
from waltz_storage import protocol
from waltz_storage.dispatch import StreamRequest
from waltz_storage.node import StorageNode
from waltz_storage.service import SessionContext, StorageConnection


class GonePeer:
    """A servicer context whose stream broke: every write fails, as grpc's execute_batch does."""

    def __init__(self) -> None:
        self.writes = 0

    async def write(self, response: Any) -> None:
        self.writes += 1
        raise RuntimeError('Failed "execute_batch"')


def test_the_writer_drops_answers_once_the_stream_broke_instead_of_failing_the_session() -> None:
    """It raised, and grpc logged 'Unexpected [ExceptionGroup] raised by servicer method' with two
    tracebacks at ERROR on every server crash (tests/chaos: kill -9 of a server)."""

    async def main() -> None:
        peer = GonePeer()
        connection = StorageConnection(cast(StorageNode, None), cast(grpc.aio.ServicerContext, peer))
        writer = asyncio.create_task(connection._write_loop())
        connection._unanswered[0] = connection._in_flight = 5  # five requests queued on partition 0's thread
        await asyncio.to_thread(connection.answer, 0, list(range(5)))  # answered from that thread
        connection._end_of_requests()
        await asyncio.wait_for(writer, 5)
        assert peer.writes == 1 and not connection._outbox and connection._in_flight == 0

    asyncio.run(main())


class FramedPeer:
    """A framed stream as StorageConnection sees it: requests to read, answers written at once (write_now, unless
    the transport is `full`) or through the writer task (write: the frame goes out, then it waits for `drained`
    when `slow`)."""

    def __init__(self, requests: list[Any]) -> None:
        self.requests = list(requests)
        self.full = self.slow = False
        self.drained = asyncio.Event()
        self.sent: list[tuple[str, int]] = []  # (how, seq_num), in the order they went out

    async def read(self) -> Any:
        await asyncio.sleep(0)
        return self.requests.pop(0) if self.requests else grpc.aio.EOF

    async def write(self, response: Any) -> None:
        self.sent.append(("write", response.success.seq_num))
        if self.slow:
            await self.drained.wait()

    def write_now(self, response: Any) -> bool:
        if self.full:
            return False
        self.sent.append(("now", response.success.seq_num))
        return True


class LoopNode:
    """A node that serves every append right away on the loop (StorageNode.serve's answer when it is quiet)."""

    stopping = False

    def __init__(self) -> None:
        self.manager = SimpleNamespace(control_file=SimpleNamespace(check_partition_id=lambda partition_id: None))

    def serve(self, request: StreamRequest, stream_quiet: bool) -> list[storage_pb2.StorageResponse]:
        return [protocol.success(request.msg.session_id, request.msg.seq_num, request.msg.partition_id)]

    def register(self, stream: Any) -> None:
        pass

    def unregister(self, stream: Any) -> None:
        pass


def test_an_answer_made_on_the_loop_goes_out_at_once_unless_the_transport_is_full_or_answers_wait() -> None:
    """On a framed stream an answer made right away is written then and there (no hop through the writer task);
    while the transport is full (2, 3), or answers wait for the writer (4, 5: it is still draining 2), answers
    go through the writer, and every answer goes out in order."""

    async def main() -> list[tuple[str, int]]:
        requests = [
            storage_pb2.StorageRequest(append=storage_pb2.StorageAppendRequest(session_id=1, seq_num=i))
            for i in range(7)
        ]
        peer = FramedPeer(requests)
        node = cast(StorageNode, LoopNode())
        connection = StorageConnection(node, cast(SessionContext, peer), write_now=peer.write_now)
        connection.opened = True
        read = peer.read

        async def reading() -> Any:
            request = await read()
            if request is not grpc.aio.EOF:
                seq_num = request.append.seq_num
                peer.full = seq_num in (2, 3)
                peer.slow = seq_num == 2
                if seq_num == 5:
                    peer.drained.set()
            return request

        peer.read = reading  # type: ignore[method-assign]
        await asyncio.wait_for(connection.run(), 5)
        return peer.sent

    assert asyncio.run(main()) == [
        ("now", 0), ("now", 1), ("write", 2), ("write", 3), ("write", 4), ("write", 5), ("now", 6)
    ]
