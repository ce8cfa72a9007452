"""One connection of the storage node's framed session port, as an asyncio.Protocol: it owns its receive buffer
(frame_cutter.FrameCutter, fed in data_received), hands the requests over as they arrive, and is the stream
StorageConnection writes (write, write_now).

Why a Protocol of its own and not asyncio.start_server's StreamReader: a request costs one call into the cutter
instead of two readexactly coroutines (header, body), and the requests are served from data_received itself
(attach: StorageConnection takes them with next_request, straight-line, no task woken per request), all those
that arrived together at once, so that appends that came while the node was busy share one write and fdatasync.

Back-pressure both ways: reading stops (transport.pause_reading) while more than twice read_ahead_bytes of
complete requests wait to be served, and starts again once the reader has taken them down to read_ahead_bytes (or
waits for the rest of a frame larger than that); a write waits while the transport buffers more than
frames.WRITE_HIGH_WATER_BYTES (pause_writing / resume_writing: the peer does not read).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import grpc
from google.protobuf.message import DecodeError

from waltz.v1 import storage_pb2
from waltz_common import frames
from waltz_storage.frame_cutter import FrameCutter

READ_AHEAD_BYTES = 1024 * 1024
"""Bytes read ahead of the requests being served; above twice this the node stops reading (back-pressure)."""


class FramedConnection(asyncio.Protocol):
    """One accepted framed connection; on_made is called with it once the transport is up (after the TLS
    handshake under TLS). A bad frame ends the requests (read answers EOF) and is kept in ``bad`` for the last
    answer."""

    def __init__(
        self,
        max_frame_bytes: int,
        on_made: Callable[[FramedConnection], None] | None = None,
        read_ahead_bytes: int = READ_AHEAD_BYTES,
    ) -> None:
        self._cutter = FrameCutter(max_frame_bytes)
        self._on_made = on_made
        self._resume_at = read_ahead_bytes
        self._pause_above = 2 * read_ahead_bytes
        self.transport: asyncio.Transport | None = None
        self.bad: str | None = None
        self.reading_paused = False
        self.writing_paused = False
        self._reset = False  # the connection was lost with an error: nothing more is read from it
        self._lost: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None  # the reader waits on it for a frame or the end
        self._on_arrival: Callable[[], None] | None = None  # takes the requests as they arrive (attach)
        self._drained: list[asyncio.Future[None]] = []  # writers wait on them while writing is paused

    # ------------------------------------------------------------------ the transport's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._lost = asyncio.get_running_loop().create_future()
        self.transport.set_write_buffer_limits(high=frames.WRITE_HIGH_WATER_BYTES)
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:
        cutter = self._cutter
        cutter.feed(data)
        if cutter.frames or cutter.error is not None:
            self._arrived()
            if cutter.queued_bytes > self._pause_above and not self.reading_paused and self.transport is not None:
                self.reading_paused = True
                self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._cutter.end()
        self._arrived()
        # Keep the connection open to answer what was read (a half-close), except under TLS, which has none.
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._cutter.end()
        else:  # reset by the peer: nobody is left to answer the requests still buffered
            self._reset = True
        self._arrived()
        for waiter in self._drained:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("the connection was lost"))
        self._drained.clear()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        for waiter in self._drained:
            if not waiter.done():
                waiter.set_result(None)
        self._drained.clear()

    # ------------------------------------------------------------------ the reader's side

    def attach(self, on_arrival: Callable[[], None] | None) -> None:
        """Have on_arrival() called (now, if requests or the end are there already) whenever requests or the end
        arrive, in the transport's callback; it takes them with next_request. None: back to read."""
        self._on_arrival = on_arrival
        cutter = self._cutter
        if on_arrival is not None and (cutter.frames or cutter.error is not None or cutter.ended or self._reset):
            on_arrival()

    def next_request(self) -> storage_pb2.StorageRequest | object | None:
        """The next request that has arrived, None when none has yet, or grpc.aio.EOF at the end of the requests
        (the stream ended, or a bad frame: bad)."""
        if self.bad is not None or self._reset:
            return grpc.aio.EOF
        cutter = self._cutter
        if cutter.frames:
            data = cutter.pop()
            if self.reading_paused and cutter.queued_bytes <= self._resume_at:
                self._resume_reading()
            try:
                return storage_pb2.StorageRequest.FromString(data)
            except DecodeError:
                self.bad = (
                    f"a frame of {len(data)} bytes is not a valid waltz.v1.StorageRequest: its bytes do not decode"
                )
                return grpc.aio.EOF
        if cutter.error is not None:
            self.bad = str(cutter.error)
            if isinstance(cutter.error, frames.FrameTooLarge):
                self.bad += " (2 x storage.maxBatchBytes + 1 MiB)"
            return grpc.aio.EOF
        if cutter.ended:
            return grpc.aio.EOF
        return None

    async def read(self) -> storage_pb2.StorageRequest | object:
        """The next request, or grpc.aio.EOF at the end of the requests (the stream ended, or a bad frame: bad)."""
        while (request := self.next_request()) is None:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return request

    def backlog(self) -> bool:
        """Whether bytes of a later request have arrived already (they came while the node served this one)."""
        return self._cutter.backlog

    def _arrived(self) -> None:
        if self._on_arrival is not None:
            self._on_arrival()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _resume_reading(self) -> None:
        self.reading_paused = False
        if self.transport is not None and not self._reset:
            self.transport.resume_reading()

    # ------------------------------------------------------------------ the writer's side

    async def write(self, message: storage_pb2.StorageResponse) -> None:
        """Send an answer; waits while the transport holds more than frames.WRITE_HIGH_WATER_BYTES.
        ConnectionResetError when the connection is lost."""
        self.send(message.SerializeToString())
        if self.writing_paused:
            await self.drain()

    def write_now(self, message: storage_pb2.StorageResponse) -> bool:
        """Write an answer at once, when the transport takes it without a wait (write would not wait); False
        when it must go through write instead (the peer does not read, or the connection is closing)."""
        transport = self.transport
        if self.writing_paused or transport is None or transport.is_closing():
            return False
        try:
            frames.write_frame(transport, message.SerializeToString())
        except Exception:  # the connection broke meanwhile: write finds it so too, and says so
            return False
        return True

    def send(self, data: bytes) -> None:
        """Queue one frame of data on the transport (no wait). ConnectionResetError when the connection is lost."""
        transport = self.transport
        if transport is None or (self._lost is not None and self._lost.done()):
            raise ConnectionResetError("the connection was lost")
        frames.write_frame(transport, data)

    async def drain(self) -> None:
        """Until the transport's buffer is below its low-water mark (right away when writing is not paused)."""
        while self.writing_paused:
            if self._lost is None or self._lost.done():
                raise ConnectionResetError("the connection was lost")
            waiter = asyncio.get_running_loop().create_future()
            self._drained.append(waiter)
            await waiter

    async def closed(self) -> None:
        """Until the connection is lost (closed by either side)."""
        if self._lost is not None:
            await asyncio.shield(self._lost)
