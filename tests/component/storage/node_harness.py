"""A storage node served from a background thread, and an asyncio client of its Session stream, for tests."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc

from waltz.v1 import common_pb2, storage_pb2, storage_pb2_grpc
from waltz_common import frames, tls
from waltz_common.port_guard import LimitSettings
from waltz_common.tls import TlsFiles
from waltz_common.types import crc32
from waltz_storage import server
from waltz_storage.dispatch import Limits
from waltz_storage.node import StorageNode

KEY = uuid.UUID("5e1f0c2a-7b3d-4e8f-9a0b-1c2d3e4f5a6b")
T = TypeVar("T")


class NodeThread:
    """An in-process storage node on loopback ports, with its own event loop thread."""

    def __init__(
        self,
        directory: Path,
        num_partitions: int = 3,
        *,
        key: uuid.UUID = KEY,
        max_record_bytes: int = 1024 * 1024,
        max_batch_bytes: int = 4 * 1024 * 1024,
        segment_size_threshold: int = 1_000_000_000,
        limit_settings: LimitSettings | None = None,
        tls_dir: Path | None = None,
        framed: bool = False,
    ) -> None:
        self.directory = directory
        self.framed = framed  # session_client() speaks to the framed session port instead of the gRPC stream
        self._limit_settings = limit_settings
        self.tls_dir = tls_dir  # mutual TLS with waltz-dev-certs files written there (devcerts.write)
        self.key = key
        self.num_partitions = num_partitions
        self._args = (Limits(max_record_bytes, max_batch_bytes), segment_size_threshold)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: server.NodeServers | None = None

    @property
    def servers(self) -> server.NodeServers:
        assert self._servers is not None
        return self._servers

    @property
    def node(self) -> StorageNode:
        return self.servers.node

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.servers.storage_port}"

    @property
    def session_address(self) -> str:
        """The framed session port (storage.sessionPort)."""
        assert self.servers.session is not None
        return f"127.0.0.1:{self.servers.session.port}"

    def session_client(self, session_id: int = 1, role: str = "server") -> SessionClient:
        """A Session stream of a caller with role's certificate (under TLS), over the transport of self.framed."""
        address = self.session_address if self.framed else self.address
        return SessionClient(address, session_id, self.tls_files(role), framed=self.framed)

    def tls_files(self, role: str) -> TlsFiles | None:
        """A role's development certificate files; None without TLS."""
        if self.tls_dir is None:
            return None
        d = self.tls_dir
        return TlsFiles(str(d / f"{role}.pem"), str(d / f"{role}-key.pem"), str(d / "ca.pem"))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        limits, threshold = self._args
        node = StorageNode.open(
            self.directory, self.key, self.num_partitions, limits=limits, segment_size_threshold=threshold
        )
        self._servers = await server.start(
            node, "127.0.0.1", 0, 0, self.tls_files("storage"), limit_settings=self._limit_settings, session_port=0
        )

    def start(self) -> NodeThread:
        self._thread.start()
        try:
            self.call(self._start())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def stop(self, grace: float = 5) -> None:
        if self._servers is not None:
            self.call(self._servers.stop(grace))
            self._servers = None
        self._stop_loop()

    def __enter__(self) -> NodeThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class BlockedPartition:
    """Inside a coroutine on the node's loop: holds a partition's thread busy (as a long operation would)
    from entry until exit."""

    def __init__(self, node: NodeThread, partition_id: int) -> None:
        self._node = node
        self._partition_id = partition_id
        self._release = threading.Event()
        self._held: asyncio.Future[Any] | None = None

    async def __aenter__(self) -> BlockedPartition:
        self._held = asyncio.ensure_future(self._node.node.run(self._partition_id, self._release.wait, 60))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        assert self._held is not None
        await self._held


def record(txn: int, size: int = 16, client_id: int = 7) -> common_pb2.Record:
    data = bytes((txn * 31 + i) % 256 for i in range(size))
    return common_pb2.Record(
        transaction_id=txn,
        req_id=common_pb2.ReqId(client_id=client_id, generation=1, partition_id=0, seq_num=txn),
        header=txn % 9,
        data_length=len(data),
        data=data,
        checksum=crc32(data),
    )


def records(start: int, n: int, size: int = 16) -> list[common_pb2.Record]:
    return [record(t, size) for t in range(start, start + n)]


class FramedCall:
    """A framed session port connection used as a gRPC Session call (write, read, done_writing, cancel)."""

    def __init__(self, address: str, tls_files: TlsFiles | None) -> None:
        self._host, _, port = address.rpartition(":")
        self._port = int(port)
        self._context = frames.client_context(tls_files) if tls_files is not None else None
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def _connected(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self._host, self._port, ssl=self._context)
        return self._streams

    async def write_bytes(self, data: bytes) -> None:
        """data as it is (no frame header added)."""
        _, writer = await self._connected()
        writer.write(data)
        await writer.drain()

    async def write(self, request: storage_pb2.StorageRequest) -> None:
        _, writer = await self._connected()
        frames.write_frame(writer, request.SerializeToString())
        await writer.drain()

    async def read(self) -> Any:
        reader, _ = await self._connected()
        data = await frames.read_frame(reader, 1 << 30)
        return grpc.aio.EOF if data is None else storage_pb2.StorageResponse.FromString(data)

    async def done_writing(self) -> None:
        _, writer = await self._connected()
        writer.write_eof()

    def cancel(self) -> None:
        if self._streams is not None:
            self._streams[1].transport.abort()


class _NoChannel:
    async def close(self) -> None:
        pass


class SessionClient:
    """One Session stream; requests get increasing sequence numbers, answers are read in order of arrival.
    framed: over the node's framed session port at address (storage.sessionPort), not a gRPC stream."""

    def __init__(
        self, address: str, session_id: int = 1, tls_files: TlsFiles | None = None, framed: bool = False
    ) -> None:
        self.session_id = session_id
        options = [("grpc.max_receive_message_length", -1)]
        self._channel: Any
        self._call: Any
        if framed:
            self._channel, self._call = _NoChannel(), FramedCall(address, tls_files)
            self._seq = 0
            return
        self._channel = (
            grpc.aio.insecure_channel(address, options=options)
            if tls_files is None
            else grpc.aio.secure_channel(address, tls.channel_credentials(tls_files), options=options)
        )
        self._call = storage_pb2_grpc.WaltzStorageStub(self._channel).Session()
        self._seq = 0

    async def send(self, kind: str, **fields: Any) -> int:
        """Send one request; fills session_id, seq_num and partition_id (0) unless given; returns seq_num."""
        cls = type(getattr(storage_pb2.StorageRequest(), kind))
        self._seq += 1
        fields.setdefault("seq_num", self._seq)
        if kind != "open":
            fields.setdefault("session_id", self.session_id)
            fields.setdefault("partition_id", 0)
        await self._call.write(storage_pb2.StorageRequest(**{kind: cls(**fields)}))
        return int(fields["seq_num"])

    async def write_raw(self, request: storage_pb2.StorageRequest) -> None:
        await self._call.write(request)

    async def write_bytes(self, data: bytes) -> None:
        """Bytes as they are, on a framed stream (frames made by the caller)."""
        assert isinstance(self._call, FramedCall), "only a framed stream takes bytes"
        await self._call.write_bytes(data)

    async def recv(self, timeout: float = 30) -> storage_pb2.StorageResponse:
        response = await asyncio.wait_for(self._call.read(), timeout)
        assert response is not grpc.aio.EOF, "the stream ended"
        return response

    async def ask(self, kind: str, **fields: Any) -> tuple[str, Any]:
        """Send one request and return (kind, message) of its answer."""
        await self.send(kind, **fields)
        response = await self.recv()
        which = response.WhichOneof("response")
        return which, getattr(response, which)

    async def open(self, key: uuid.UUID = KEY, num_partitions: int = 3) -> tuple[str, Any]:
        return await self.ask(
            "open", session_id=-1, seq_num=-1, partition_id=-1, cluster_key=str(key), num_partitions=num_partitions
        )

    async def append(self, partition_id: int, recs: list[common_pb2.Record], **fields: Any) -> tuple[str, Any]:
        fields.setdefault("record_list_length", len(recs))
        return await self.ask("append", partition_id=partition_id, records=recs, **fields)

    async def close(self) -> None:
        await self._call.done_writing()
        await self._channel.close()

    async def __aenter__(self) -> SessionClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._call.cancel()
        await self._channel.close()


def run(coro: Awaitable[T], timeout: float = 120) -> T:
    """Run a test's client coroutine to completion in a fresh event loop."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def assert_failure(answer, code, match: str = "") -> None:
    kind, msg = answer
    assert kind == "failure", f"expected a failure, got {kind}: {msg}"
    assert msg.exception.code == code, msg.exception
    assert match in msg.exception.message
    assert msg.exception.stack_trace_length == len(msg.exception.stack_trace) == 0  # no frames to the caller
