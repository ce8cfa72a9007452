"""The framed session port's connection (waltz_storage.framed_connection.FramedConnection) on a transport double:
requests handed to the reader in order, backlog, a bad frame, the end of the stream, and back-pressure both ways
(pause_reading past the read-ahead bound and resume once drained; writes wait while writing is paused)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from waltz.v1 import storage_pb2
from waltz_common import frames
from waltz_storage.framed_connection import FramedConnection


class Transport(asyncio.Transport):
    """What FramedConnection calls on its transport, recorded."""

    def __init__(self, ssl: bool = False) -> None:
        super().__init__()
        self.written = bytearray()
        self.reading = True
        self.pauses = 0
        self.closing = False
        self.limits: tuple[int | None, int | None] | None = None
        self.ssl = ssl

    def write(self, data: Any) -> None:
        self.written += data

    def pause_reading(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high, low)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return object() if name == "sslcontext" and self.ssl else default


def request(seq_num: int, session_id: int = 0) -> storage_pb2.StorageRequest:
    """A request whose frame is 12 bytes with a session_id of 2**20, longer with a larger one."""
    return storage_pb2.StorageRequest(
        max_transaction_id=storage_pb2.MaxTransactionIdRequest(seq_num=seq_num, session_id=session_id)
    )


def frame(message: Any) -> bytes:
    data = message.SerializeToString()
    return len(data).to_bytes(4, "big") + data


def answer(seq_num: int) -> storage_pb2.StorageResponse:
    response = storage_pb2.StorageResponse()
    response.success.seq_num = seq_num
    return response


def connected(read_ahead: int = 1 << 20, max_frame: int = 1 << 20, ssl: bool = False) -> tuple[FramedConnection,
                                                                                                  Transport]:
    made: list[FramedConnection] = []
    connection = FramedConnection(max_frame, made.append, read_ahead)
    transport = Transport(ssl)
    connection.connection_made(transport)
    assert made == [connection]
    return connection, transport


def run(scenario: Any) -> None:
    asyncio.run(scenario())


async def soon(awaitable: Any) -> Any:
    """awaitable's result, or a timeout: a test that finds a bug fails instead of hanging."""
    return await asyncio.wait_for(awaitable, 5)


def test_requests_are_read_in_order_and_backlog_says_whether_more_have_arrived():
    async def scenario():
        connection, transport = connected()
        assert transport.limits == (frames.WRITE_HIGH_WATER_BYTES, None)
        connection.data_received(frame(request(1)) + frame(request(2))[:3])
        assert (await soon(connection.read())).max_transaction_id.seq_num == 1
        assert connection.backlog()  # part of the second request
        connection.data_received(frame(request(2))[3:])
        assert connection.backlog()
        assert (await soon(connection.read())).max_transaction_id.seq_num == 2
        assert not connection.backlog()

    run(scenario)


def test_a_waiting_reader_gets_the_request_when_it_arrives_and_eof_at_the_end():
    async def scenario():
        connection, _ = connected()
        reading = asyncio.ensure_future(connection.read())
        await asyncio.sleep(0)
        assert not reading.done()
        data = frame(request(7))
        connection.data_received(data[:5])
        await asyncio.sleep(0)
        assert not reading.done()
        connection.data_received(data[5:])
        assert (await reading).max_transaction_id.seq_num == 7
        ending = asyncio.ensure_future(connection.read())
        await asyncio.sleep(0)
        assert connection.eof_received() is True  # a half-close: the answers still go out
        assert await ending is grpc.aio.EOF and connection.bad is None

    run(scenario)


def test_under_tls_an_end_of_stream_does_not_ask_to_keep_the_connection_half_open():
    async def scenario():
        connection, _ = connected(ssl=True)
        assert connection.eof_received() is False

    run(scenario)


def test_a_cut_frame_at_the_end_is_bad_after_the_requests_before_it():
    async def scenario():
        connection, _ = connected()
        connection.data_received(frame(request(1)) + b"\x00\x00\x01\x00" + b"x" * 10)
        connection.eof_received()
        assert (await soon(connection.read())).max_transaction_id.seq_num == 1
        assert await soon(connection.read()) is grpc.aio.EOF
        assert connection.bad == "the stream ended 10 bytes into a frame of 256 bytes"

    run(scenario)


@pytest.mark.parametrize("bad", ["oversized", "undecodable"])
def test_a_bad_frame_ends_the_requests_after_the_ones_before_it(bad):
    async def scenario():
        connection, _ = connected(max_frame=1000)
        tail = (5000).to_bytes(4, "big") + b"y" * 10 if bad == "oversized" else b"\x00\x00\x00\x03\xff\xff\xff"
        connection.data_received(frame(request(1)) + tail + frame(request(2)))
        assert (await soon(connection.read())).max_transaction_id.seq_num == 1
        assert await soon(connection.read()) is grpc.aio.EOF
        assert await soon(connection.read()) is grpc.aio.EOF  # and stays ended
        assert connection.bad == {
            "oversized": "a frame of 5000 bytes is above the limit of 1000 bytes (2 x storage.maxBatchBytes + 1 MiB)",
            "undecodable": "a frame of 3 bytes is not a valid waltz.v1.StorageRequest: its bytes do not decode",
        }[bad]

    run(scenario)


def test_a_reset_ends_the_requests_at_once():
    async def scenario():
        connection, _ = connected()
        connection.data_received(frame(request(1)))
        connection.connection_lost(ConnectionResetError("reset by peer"))
        assert await soon(connection.read()) is grpc.aio.EOF and connection.bad is None

    run(scenario)


def test_reading_stops_past_twice_the_read_ahead_and_starts_again_once_drained_to_it():
    async def scenario():
        one = frame(request(1, session_id=1 << 20))
        assert len(one) == 12
        connection, transport = connected(read_ahead=len(one) * 3)
        connection.data_received(one * 6)  # exactly twice the read-ahead: still reading
        assert transport.reading
        connection.data_received(one)
        assert not transport.reading and transport.pauses == 1
        connection.data_received(one * 3)  # what was in flight still arrives; no second pause
        assert transport.pauses == 1
        for left in range(9, 3, -1):  # served down to 4 frames waiting: more than the read-ahead
            await soon(connection.read())
            assert not transport.reading, left
        await soon(connection.read())  # 3 waiting: the read-ahead
        assert transport.reading

    run(scenario)


def test_a_frame_larger_than_the_read_ahead_is_still_read_whole():
    async def scenario():
        big = frame(request(9, session_id=1 << 62))
        small = frame(request(1))
        assert len(big) > 2 * len(small) + 1
        connection, transport = connected(read_ahead=len(small))
        connection.data_received(small * 3)  # past twice the read-ahead: paused
        assert not transport.reading
        for _ in range(3):
            await soon(connection.read())
        assert transport.reading
        # One request to serve and most of a large one: more than twice the read-ahead in all, but only part of a
        # frame past the request, which cannot be served before the rest of it comes: reading goes on.
        connection.data_received(small + big[:-1])
        assert transport.reading
        assert (await soon(connection.read())).max_transaction_id.seq_num == 1
        reading = asyncio.ensure_future(connection.read())
        await asyncio.sleep(0)
        connection.data_received(big[-1:])
        assert (await soon(reading)).max_transaction_id.seq_num == 9

    run(scenario)


def test_writes_wait_while_writing_is_paused_and_write_now_declines():
    async def scenario():
        connection, transport = connected()
        assert connection.write_now(answer(1))
        await connection.write(answer(2))  # not paused: no wait
        connection.pause_writing()
        assert not connection.write_now(answer(3))
        writing = asyncio.ensure_future(connection.write(answer(3)))  # queued on the transport, then waits
        await asyncio.sleep(0.01)
        assert not writing.done()
        connection.resume_writing()
        await asyncio.wait_for(writing, 1)
        assert connection.write_now(answer(4))
        got, data = [], bytes(transport.written)
        while data:
            size = int.from_bytes(data[:4], "big")
            got.append(storage_pb2.StorageResponse.FromString(data[4:4 + size]).success.seq_num)
            data = data[4 + size:]
        assert got == [1, 2, 3, 4]

    run(scenario)


def test_a_write_waiting_for_room_fails_when_the_connection_is_lost():
    async def scenario():
        connection, transport = connected()
        connection.pause_writing()
        writing = asyncio.ensure_future(connection.write(answer(1)))
        await asyncio.sleep(0)
        connection.connection_lost(None)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(writing, 1)
        with pytest.raises(ConnectionResetError):
            await connection.write(answer(2))
        transport.closing = True
        assert not connection.write_now(answer(3))
        await asyncio.wait_for(connection.closed(), 1)

    run(scenario)


def test_an_attached_taker_is_called_in_data_received_and_takes_every_request_that_arrived():
    async def scenario():
        connection, _ = connected()
        taken: list[Any] = []

        def take() -> None:
            while (got := connection.next_request()) is not None:
                if got is grpc.aio.EOF:
                    taken.append(got)
                    return
                taken.append(got.max_transaction_id.seq_num)

        connection.data_received(frame(request(1)))
        connection.attach(take)  # what came before it is taken at once
        assert taken == [1]
        connection.data_received(frame(request(2)) + frame(request(3)) + frame(request(4))[:5])
        assert taken == [1, 2, 3]  # in the transport's callback, no task woken
        connection.data_received(frame(request(4))[5:])
        assert taken == [1, 2, 3, 4]
        connection.eof_received()
        assert taken == [1, 2, 3, 4, grpc.aio.EOF] and connection.bad is None
        connection.attach(None)
        assert await soon(connection.read()) is grpc.aio.EOF

    run(scenario)


def test_an_attached_taker_sees_a_bad_frame_as_the_end_after_the_requests_before_it():
    async def scenario():
        connection, _ = connected()
        taken: list[Any] = []
        connection.attach(lambda: taken.append(connection.next_request()))
        assert taken == []  # nothing has arrived: not called
        connection.data_received(frame(request(1)) + b"\x00\x00\x00\x02\xff\xff")
        assert taken[0].max_transaction_id.seq_num == 1
        assert connection.next_request() is grpc.aio.EOF and connection.bad is not None

    run(scenario)
