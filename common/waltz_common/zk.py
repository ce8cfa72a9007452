"""ZooKeeper metadata access: the znode layout and protobuf payload reads and writes (kazoo)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import ACL

from waltz.v1 import metadata_pb2
from waltz_common.zk_security import ZkSecurity

M = TypeVar("M", bound=Message)

UNRESOLVED = -(2**63)
"""ReplicaState.closing_high_water_mark while the session is open (Java's Long.MIN_VALUE)."""


class MetadataError(RuntimeError):
    """ZooKeeper does not hold what Waltz expects (missing cluster, corrupt payload, ...)."""


@dataclass(frozen=True)
class ZkPaths:
    """Where each piece of cluster metadata lives, relative to `cluster.root`."""

    root: str

    def __post_init__(self) -> None:
        if not self.root.startswith("/") or (len(self.root) > 1 and self.root.endswith("/")):
            raise MetadataError(f"cluster.root must be an absolute znode path without a trailing /: {self.root!r}")

    @property
    def cluster(self) -> str:
        return self.root

    @property
    def store(self) -> str:
        return f"{self.root}/store"

    @property
    def store_partitions(self) -> str:
        return f"{self.root}/store/partition"

    def partition_metadata(self, partition_id: int) -> str:
        return f"{self.root}/store/partition/{partition_id}"

    @property
    def replica_assignments(self) -> str:
        return f"{self.root}/store/assignment"

    @property
    def group_descriptor(self) -> str:
        return f"{self.root}/store/group"

    @property
    def connection_metadata(self) -> str:
        return f"{self.root}/store/connection"

    @property
    def servers(self) -> str:
        return f"{self.root}/servers"

    def server(self, server_id: int) -> str:
        return f"{self.root}/servers/{server_id}"

    @property
    def server_assignment(self) -> str:
        return f"{self.root}/partitions"

    @property
    def client_ids(self) -> str:
        return f"{self.root}/ids/client"

    @property
    def server_ids(self) -> str:
        return f"{self.root}/ids/server"

    @property
    def client_bindings(self) -> str:
        return f"{self.root}/ids/binding"

    def client_binding(self, client_id: int) -> str:
        """Who may use a client id under mutual TLS (a ClientIdentity, written once)."""
        return f"{self.root}/ids/binding/{client_id}"

    def every_znode(self, num_partitions: int) -> list[str]:
        """Every persistent znode of a cluster, parents first: what `waltz cluster create` makes, with the
        cluster's ACL. Nothing else is created later but the servers' registrations (ephemeral, under
        servers) and the client id bindings (under ids/binding), which take the ACL of their parent."""
        return [
            self.cluster,
            self.store,
            self.store_partitions,
            *(self.partition_metadata(pid) for pid in range(num_partitions)),
            self.replica_assignments,
            self.group_descriptor,
            self.connection_metadata,
            self.servers,
            self.server_assignment,
            f"{self.root}/ids",
            self.client_ids,
            self.server_ids,
            self.client_bindings,
        ]


RECONNECT_MAX_DELAY_S = 1.0
"""The longest wait between two attempts to reach ZooKeeper once the connection is lost. kazoo's default doubles
from 0.1 s up to an hour: after an outage of 30 s, a client came back up to 20 s after ZooKeeper did."""


CONNECT_ANSWER_TIMEOUT_S = 2.0
"""The longest wait for ZooKeeper's answer to a connect (or auth) request before the connection is given up and
tried again. kazoo waits the session timeout divided by the number of hosts: 30 s with one. A ZooKeeper 3.8 that
is starting may accept a connection and never answer or close it (its close fails while its database is not
loaded yet); a client that reconnected at that moment waited out its session, which expired meanwhile."""


class _ConnectionHandler(ConnectionHandler):
    """kazoo's own, with its wait for the answer to a connect bounded by CONNECT_ANSWER_TIMEOUT_S (kazoo calls
    _invoke only while establishing a connection)."""

    def _invoke(self, timeout: float, request: Any, xid: int | None = None) -> Any:
        return super()._invoke(min(timeout, CONNECT_ANSWER_TIMEOUT_S), request, xid)


def connect(
    connect_string: str, timeout_s: float = 10.0, session_timeout_s: float = 30.0, security: ZkSecurity | None = None
) -> KazooClient:
    """A started kazoo client (with ZooKeeper TLS, auth and ACLs when security says so), or MetadataError naming
    the address when ZooKeeper is unreachable."""
    extra = security.kazoo_args() if security is not None else {}
    retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=RECONNECT_MAX_DELAY_S)
    client = KazooClient(hosts=connect_string, timeout=session_timeout_s, connection_retry=retry, **extra)
    if type(client._connection) is not ConnectionHandler:
        raise RuntimeError(f"kazoo's connection handler is a {type(client._connection)}: see CONNECT_ANSWER_TIMEOUT_S")
    client._connection.__class__ = _ConnectionHandler  # the same object and state, with the bounded wait
    try:
        client.start(timeout=timeout_s)
    except Exception as exc:  # kazoo raises its own timeout type; one clear message for all
        client.close()
        raise MetadataError(f"cannot reach ZooKeeper at {connect_string} within {timeout_s:g} s: {exc}") from None
    return client


def read(zk: KazooClient, path: str, cls: type[M]) -> tuple[M, ZnodeStat] | None:
    """The payload at path parsed as cls with its stat, or None when the znode does not exist."""
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return None
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise MetadataError(f"znode {path} does not hold a valid {cls.__name__}: {exc}") from None
    return message, stat


def require(zk: KazooClient, path: str, cls: type[M]) -> tuple[M, ZnodeStat]:
    """Like read, but a missing znode is a MetadataError that says what is missing."""
    found = read(zk, path, cls)
    if found is None:
        raise MetadataError(f"znode {path} ({cls.__name__}) does not exist: has the cluster been created?")
    return found


def write(zk: KazooClient, path: str, message: Message, version: int = -1) -> ZnodeStat:
    """Set path to message; version >= 0 makes it a compare-and-set (BadVersionError on mismatch)."""
    return zk.set(path, message.SerializeToString(), version=version)


def acl_for(zk: KazooClient, path: str) -> list[ACL] | None:
    """The ACL of a znode this process creates at path: its own (zookeeper.acl) when it has one, else that of
    the nearest existing ancestor, so that nothing created after `waltz cluster create` is more open than the
    cluster (kazoo's default would open it to the world). None (world-open) only when no ancestor has an ACL."""
    if zk.default_acl:
        return list(zk.default_acl)
    parent = path
    while parent not in ("", "/"):
        parent = parent.rsplit("/", 1)[0]
        try:
            acl, _ = zk.get_acls(parent or "/")
        except NoNodeError:
            continue
        return list(acl)
    return None


def create(zk: KazooClient, path: str, message: Message | bytes, ephemeral: bool = False) -> None:
    """Create path (and any missing parent) with acl_for's ACL; NodeExistsError when it exists."""
    data = message if isinstance(message, bytes) else message.SerializeToString()
    zk.create(path, data, acl=acl_for(zk, path), makepath=True, ephemeral=ephemeral)


def counter(zk: KazooClient, path: str) -> int:
    """The value of the counter at path (see increment); 0 when it does not exist."""
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        return 0
    return _counter_value(path, data)


def _counter_value(path: str, data: bytes) -> int:
    try:
        return int(data.decode("ascii") or "0")
    except (UnicodeDecodeError, ValueError):
        raise MetadataError(f"counter {path} holds {data[:40]!r}, not a number") from None


def increment(zk: KazooClient, path: str, retries: int = 1000) -> int:
    """Add one to the counter at path and return the new value (compare-and-set, retried on a concurrent change).

    The value is ASCII decimal, empty meaning 0: kazoo's Counter format, so counters written by earlier versions
    go on. `waltz cluster create` makes the counters with the cluster's ACL; one missing (a cluster created by an
    earlier version) is created with its parent's ACL, never open to the world by the first process that asks."""
    for _ in range(retries):
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                create(zk, path, b"0")
            continue
        value = _counter_value(path, data) + 1
        try:
            zk.set(path, str(value).encode("ascii"), version=stat.version)
        except BadVersionError:
            continue
        return value
    raise MetadataError(f"could not increment {path}: {retries} concurrent changes in a row")


def update(zk: KazooClient, path: str, cls: type[M], change: Callable[[M], M | None], retries: int = 100) -> M:
    """Read-modify-write with compare-and-set, retried on concurrent change.

    change gets a copy of the current payload (a fresh one when the znode is missing) and returns
    the new payload, or None to leave it unchanged. Returns the payload in force afterwards.
    """
    for _ in range(retries):
        found = read(zk, path, cls)
        current = found[0] if found else cls()
        proposed = cls()
        proposed.CopyFrom(current)
        result = change(proposed)
        if result is None:
            return current
        try:
            if found is None:
                create(zk, path, result)
            else:
                write(zk, path, result, version=found[1].version)
            return result
        except (BadVersionError, NodeExistsError):
            continue
    raise MetadataError(f"could not update {path}: {retries} concurrent changes in a row")


def store_params(zk: KazooClient, paths: ZkPaths) -> metadata_pb2.StoreParams:
    return require(zk, paths.store, metadata_pb2.StoreParams)[0]
