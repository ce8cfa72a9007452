"""Length-prefixed protobuf frames over asyncio streams, with mutual TLS from the same PEM files as gRPC: the
framing of the storage node's Session port (storage.sessionPort; docs/operations.md, docs/security.md).

A frame is a 4-byte big-endian length and that many bytes: one serialized message. A reader bounds the
length it accepts (FrameTooLarge) and tells a clean end of stream (None) from one cut inside a frame
(FrameError). Without TLS the bytes go as they are; with TLS both sides present a certificate that chains to
tls.caFile, as on every gRPC port, and the server checks the role in the client's (tls.roles_of).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from typing import Any, Protocol

from waltz_common.tls import TlsFiles

HEADER_BYTES = 4
MAX_FRAME_LIMIT = 0xFFFF_FFFF
# Smaller frames are written as one buffer with their header; larger ones as the header and the data in one
# writelines (uvloop: one writev, no copy). Two writes cost a send of 4 bytes of their own: with TCP_NODELAY a
# segment on the wire and a wake-up of the reader for it (a 55 KB frame on loopback, uvloop: 1.5-2.2 reads of
# the reader per frame instead of 1.1-1.2, and about 20% more CPU per frame on each side; python -m bench.frame_write).
_COALESCE_BYTES = 16 * 1024
WRITE_HIGH_WATER_BYTES = 1024 * 1024
"""Bytes a writer lets the transport buffer before it waits for them to drain (writing blocks there)."""


class Writable(Protocol):
    """Where frames are written: an asyncio.StreamWriter or an asyncio.Transport."""

    def write(self, data: bytes, /) -> None: ...

    def writelines(self, data: list[bytes], /) -> None: ...


class HasExtraInfo(Protocol):
    """What the socket and the TLS peer are read from: an asyncio.StreamWriter or an asyncio.BaseTransport."""

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class FrameError(ConnectionError):
    """The stream does not hold a well-formed frame where one is due (cut inside a frame, or too large)."""


class FrameTooLarge(FrameError):
    """A frame's length prefix is above the reader's limit."""


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """The next frame's bytes; None when the stream ends cleanly between frames. FrameTooLarge when the
    length is above max_bytes (nothing more of the frame is read), FrameError when the stream ends inside one."""
    try:
        header = await reader.readexactly(HEADER_BYTES)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("the stream ended inside a frame's length prefix") from None
    size = int.from_bytes(header, "big")
    if size > max_bytes:
        raise FrameTooLarge(f"a frame of {size} bytes is above the limit of {max_bytes} bytes")
    if not size:
        return b""
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"the stream ended {len(exc.partial)} bytes into a frame of {size} bytes") from None


def write_frame(writer: Writable, data: bytes) -> None:
    """Queue one frame on writer (a StreamWriter's caller drains: drain_if_full)."""
    header = len(data).to_bytes(HEADER_BYTES, "big")
    if len(data) < _COALESCE_BYTES:
        writer.write(header + data)
    else:
        writer.writelines([header, data])


def takes_now(transport: asyncio.WriteTransport) -> bool:
    """Whether a frame written to transport now goes without a wait: it is open and holds at most
    WRITE_HIGH_WATER_BYTES unsent."""
    return not transport.is_closing() and transport.get_write_buffer_size() <= WRITE_HIGH_WATER_BYTES


async def drain_if_full(writer: asyncio.StreamWriter) -> None:
    """Wait for the transport's buffer to drain when it holds more than WRITE_HIGH_WATER_BYTES (the peer does
    not read); right away otherwise."""
    if not takes_now(writer.transport):
        await writer.drain()


def set_keepalive(writer: HasExtraInfo, idle_s: float) -> None:
    """TCP keepalive on writer's socket: probes after idle_s without traffic, every idle_s/3 then, 3 probes
    unanswered and the connection is dropped (a peer that is gone, or frozen, is detected within about 2 idle_s)."""
    import socket

    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, round(idle_s))
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", max(1, idle // 3)), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """Mutual TLS client context from the files as they are now: this component's certificate, the cluster's
    CA, and the server's name checked against its certificate as gRPC does."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca_file)
    context.load_cert_chain(files.cert_file, files.key_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class ServerContexts:
    """Mutual TLS server contexts from files, made again when a file changes (as tls.server_credentials does
    for gRPC: a rotated certificate is used from the next connection on)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp = files.stamp()
        self._context = self._make()

    def _make(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.files.ca_file)
        context.load_cert_chain(self.files.cert_file, self.files.key_file)
        context.verify_mode = ssl.CERT_REQUIRED
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def current(self) -> ssl.SSLContext:
        """The context for a new connection."""
        with self._lock:
            try:
                stamp = self.files.stamp()
                if stamp != self._stamp:
                    self._context = self._make()
                    self._stamp = stamp
            except (OSError, ssl.SSLError):  # half-written or missing during a rotation: keep the current one
                pass
            return self._context


def peer_pem(writer: HasExtraInfo) -> bytes | None:
    """The certificate the peer presented (PEM), None on a plaintext stream."""
    ssl_object = writer.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return ssl.DER_cert_to_PEM_cert(der).encode() if der else None
