"""A WaltzServerService over FakeStores on a loopback port, and a client Stream to talk to it."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc

from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_common import tls
from waltz_server.ownership import PartitionManager
from waltz_server.service import WaltzServerService, start_grpc_server

from .fakes import FakeStore
from .harness import SMALL


@dataclass
class Served:
    manager: PartitionManager
    stores: dict[int, FakeStore]
    stub: server_pb2_grpc.WaltzServerStub
    health: object
    port: int
    channel: grpc.aio.Channel
    streams: list = field(default_factory=list)

    extra_channels: list = field(default_factory=list)
    service: WaltzServerService | None = None

    def open_stream(self, stub: server_pb2_grpc.WaltzServerStub | None = None) -> ClientStreamHandle:
        handle = ClientStreamHandle((stub or self.stub).Stream())
        self.streams.append(handle)
        return handle

    def stub_as(self, files: tls.TlsFiles) -> server_pb2_grpc.WaltzServerStub:
        """A stub on a channel of its own that presents files' certificate (a served(tls_files=...) server)."""
        channel = tls.aio_channel(f"127.0.0.1:{self.port}", files)
        self.extra_channels.append(channel)
        return server_pb2_grpc.WaltzServerStub(channel)


class ClientStreamHandle:
    """The client end of one Stream: send ClientMessages, collect ServerMessages."""

    def __init__(self, call) -> None:
        self.call = call
        self.received: list[server_pb2.ServerMessage] = []

    async def send(self, **message) -> None:
        await self.call.write(server_pb2.ClientMessage(**message))

    async def receive_until(self, predicate, timeout: float = 20.0) -> list[server_pb2.ServerMessage]:
        async def loop() -> None:
            while not predicate(self):
                message = await self.call.read()
                if message is grpc.aio.EOF:
                    raise EOFError("the server ended the stream")
                self.received.append(message)

        await asyncio.wait_for(loop(), timeout)
        return self.received

    def of(self, kind: str) -> list:
        return [getattr(m, kind) for m in self.received if m.WhichOneof("message") == kind]

    def fed(self) -> list[tuple[int, int]]:
        return [(f.transaction_id, f.req_id.seq_num) for b in self.of("feed") for f in b.transactions]


@asynccontextmanager
async def served(
    owned=(0, 1),
    num_partitions: int = 4,
    generation: int = 1,
    settings=SMALL,
    connectivity=None,
    tls_files: tls.TlsFiles | None = None,
    identities=None,
    limits=None,
    client_files: tls.TlsFiles | None = None,
):
    """tls_files: the server's certificate (mutual TLS; the default stub then presents client_files, or the
    server's own, use stub_as for another); identities: the service's ClientIdentities; limits: its CallLimits."""
    stores: dict[int, FakeStore] = {}

    def factory(pid: int) -> FakeStore:
        stores[pid] = FakeStore(pid)
        return stores[pid]

    manager = PartitionManager(num_partitions, factory, settings)
    await manager.apply({pid: generation for pid in owned})
    for partition in manager.all():
        await partition.wait_ready(10)
    service = WaltzServerService(manager, lambda: 7, settings, connectivity=connectivity, identities=identities)
    server, port, health = await start_grpc_server(service, "127.0.0.1", 0, files=tls_files, limits=limits)
    channel = tls.aio_channel(f"127.0.0.1:{port}", client_files or tls_files)
    result = Served(manager, stores, server_pb2_grpc.WaltzServerStub(channel), health, port, channel, service=service)
    try:
        yield result
    finally:
        for extra in result.extra_channels:
            await extra.close()
        await channel.close()
        await server.stop(0)
        await manager.close_all()
