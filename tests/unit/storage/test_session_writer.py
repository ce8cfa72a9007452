"""Answers for a server that has gone away are dropped quietly, and the partition threads are never held up."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc

from waltz_storage.node import StorageNode
from waltz_storage.service import StorageConnection


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
