"""ZooKeeper metadata access: the znode layout and protobuf payload reads and writes (kazoo)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry

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


def create(zk: KazooClient, path: str, message: Message, ephemeral: bool = False) -> None:
    zk.create(path, message.SerializeToString(), makepath=True, ephemeral=ephemeral)


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
