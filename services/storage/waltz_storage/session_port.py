"""The storage node's framed Session port (storage.sessionPort): the WaltzStorage.Session stream's protocol (Open
first, then StorageRequest / StorageResponse) as length-prefixed frames on TCP (waltz_common.frames), served by the
same StorageConnection as the gRPC stream, under the same trust rules as the gRPC storage port.

Why: a grpc.aio stream message costs 150-250 us of CPU on each side whatever its size (two thread hops);
a frame on an asyncio stream about a third of that (bench/session_transport.py, docs/performance.md). Each
connection is a framed_connection.FramedConnection (an asyncio.Protocol that cuts the frames as they arrive
and hands the requests to its StorageConnection in data_received), whose end a task of this port awaits.

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

from waltz_common import frames, listen, tls
from waltz_common.port_guard import CallLimits
from waltz_storage import rules
from waltz_storage.errors import InvalidRequest, PermissionDenied, StorageError
from waltz_storage.framed_connection import FramedConnection
from waltz_storage.node import StorageNode
from waltz_storage.service import StorageConnection

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
"""How long a TLS handshake may take before the connection is dropped."""
KEEPALIVE_IDLE_S = 10.0
"""TCP keepalive on accepted connections: a server host gone without a reset is noticed in about twice this."""


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
            # TLS from the accept on: the loop reads at once, so a start_tls in the connection's task lost a
            # ClientHello that had come before it, and the handshake then waited for it until its timeout (the
            # quickstart with --tls: 2 of 3 nodes fell back to gRPC after 10 s).
            context = self._contexts.current()
            context.sni_callback = self._fresh_context
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: FramedConnection(self._max_frame_bytes, self._accepted),
                host, port, reuse_address=True, reuse_port=False,
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

    def _accepted(self, connection: FramedConnection) -> None:
        """A connection is up (its TLS handshake done): a task of this port serves it."""
        task = asyncio.get_running_loop().create_task(self._serve(connection))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, connection: FramedConnection) -> None:
        transport = connection.transport
        assert transport is not None
        address = transport.get_extra_info("peername")
        peer = f"framed:{listen.join(str(address[0]), int(address[1]))}" if address else "framed:?"
        try:
            frames.set_keepalive(transport, KEEPALIVE_IDLE_S)
            caller = await self._identify(connection, peer)
            if caller is not None:
                await self._converse(connection, caller, peer)
        except OSError as exc:  # the peer went away
            log.info("session port: a connection from %s ended: %s: %s", peer, type(exc).__name__, exc)
        except Exception:
            log.error("session port: a connection from %s failed unexpectedly", peer, exc_info=True)
        finally:
            transport.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.closed(), 1.0)

    async def _identify(self, connection: FramedConnection, peer: str) -> rules.Caller | None:
        """The caller (its certificate's roles under TLS); None when refused (answered and logged here)."""
        if self._contexts is None:
            return rules.PLAINTEXT
        assert connection.transport is not None
        pem = frames.peer_pem(connection.transport)
        held = tls.roles_of(pem) if pem is not None else frozenset()
        denied = tls.refusal("storage session port", self._roles, held)
        if denied is not None:
            log.warning("session port: refused %s: %s", peer, denied)
            await self._last_word(connection, PermissionDenied(denied))
            return None
        return rules.Caller.from_roles(held)

    async def _converse(self, connection: FramedConnection, caller: rules.Caller, peer: str) -> None:
        refused = self._limits.admit(peer, True)
        if refused is not None:
            log.warning("session port: refused %s: %s", peer, refused[1])
            await self._last_word(connection, PermissionDenied(refused[1]))
            return
        try:
            await StorageConnection(
                self.node, connection, caller, self.advertised_port, write_now=connection.write_now, arrivals=connection
            ).run()
        finally:
            self._limits.release(peer, True)
        if connection.bad is not None:
            self._limits.undecodable += 1
            log.warning("session port: %s (from %s): answered INVALID_REQUEST and closed", connection.bad, peer)
            await self._last_word(connection, InvalidRequest(connection.bad))

    async def _last_word(self, connection: FramedConnection, exc: StorageError) -> None:
        """A Failure (ids -1) before the connection is closed."""
        with contextlib.suppress(Exception):
            connection.send(self.node.executor.failure(None, exc).SerializeToString())
            await asyncio.wait_for(connection.drain(), 1.0)
