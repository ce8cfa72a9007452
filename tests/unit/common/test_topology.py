"""ZkTopologyWatcher's view from the assignment and the registrations (kazoo's callbacks called directly)."""

from __future__ import annotations

from typing import Any

from waltz.v1 import metadata_pb2
from waltz_common.topology import Ownership, Topology, ZkTopologyWatcher
from waltz_common.zk import ZkPaths


class Registrations:
    """What the watcher reads of <root>/servers/<id> (a kazoo client's get, nothing else)."""

    def __init__(self) -> None:
        self.nodes: dict[str, bytes] = {}

    def register(self, paths: ZkPaths, server_id: int, port: int) -> str:
        descriptor = metadata_pb2.ServerDescriptor(server_id=server_id, host="h", port=port)
        self.nodes[paths.server(server_id)] = descriptor.SerializeToString()
        return str(server_id)

    def get(self, path: str) -> tuple[bytes, None]:
        return self.nodes[path], None


def assignment(*owners: tuple[int, int]) -> bytes:
    return metadata_pb2.ServerAssignment(partitions=[
        metadata_pb2.PartitionOwnership(partition_id=p, server_id=s, generation=1) for p, s in owners
    ]).SerializeToString()


def watcher() -> tuple[ZkTopologyWatcher, Registrations, ZkPaths, list[Topology]]:
    paths = ZkPaths("/w")
    zk = Registrations()
    seen: list[Topology] = []
    zk_any: Any = zk
    return ZkTopologyWatcher(zk_any, paths, lambda t: seen.append(dict(t)) or True), zk, paths, seen


def test_a_server_whose_registration_went_keeps_its_endpoint_while_the_assignment_names_it() -> None:
    """Its session expired (ZooKeeper was down, or frozen): it goes on serving until fenced or reassigned, and
    registers again under the same id; clients keep its address meanwhile (issue 32)."""
    w, zk, paths, seen = watcher()
    w._on_servers([zk.register(paths, 1, 4001), zk.register(paths, 2, 4002)])
    w._on_assignment(assignment((0, 1), (1, 2)), None)
    assert seen[-1] == {0: Ownership("h:4001", 1), 1: Ownership("h:4002", 1)}
    w._on_servers(["2"])  # server 1's registration is gone
    assert seen[-1][0] == Ownership("h:4001", 1)
    w._on_assignment(assignment((0, 2), (1, 2)), None)  # the coordinator moved it: that is what counts
    assert seen[-1] == {0: Ownership("h:4002", 1), 1: Ownership("h:4002", 1)}


def test_a_server_neither_registered_nor_assigned_is_forgotten() -> None:
    w, zk, paths, seen = watcher()
    w._on_assignment(assignment((0, 2)), None)
    w._on_servers([zk.register(paths, 1, 4001), zk.register(paths, 2, 4002)])
    w._on_servers(["2"])
    assert 1 not in w._servers
    w._on_assignment(assignment((0, 1)), None)  # an assignment naming a server nobody knows: unowned
    assert seen[-1] == {0: Ownership(None, 1)}
