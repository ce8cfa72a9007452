"""bench.raw_client.mount_stream: a mount below the partition's high-water mark is answered with the catch-up feed
first and READY after it; the feed goes to the caller (append_bench's feed row from 0 failed on it)."""

from __future__ import annotations

import asyncio
from typing import Any

from bench.raw_client import mount_stream
from waltz.v1 import server_pb2


class FakeCall:
    """A raw Stream call whose answers are given up front."""

    def __init__(self, answers: list[server_pb2.ServerMessage]) -> None:
        self.answers = answers
        self.written: list[server_pb2.ClientMessage] = []

    async def write(self, message: server_pb2.ClientMessage) -> None:
        self.written.append(message)

    async def read(self) -> Any:
        return self.answers.pop(0)


def feed(*ids: int) -> server_pb2.ServerMessage:
    message = server_pb2.ServerMessage()
    for transaction_id in ids:
        message.feed.transactions.add(transaction_id=transaction_id)
    return message


def test_the_catch_up_feed_before_ready_goes_to_the_caller() -> None:
    ready = server_pb2.ServerMessage(mount=server_pb2.MountResponse(state=server_pb2.MountResponse.READY))
    call = FakeCall([feed(0, 1), feed(2), ready])
    seen: list[Any] = []
    asyncio.run(mount_stream(call, server_pb2.MountRequest(seq_num=1), on_feed=seen.append))
    assert [[t.transaction_id for t in f.transactions] for f in seen] == [[0, 1], [2]]
    assert len(call.written) == 1 and not call.answers
