"""The server's end of a storage node's framed Session port (storage.sessionPort on the node): the Session
stream's StorageRequest / StorageResponse messages as length-prefixed frames on TCP (waltz_common.frames),
with the same mutual TLS identity as the gRPC channels (tls.process_files).

A node advertises the port in its answer to Open on the gRPC stream; StorageConnection then opens this one,
and keeps the gRPC stream when it cannot (docs/operations.md, "The framed session port"). Liveness: TCP
keepalive finds a host that is gone, and while no answer arrives for storage.keepaliveTime the connection
sends a ping (an Open, answered by the node's event loop right away), and gives up when the ping is not
answered within as long again: a frozen node is noticed while idle too, as gRPC's HTTP/2 pings did.

The connection is an asyncio.Protocol: the answers are cut out of what arrives and handed on in data_received
itself (FramedCall.deliver), so an answer costs no task step of a reader; a StreamReader's read loop cost one per
answer, three per store batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import cast

import grpc

from waltz.v1 import storage_pb2
from waltz_common import frames, tls

_HEADER = frames.HEADER_BYTES


def _parse(data: memoryview) -> storage_pb2.StorageResponse:
    """An answer parsed where its bytes lie (protobuf's parser takes any buffer; its stubs say bytes)."""
    return storage_pb2.StorageResponse.FromString(data)  # type: ignore[arg-type]


class FramedCall(asyncio.Protocol):
    """One framed Session connection, written and read as StorageConnection does a gRPC stream call (write, read)
    until deliver() hands every later answer to a callback as it arrives."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()  # what arrived and is not a whole answer yet
        self._early: deque[storage_pb2.StorageResponse] = deque()  # answers read() returns (before deliver)
        self._deliver: Callable[[storage_pb2.StorageResponse], None] | None = None
        self._waiter: asyncio.Future[None] | None = None  # read(), ended() or a write waiting for a change
        self._ended = False
        self._error: BaseException | None = None  # why it ended (None: the node closed it between frames)
        self.last_read = self._loop.time()
        """When the last answer arrived (the keepalive pings after storage.keepaliveTime without one)."""

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's is not an asyncio.Transport subclass)
        self._transport.set_write_buffer_limits(high=frames.WRITE_HIGH_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        """Cut the whole answers out of what arrived, and hand each on at once."""
        self.last_read = self._loop.time()
        buffer = self._buffer
        try:
            if not buffer and len(data) >= _HEADER and len(data) == _HEADER + int.from_bytes(data[:_HEADER], "big"):
                self._hand(_parse(memoryview(data)[_HEADER:]))  # the common case, one whole answer
                return
            buffer += data
            while len(buffer) >= _HEADER:
                end = _HEADER + int.from_bytes(buffer[:_HEADER], "big")
                if len(buffer) < end:
                    return
                with memoryview(buffer) as view:
                    answer = _parse(view[_HEADER:end])
                del buffer[:end]
                self._hand(answer)
        except Exception as exc:  # an answer that does not decode (or a failing hand-off): the connection ends
            self._end(exc)
            if self._transport is not None:
                self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None and self._buffer:
            exc = frames.FrameError(f"the stream ended inside a frame ({len(self._buffer)} bytes of it read)")
        self._end(exc)

    def pause_writing(self) -> None:
        pass  # write() looks at the transport's buffer itself (frames.takes_now)

    def resume_writing(self) -> None:
        self._wake()

    # the call

    def deliver(self, answers: Callable[[storage_pb2.StorageResponse], None]) -> None:
        """Hand every answer to answers as it arrives (in data_received), those read() has not returned first."""
        self._deliver = answers
        while self._early:
            answers(self._early.popleft())

    def _hand(self, answer: storage_pb2.StorageResponse) -> None:
        if self._deliver is not None:
            self._deliver(answer)
        else:
            self._early.append(answer)
            self._wake()

    def _end(self, error: BaseException | None) -> None:
        if not self._ended:
            self._ended, self._error = True, error
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _changed(self) -> None:
        if self._waiter is None:
            self._waiter = self._loop.create_future()
        await asyncio.shield(self._waiter)  # (several may wait on one change)

    async def write(self, data: bytes) -> None:
        """Write data's frame, waiting first while the transport holds more than frames.WRITE_HIGH_WATER_BYTES."""
        transport = self._transport
        assert transport is not None
        while not self._ended and not frames.takes_now(transport):
            await self._changed()
        if self._ended:
            raise ConnectionResetError("the framed session connection is closed")
        frames.write_frame(transport, data)

    def write_now(self, data: bytes) -> bool:
        """Write data's frame at once when the transport takes it without waiting (open, and holding at most
        frames.WRITE_HIGH_WATER_BYTES unsent); False, with nothing written, when it would have to wait."""
        transport = self._transport
        if transport is None or self._ended or not frames.takes_now(transport):
            return False
        frames.write_frame(transport, data)
        return True

    async def read(self) -> storage_pb2.StorageResponse | object:
        """The next answer (before deliver()), or grpc.aio.EOF when the node closed the connection between frames;
        what ended it otherwise is raised (frames.FrameError when it closed it inside a frame)."""
        while not self._early:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return grpc.aio.EOF
            await self._changed()
        return self._early.popleft()

    async def ended(self) -> BaseException | None:
        """Return once the connection ended: why (None: the node closed it between frames)."""
        while not self._ended:
            await self._changed()
        return self._error

    def silent_for(self) -> float:
        return self._loop.time() - self.last_read

    def cancel(self) -> None:
        """Drop the connection now (what is unsent is lost: the requests' outcome is unknown)."""
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        self.cancel()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.ended()


async def open_framed(host: str, port: int, files: tls.TlsFiles | None, keepalive_s: float) -> FramedCall:
    """Connect to host:port (mutual TLS with files, the node's name checked against its certificate);
    OSError (ssl.SSLError included) when it cannot. The caller bounds the time."""
    context = frames.client_context(files) if files is not None else None
    name = host.strip("[]")
    _, call = await asyncio.get_running_loop().create_connection(
        FramedCall, name, port, ssl=context, server_hostname=name if context else None
    )
    assert call._transport is not None
    frames.set_keepalive(call._transport, keepalive_s * 2)
    return call
