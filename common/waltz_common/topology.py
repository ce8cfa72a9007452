"""Who owns each partition, as ZooKeeper says: a watcher of the assignment and the servers, and client ids.

Used by the servers (to answer GetClusterInfo and GetClientId) and by clients that still read ZooKeeper. Imports
nothing of kazoo until it is used: clients of client.servers import Ownership and Topology from here without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from waltz.v1 import metadata_pb2
from waltz_common.types import INT32_MAX

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from waltz_common import zk as zkmeta


@dataclass(frozen=True, slots=True)
class Ownership:
    """Who serves a partition: an endpoint ("host:port"; None while unowned) and a generation."""

    endpoint: str | None
    generation: int


Topology = Mapping[int, Ownership]
"""partition id -> Ownership, as last seen."""


def take_client_id(zk: KazooClient, paths: zkmeta.ZkPaths) -> int:
    """A new cluster-unique client id from the counter at <root>/ids/client; ValueError when it is exhausted.

    On a cluster created with zookeeper.acl only the listed identities may take one here (kazoo's NoAuthError):
    applications take theirs from a server (GetClientId, client.servers)."""
    from waltz_common import zk as zkmeta  # here, not at the top: kazoo only where ZooKeeper is used

    client_id = zkmeta.increment(zk, paths.client_ids)
    if client_id > INT32_MAX:
        raise ValueError(f"the client id counter {paths.client_ids} is exhausted")
    return client_id


class ZkTopologyWatcher:
    """Watches <root>/partitions and <root>/servers/*; reports partition -> Ownership on change.

    A server keeps the endpoint it registered under for as long as the assignment names it, even while its
    registration is missing (its ZooKeeper session expired and it has not registered again yet, or a
    descriptor could not be read): its partitions go on serving meanwhile (docs/failover.md, "ZooKeeper
    outages"), and server ids are never reused, so the last known endpoint is still that server's. Only a
    new assignment moves a partition.

    Runs on kazoo's thread; `report` must be thread-safe (the driver hops onto the event loop).
    """

    def __init__(self, zk: KazooClient, paths: zkmeta.ZkPaths, report: Callable[[Topology], bool]) -> None:
        self._zk = zk
        self._paths = paths
        self._report = report
        self._lock = threading.Lock()
        self._assignment: dict[int, tuple[int, int]] = {}  # partition -> (server id, generation)
        self._servers: dict[int, str] = {}  # server id -> host:port of every server ever seen registered
        self._last: dict[int, Ownership] | None = None
        self._stopped = False

    def start(self) -> None:
        self._zk.DataWatch(self._paths.server_assignment, self._on_assignment)
        self._zk.ChildrenWatch(self._paths.servers, self._on_servers)

    def stop(self) -> None:
        self._stopped = True

    def _on_assignment(self, data: bytes | None, _stat: Any) -> bool:
        assignment = metadata_pb2.ServerAssignment()
        if data:
            assignment.ParseFromString(data)
        with self._lock:
            self._assignment = {p.partition_id: (p.server_id, p.generation) for p in assignment.partitions}
        return self._publish()

    def _on_servers(self, children: list[str]) -> bool:
        from kazoo.exceptions import NoNodeError

        servers: dict[int, str] = {}
        for child in children:
            try:
                data, _ = self._zk.get(f"{self._paths.servers}/{child}")
            except NoNodeError:
                continue  # gone between the listing and the read
            descriptor = metadata_pb2.ServerDescriptor()
            descriptor.ParseFromString(data)
            servers[descriptor.server_id] = f"{descriptor.host}:{descriptor.port}"
        with self._lock:
            self._servers.update(servers)
            named = {server_id for server_id, _ in self._assignment.values()}
            for gone in [sid for sid in self._servers if sid not in servers and sid not in named]:
                del self._servers[gone]  # neither registered nor assigned anything: forget it
        return self._publish()

    def _publish(self) -> bool:
        if self._stopped:
            return False  # kazoo stops the watch
        with self._lock:
            topology = {
                pid: Ownership(self._servers.get(server_id) if server_id >= 0 else None, generation)
                for pid, (server_id, generation) in self._assignment.items()
            }
            if topology == self._last:
                return True
            self._last = topology
        return self._report(topology)
