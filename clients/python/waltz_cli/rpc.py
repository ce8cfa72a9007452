"""gRPC access for commands: live servers from ZooKeeper, server stubs, storage admin clients."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from kazoo.exceptions import NoNodeError

from waltz.v1 import metadata_pb2, server_pb2, server_pb2_grpc
from waltz_cli.context import Context
from waltz_cli.errors import CliError, rpc_message
from waltz_common import tls
from waltz_common import zk as zkmeta

if TYPE_CHECKING:
    from waltz_storage.admin_client import StorageAdminClient

R = TypeVar("R")


def servers(ctx: Context) -> dict[int, metadata_pb2.ServerDescriptor]:
    """The live servers registered in ZooKeeper, by server id."""
    try:
        children = ctx.zk.get_children(ctx.paths.servers)
    except NoNodeError:
        return {}
    found: dict[int, metadata_pb2.ServerDescriptor] = {}
    for child in children:
        read = zkmeta.read(ctx.zk, f"{ctx.paths.servers}/{child}", metadata_pb2.ServerDescriptor)
        if read is not None:
            found[read[0].server_id] = read[0]
    return found


def address(server: metadata_pb2.ServerDescriptor) -> str:
    return f"{server.host}:{server.port}"


def ownership(ctx: Context) -> dict[int, metadata_pb2.PartitionOwnership]:
    """Partition id -> its owner and generation, as the coordinator wrote them in ZooKeeper."""
    read = zkmeta.read(ctx.zk, ctx.paths.server_assignment, metadata_pb2.ServerAssignment)
    if read is None:
        return {}
    return {p.partition_id: p for p in read[0].partitions}


def owner_address(ctx: Context, partition_id: int) -> str:
    """host:port of the live server that owns the partition, or a CliError saying why there is none."""
    if ctx.servers:
        owners = {p.partition_id: p.address for p in ctx.cluster_info().partitions}
        if not owners.get(partition_id):
            raise CliError(f"partition {partition_id} has no owning server (the servers' cluster info)")
        return owners[partition_id]
    owner = ownership(ctx).get(partition_id)
    if owner is None or owner.server_id < 0:
        raise CliError(f"partition {partition_id} has no owning server in ZooKeeper (is a server running?)")
    live = servers(ctx)
    if owner.server_id not in live:
        raise CliError(f"partition {partition_id} is owned by server {owner.server_id}, which is not registered")
    return address(live[owner.server_id])


@contextmanager
def server_stub(ctx: Context, target: str) -> Iterator[server_pb2_grpc.WaltzServerStub]:
    """A WaltzServer stub on a fresh channel (TLS with the CLI's certificate when configured), closed afterwards."""
    channel = tls.channel(target, ctx.tls)
    try:
        yield server_pb2_grpc.WaltzServerStub(channel)
    finally:
        channel.close()


def server_call(ctx: Context, target: str, what: str, method: str, request: Any) -> Any:
    """One unary WaltzServer call on a fresh channel; a failure is one CliError line naming what."""
    with server_stub(ctx, target) as stub:
        return call(what, getattr(stub, method), request, timeout=ctx.rpc_timeout_s)


def high_water_mark(ctx: Context, pid: int) -> int:
    """The committed high-water mark of one partition, from its owning server."""
    target = owner_address(ctx, pid)
    request = server_pb2.HighWaterMarkRequest(partition_id=pid)
    reply = server_call(ctx, target, f"server {target} (partition {pid})", "GetHighWaterMark", request)
    return int(reply.high_water_mark)


def call(what: str, fn: Callable[..., R], *args: object, **kwargs: object) -> R:
    """Run a gRPC call; a failure becomes one CliError line naming what was called."""
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as exc:
        raise CliError(rpc_message(exc, what)) from None


def _check_listening(host: str, port: int, where: str, timeout_s: float) -> None:
    """Fail at once, with a clear line, when nothing listens (gRPC would retry until the timeout)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except ConnectionRefusedError:
        raise CliError(f"{where}: nothing listens on its admin port {host}:{port} (is the node running?)") from None
    except OSError as exc:
        raise CliError(f"{where}: cannot connect to its admin port {host}:{port}: {exc}") from None


class NamedAdmin:
    """Forwards calls to a StorageAdminClient; each failure becomes a CliError naming this node."""

    def __init__(self, client: StorageAdminClient, where: str) -> None:
        self._client = client
        self._where = where

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        def named(*args: Any, **kwargs: Any) -> Any:
            return _admin_call(self._where, method, *args, **kwargs)

        return named


def _admin_call(where: str, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    from waltz_storage.admin_client import StorageAdminError

    try:
        return fn(*args, **kwargs)
    except StorageAdminError as exc:
        raise CliError(f"{where}: {exc}") from None
    except grpc.RpcError as exc:
        raise CliError(rpc_message(exc, where)) from None


@contextmanager
def storage_admin(ctx: Context, node: str) -> Iterator[Any]:
    """An open admin client (a NamedAdmin) for a registered storage node; its failures name the node."""
    from waltz_storage.admin_client import StorageAdminClient

    port = ctx.admin_port(node)
    host = node.rpartition(":")[0]
    params = ctx.store_params()
    where = f"storage node {node}"
    _check_listening(host, port, where, ctx.rpc_timeout_s)
    client = _admin_call(
        where,
        StorageAdminClient,
        host,
        port,
        params.cluster_key,
        params.num_partitions,
        ctx.rpc_timeout_s,
        tls_files=ctx.tls,
    )
    try:
        yield NamedAdmin(client, where)
    finally:
        client.close()
