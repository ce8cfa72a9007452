"""ServerConnection: appends are built in place inside AppendBatches, in queue order, up to the batch size."""

import asyncio

from waltz.v1 import server_pb2
from waltz_client.connection import ServerConnection
from waltz_client.driver import ServerStream


class RecordingStream(ServerStream):
    def __init__(self) -> None:
        self.sent: list[server_pb2.ClientMessage] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def send(self, message: server_pb2.ClientMessage) -> None:
        await self.gate.wait()
        self.sent.append(message)

    async def receive(self) -> server_pb2.ServerMessage:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        pass


def _shape(messages: list[server_pb2.ClientMessage]) -> list[object]:
    """Each message as its append headers (a list) or its kind."""
    return [[r.header for r in m.appends.requests] if m.WhichOneof("message") == "appends"
            else m.WhichOneof("message") for m in messages]


def _append(conn: ServerConnection, header: int) -> None:
    conn.new_append().header = header


def test_appends_batch_between_other_messages_in_order_and_up_to_the_batch_size() -> None:
    async def main() -> None:
        stream = RecordingStream()
        conn = ServerConnection("here", stream, 1, max_batch=3)
        sender = asyncio.ensure_future(conn._send_loop())
        for header in (1, 2, 3, 4):
            _append(conn, header)
        conn.enqueue(server_pb2.ClientMessage(flush=server_pb2.FlushRequest()))
        _append(conn, 5)
        await asyncio.sleep(0.01)
        assert _shape(stream.sent) == [[1, 2, 3], [4], "flush", [5]]

        stream.gate.clear()  # a send in flight: what is queued meanwhile goes in the next message
        _append(conn, 6)
        await asyncio.sleep(0.01)
        _append(conn, 7)
        _append(conn, 8)
        stream.gate.set()
        await asyncio.sleep(0.01)
        assert _shape(stream.sent)[4:] == [[6], [7, 8]]
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)

    asyncio.run(main())


def test_appends_made_together_fill_the_open_batch_then_start_new_ones() -> None:
    async def main() -> None:
        stream = RecordingStream()
        conn = ServerConnection("here", stream, 1, max_batch=3)
        sender = asyncio.ensure_future(conn._send_loop())
        _append(conn, 1)
        for header, request in zip((2, 3, 4, 5, 6, 7), conn.new_appends(6), strict=True):
            request.header = header
        assert conn.new_appends(0) == []
        await asyncio.sleep(0.01)
        assert _shape(stream.sent) == [[1, 2, 3], [4, 5, 6], [7]]
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)

    asyncio.run(main())
