"""The framed Session connection's own reading and writing (FramedCall) and a connection's order of requests when
send() writes some frames itself and the writer task the others (_Stream.put), over a real socket pair."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import grpc
import pytest
import uvloop

from waltz.v1 import storage_pb2
from waltz_common import frames
from waltz_server.store.connection import _Stream
from waltz_server.store.framed_session import FramedCall
from waltz_server.store.wire import response_body

LARGE_BYTES = 1024 * 1024
"""Above what a transport reads at once."""


def answer(seq: int, padding: int = 0) -> bytes:
    """An answer to request seq; with padding, a Failure whose message is that long."""
    response = storage_pb2.StorageResponse()
    if padding:
        response.failure.seq_num = seq
        response.failure.exception.message = "k" * padding
    else:
        response.success.seq_num = seq
    return response.SerializeToString()


def framed(data: bytes) -> bytes:
    return len(data).to_bytes(frames.HEADER_BYTES, "big") + data


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[tuple[FramedCall, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A FramedCall on one end of a socket pair; the other end's reader and writer play the storage node."""
    ours, theirs = socket.socketpair()
    _, call = await asyncio.get_running_loop().create_connection(FramedCall, sock=ours)
    node_reader, node_writer = await asyncio.open_connection(sock=theirs)
    try:
        yield call, node_reader, node_writer
    finally:
        await call.close()
        node_writer.close()


async def read_seqs(call: FramedCall, count: int) -> list[int]:
    seqs = []
    for _ in range(count):
        response = await call.read()
        assert isinstance(response, storage_pb2.StorageResponse)
        seqs.append(response_body(response).seq_num)
    return seqs


def test_answers_are_cut_out_however_the_bytes_arrive() -> None:
    async def main() -> None:
        async with pair() as (call, _, node):
            # several whole answers in one write, one answer a byte at a time, one larger than a read
            node.write(b"".join(framed(answer(seq)) for seq in range(3)))
            await node.drain()
            assert await read_seqs(call, 3) == [0, 1, 2]
            reading = asyncio.ensure_future(read_seqs(call, 1))
            for byte in framed(answer(3)):
                node.write(bytes([byte]))
                await node.drain()
                await asyncio.sleep(0)
            assert await reading == [3]
            big = answer(4, padding=3 * LARGE_BYTES)
            reading = asyncio.ensure_future(read_seqs(call, 2))
            node.write(framed(big) + framed(answer(5))[:3])  # and the next answer's first bytes
            await node.drain()
            await asyncio.sleep(0.05)
            node.write(framed(answer(5))[3:])
            await node.drain()
            assert await reading == [4, 5]
            node.write(framed(b""))  # an empty frame: an empty answer
            node.write_eof()
            empty = await call.read()
            assert isinstance(empty, storage_pb2.StorageResponse) and empty.WhichOneof("response") is None
            assert await call.read() is grpc.aio.EOF

    asyncio.run(main())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_after_deliver_every_answer_is_handed_on_as_it_arrives_in_order(loop: str) -> None:
    """deliver() hands the answers read() had not returned first, then each one in data_received, however the
    bytes arrive; ended() says how the connection ended. On uvloop too (the servers' loop), whose transports are
    not asyncio.Transport subclasses."""

    async def main() -> None:
        async with pair() as (call, _, node):
            node.write(framed(answer(0)) + framed(answer(1)))
            await node.drain()
            assert await read_seqs(call, 1) == [0]
            await asyncio.sleep(0.05)  # answer 1 arrived before deliver()
            got: list[int] = []
            call.deliver(lambda response: got.append(response_body(response).seq_num))
            assert got == [1]
            node.write(b"".join(framed(answer(seq)) for seq in range(2, 5)) + framed(answer(5))[:3])
            await node.drain()
            await asyncio.sleep(0.05)
            assert got == [1, 2, 3, 4]
            node.write(framed(answer(5))[3:] + framed(answer(6, padding=3 * LARGE_BYTES)))
            await node.drain()
            node.write_eof()
            assert await call.ended() is None
            assert got == [1, 2, 3, 4, 5, 6]

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
        runner.run(asyncio.wait_for(main(), 10))


def test_an_answer_that_does_not_decode_ends_the_connection() -> None:
    async def main() -> None:
        async with pair() as (call, _, node):
            call.deliver(lambda response: None)
            node.write(framed(b"\xff\xff\xff"))
            await node.drain()
            error = await asyncio.wait_for(call.ended(), 5)
            assert error is not None
            assert not call.write_now(b"x")

    asyncio.run(main())


def test_a_connection_closed_inside_an_answer_is_a_frame_error() -> None:
    async def main() -> None:
        async with pair() as (call, _, node):
            node.write(framed(answer(1))[:-2])
            node.write_eof()
            with pytest.raises(frames.FrameError, match="inside a frame"):
                await call.read()

    asyncio.run(main())


def test_requests_keep_their_order_when_some_are_written_at_once_and_others_wait_for_the_writer() -> None:
    """While the node does not read, the transport fills past frames.WRITE_HIGH_WATER_BYTES and put() queues
    from then on; once the node has read all that was written, put() still queues while anything waits in the
    queue, so the node gets every frame in order."""

    async def main() -> None:
        async with pair() as (call, node_reader, _):
            stream = _Stream(1, direct=call)
            frame = b"x" * (64 * 1024)
            count = 2 * frames.WRITE_HIGH_WATER_BYTES // len(frame) + 40

            def put(i: int) -> None:
                stream.put(i.to_bytes(4, "big") + frame)

            async def received() -> int:
                data = await frames.read_frame(node_reader, frames.MAX_FRAME_LIMIT)
                assert data is not None
                return int.from_bytes(data[:4], "big")

            for i in range(count):
                put(i)
            queued = stream.outgoing.qsize()
            assert 0 < queued < count, "the first frames were written at once, the later ones queued"
            assert [await received() for _ in range(count - queued)] == list(range(count - queued))
            put(count)  # the transport is empty now, but frames wait in the queue ahead of this one
            assert stream.outgoing.qsize() == queued + 1

            async def writer() -> None:
                while True:
                    await call.write(await stream.outgoing.get())

            writing = asyncio.ensure_future(writer())
            assert [await received() for _ in range(queued + 1)] == list(range(count - queued, count + 1))
            writing.cancel()
            stream.put(b"after")  # drained and nothing queued: written at once again
            assert stream.outgoing.qsize() == 0
            assert await frames.read_frame(node_reader, frames.MAX_FRAME_LIMIT) == b"after"

    asyncio.run(main())


def test_a_grpc_stream_is_written_by_its_writer_task_only() -> None:
    stream = _Stream(1)
    stream.put(b"a")
    stream.put(b"b")
    assert [stream.outgoing.get_nowait(), stream.outgoing.get_nowait()] == [b"a", b"b"]
