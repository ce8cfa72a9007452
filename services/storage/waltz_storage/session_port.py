"""The storage node's framed Session port (storage.sessionPort): the WaltzStorage.Session stream's protocol (Open
first, then StorageRequest / StorageResponse) as length-prefixed frames on TCP (waltz_common.frames), served by the
same StorageConnection as the gRPC stream, under the same trust rules as the gRPC storage port.

Why: a grpc.aio stream message costs 150-250 us of CPU on each side whatever its size (two thread hops);
a frame on an asyncio stream about a third of that (bench/session_transport.py, docs/performance.md).

Trust, as on storage.port (docs/security.md): with TLS, mutual TLS with the node's certificate, the peer's
certificate must chain to tls.caFile and carry the server or operator role (else a Failure PERMISSION_DENIED and
the connection is closed), and the caller's roles come from it; without TLS the cluster key in Open is the
credential. storage.maxConnections bounds the connections (counted with storage.port's, as one more stream of
a peer). A frame above the limit or that does not decode is answered with a Failure INVALID_REQUEST naming the
problem, after the answers to the requests before it, and the connection is closed: never a crash of the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

import grpc
from google.protobuf.message import DecodeError

from waltz.v1 import storage_pb2
from waltz_common import frames, listen, tls
from waltz_common.port_guard import CallLimits
from waltz_storage import rules
from waltz_storage.errors import InvalidRequest, PermissionDenied, StorageError
from waltz_storage.node import StorageNode
from waltz_storage.service import StorageConnection

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
"""How long a TLS handshake may take before the connection is dropped."""
KEEPALIVE_IDLE_S = 10.0
"""TCP keepalive on accepted connections: a server host gone without a reset is noticed in about twice this."""
READ_BUFFER_BYTES = 1024 * 1024
"""Bytes read ahead of the requests being served; above twice this the node stops reading (back-pressure)."""


class FramedStream:
    """One framed connection as StorageConnection reads and writes it (what it uses of a gRPC context).

    A bad frame ends the requests (read answers EOF) and is kept in ``bad`` for the last answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_bytes: int) -> None:
        self._reader = reader
        self._writer = writer
        self._max_frame_bytes = max_frame_bytes
        self.bad: str | None = None

    async def read(self) -> storage_pb2.StorageRequest | object:
        if self.bad is not None:
            return grpc.aio.EOF
        try:
            data = await frames.read_frame(self._reader, self._max_frame_bytes)
        except frames.FrameTooLarge as exc:
            self.bad = f"{exc} (2 x storage.maxBatchBytes + 1 MiB)"
            return grpc.aio.EOF
        except frames.FrameError as exc:
            self.bad = str(exc)
            return grpc.aio.EOF
        except OSError:  # reset by the peer: the end of its requests
            return grpc.aio.EOF
        if data is None:
            return grpc.aio.EOF
        try:
            return storage_pb2.StorageRequest.FromString(data)
        except DecodeError:
            self.bad = f"a frame of {len(data)} bytes is not a valid waltz.v1.StorageRequest: its bytes do not decode"
            return grpc.aio.EOF

    def backlog(self) -> bool:
        """Whether bytes of a later request are read already (it arrived while the node served this one)."""
        return bool(self._reader._buffer)  # type: ignore[attr-defined]  # asyncio.StreamReader's read-ahead

    async def write(self, message: storage_pb2.StorageResponse) -> None:
        frames.write_frame(self._writer, message.SerializeToString())
        await frames.drain_if_full(self._writer)

    def write_now(self, message: storage_pb2.StorageResponse) -> bool:
        """Write an answer at once, when the transport takes it without a wait (write would not drain); False
        when it must go through write instead (the peer does not read, or the connection is closing)."""
        transport = self._writer.transport
        if transport.is_closing() or transport.get_write_buffer_size() > frames.WRITE_HIGH_WATER_BYTES:
            return False
        try:
            frames.write_frame(self._writer, message.SerializeToString())
        except Exception:  # the connection broke meanwhile: write finds it so too, and says so
            return False
        return True


class SessionPort:
    """The listener of storage.sessionPort and its connections (each served by a StorageConnection)."""

    def __init__(
        self,
        node: StorageNode,
        files: tls.TlsFiles | None,
        roles: tuple[str, ...],
        limits: CallLimits,
        max_frame_bytes: int,
    ) -> None:
        self.node = node
        self._contexts = frames.ServerContexts(files) if files is not None else None
        self._roles = roles
        self._limits = limits
        self._max_frame_bytes = max_frame_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0
        self.advertised_port = 0

    async def start(self, host: str, port: int, advertised_port: int = 0) -> int:
        """Listen on host:port (0: a free port); the port to advertise (advertised_port, or the bound port when
        that is 0), or listen.ListenError."""
        context: ssl.SSLContext | None = None
        if self._contexts is not None:
            # TLS from the accept on: asyncio's start_server reads at once, so a StreamWriter.start_tls in the
            # connection's task lost a ClientHello that had come before it, and the handshake then waited for it
            # until its timeout (the quickstart with --tls: 2 of 3 nodes fell back to gRPC after 10 s).
            context = self._contexts.current()
            context.sni_callback = self._fresh_context
        try:
            self._server = await asyncio.start_server(
                self._serve, host, port, limit=READ_BUFFER_BYTES, reuse_address=True, reuse_port=False,
                ssl=context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if context is not None else None,
            )
        except OSError as exc:
            raise listen.failure(host, port, "session port", listen.reason(exc)) from None
        self.port = self._server.sockets[0].getsockname()[1]
        self.advertised_port = advertised_port or self.port
        return self.advertised_port

    async def stop(self, grace: float) -> None:
        """Stop accepting; connections end as the node stops reading (begin_shutdown), within grace seconds."""
        if self._server is not None:
            self._server.close()
        if self._connections:
            _, late = await asyncio.wait(list(self._connections), timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)

    def _fresh_context(self, connection: ssl.SSLObject, _server_name: str | None, context: ssl.SSLContext) -> None:
        """Each ClientHello (with or without a server name): the handshake goes on with the context of the files
        as they are now, so a rotated certificate or CA is used from the next connection on, as on gRPC ports."""
        assert self._contexts is not None
        current = self._contexts.current()
        if current is not context:
            connection.context = current

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        address = writer.get_extra_info("peername")
        peer = f"framed:{listen.join(str(address[0]), int(address[1]))}" if address else "framed:?"
        try:
            frames.set_keepalive(writer, KEEPALIVE_IDLE_S)
            caller = await self._identify(writer, peer)
            if caller is not None:
                await self._converse(reader, writer, caller, peer)
        except OSError as exc:  # the peer went away, or its TLS handshake failed (ssl.SSLError is one)
            log.info("session port: a connection from %s ended: %s: %s", peer, type(exc).__name__, exc)
        except Exception:
            log.error("session port: a connection from %s failed unexpectedly", peer, exc_info=True)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _identify(self, writer: asyncio.StreamWriter, peer: str) -> rules.Caller | None:
        """The caller (its certificate's roles under TLS); None when refused (answered and logged here)."""
        if self._contexts is None:
            return rules.PLAINTEXT
        pem = frames.peer_pem(writer)
        held = tls.roles_of(pem) if pem is not None else frozenset()
        denied = tls.refusal("storage session port", self._roles, held)
        if denied is not None:
            log.warning("session port: refused %s: %s", peer, denied)
            await self._last_word(writer, PermissionDenied(denied))
            return None
        return rules.Caller.from_roles(held)

    async def _converse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, caller: rules.Caller, peer: str
    ) -> None:
        refused = self._limits.admit(peer, True)
        if refused is not None:
            log.warning("session port: refused %s: %s", peer, refused[1])
            await self._last_word(writer, PermissionDenied(refused[1]))
            return
        try:
            stream = FramedStream(reader, writer, self._max_frame_bytes)
            await StorageConnection(
                self.node, stream, caller, self.advertised_port, stream.backlog, stream.write_now
            ).run()
        finally:
            self._limits.release(peer, True)
        if stream.bad is not None:
            self._limits.undecodable += 1
            log.warning("session port: %s (from %s): answered INVALID_REQUEST and closed", stream.bad, peer)
            await self._last_word(writer, InvalidRequest(stream.bad))

    async def _last_word(self, writer: asyncio.StreamWriter, exc: StorageError) -> None:
        """A Failure (ids -1) before the connection is closed."""
        frames.write_frame(writer, self.node.executor.failure(None, exc).SerializeToString())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.drain(), 1.0)

