"""The server's end of a storage node's framed Session port (storage.sessionPort on the node): the Session
stream's StorageRequest / StorageResponse messages as length-prefixed frames on TCP (waltz_common.frames),
with the same mutual TLS identity as the gRPC channels (tls.process_files).

A node advertises the port in its answer to Open on the gRPC stream; StorageConnection then opens this one,
and keeps the gRPC stream when it cannot (docs/operations.md, "The framed session port"). Liveness: TCP
keepalive finds a host that is gone, and while no answer arrives for storage.keepaliveTime the connection
sends a ping (an Open, answered by the node's event loop right away), and gives up when the ping is not
answered within as long again: a frozen node is noticed while idle too, as gRPC's HTTP/2 pings did.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from waltz.v1 import storage_pb2
from waltz_common import frames, tls

READ_BUFFER_BYTES = 1024 * 1024


def _parse(data: memoryview) -> storage_pb2.StorageResponse:
    """An answer parsed where its bytes lie (protobuf's parser takes any buffer; its stubs say bytes)."""
    return storage_pb2.StorageResponse.FromString(data)  # type: ignore[arg-type]


class FramedCall:
    """One framed Session connection, written and read as StorageConnection does a gRPC stream call."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._buffer = bytearray()  # what was read and not yet returned as answers
        self._loop = asyncio.get_running_loop()
        self.last_read = self._loop.time()
        """When the last answer arrived (the keepalive pings after storage.keepaliveTime without one)."""

    async def write(self, data: bytes) -> None:
        frames.write_frame(self._writer, data)
        await frames.drain_if_full(self._writer)

    def write_now(self, data: bytes) -> bool:
        """Write data's frame at once when the transport takes it without waiting (open, and holding at most
        frames.WRITE_HIGH_WATER_BYTES unsent); False, with nothing written, when it would have to wait."""
        if not frames.takes_now(self._writer.transport):
            return False
        frames.write_frame(self._writer, data)
        return True

    async def read(self) -> storage_pb2.StorageResponse | object:
        """The next answer, or grpc.aio.EOF when the node closed the connection between frames
        (frames.FrameError when it closed it inside one).

        Reads what the connection holds, up to READ_BUFFER_BYTES at a time, and cuts the frames out of it here:
        one read per answer (or fewer, when answers arrive together) where frames.read_frame takes two."""
        buffer = self._buffer
        while True:
            if len(buffer) >= frames.HEADER_BYTES:
                end = frames.HEADER_BYTES + int.from_bytes(buffer[: frames.HEADER_BYTES], "big")
                if len(buffer) >= end:
                    with memoryview(buffer) as view:
                        answer = _parse(view[frames.HEADER_BYTES : end])
                    del buffer[:end]
                    self.last_read = self._loop.time()
                    return answer
            data = await self._reader.read(READ_BUFFER_BYTES)
            if not data:
                if buffer:
                    raise frames.FrameError(f"the stream ended inside a frame ({len(buffer)} bytes of it read)")
                return grpc.aio.EOF
            if not buffer and len(data) == frames.HEADER_BYTES + int.from_bytes(data[: frames.HEADER_BYTES], "big"):
                self.last_read = self._loop.time()  # the common case, one whole answer: parsed where it lies
                return _parse(memoryview(data)[frames.HEADER_BYTES :])
            buffer += data

    def silent_for(self) -> float:
        return self._loop.time() - self.last_read

    def cancel(self) -> None:
        """Drop the connection now (what is unsent is lost: the requests' outcome is unknown)."""
        self._writer.transport.abort()

    async def close(self) -> None:
        self.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)


async def open_framed(host: str, port: int, files: tls.TlsFiles | None, keepalive_s: float) -> FramedCall:
    """Connect to host:port (mutual TLS with files, the node's name checked against its certificate);
    OSError (ssl.SSLError included) when it cannot. The caller bounds the time."""
    context = frames.client_context(files) if files is not None else None
    reader, writer = await asyncio.open_connection(
        host.strip("[]"), port, ssl=context, server_hostname=host.strip("[]") if context else None,
        limit=READ_BUFFER_BYTES,
    )
    frames.set_keepalive(writer, keepalive_s * 2)
    return FramedCall(reader, writer)
