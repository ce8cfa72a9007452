"""Cluster metadata administration in ZooKeeper: create/delete a cluster, storage nodes, replicas."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError
from kazoo.security import ACL, Permissions

from waltz.v1 import metadata_pb2
from waltz_common import zk as zkmeta
from waltz_common.config import PORT, Integer
from waltz_common.zk import MetadataError, ZkPaths
from waltz_common.zk_security import WORLD


def parse_partitions(text: str, num_partitions: int | None = None) -> list[int]:
    """Partition ranges like "0-6,8" as a sorted list; a clear ValueError for anything else."""
    result: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty item in partition list {text!r}")
        low, sep, high = part.partition("-")
        try:
            first, last = (int(low), int(high)) if sep else (int(part), int(part))
        except ValueError:
            raise ValueError(f"not a partition or range: {part!r} (use e.g. 0-6,8)") from None
        if first < 0 or last < first:
            raise ValueError(f"bad partition range {part!r}")
        if num_partitions is not None and last >= num_partitions:
            raise ValueError(f"partition {last} does not exist: the cluster has partitions 0-{num_partitions - 1}")
        result.update(range(first, last + 1))
    return sorted(result)


def create_cluster(zk: KazooClient, paths: ZkPaths, name: str, num_partitions: int) -> str:
    """Create the cluster's znodes with a new cluster key; returns the key."""
    if num_partitions < 1:
        raise ValueError("a cluster needs at least one partition")
    if zk.exists(paths.cluster) is not None and zk.exists(paths.store) is not None:
        raise MetadataError(f"a cluster already exists at {paths.root}")
    key = str(uuid.uuid4())
    zk.ensure_path(paths.root.rsplit("/", 1)[0] or "/")
    tx = zk.transaction()
    cluster = metadata_pb2.ClusterParams(name=name, num_partitions=num_partitions).SerializeToString()
    if zk.exists(paths.cluster) is None:
        tx.create(paths.cluster, cluster)
    else:
        tx.set_data(paths.cluster, cluster)
    tx.create(paths.store, metadata_pb2.StoreParams(cluster_key=key, num_partitions=num_partitions).SerializeToString())
    tx.create(paths.store_partitions, b"")
    fresh = metadata_pb2.PartitionMetadata(generation=0, session_id=-1).SerializeToString()
    for pid in range(num_partitions):
        tx.create(paths.partition_metadata(pid), fresh)
    tx.create(paths.replica_assignments, metadata_pb2.ReplicaAssignments().SerializeToString())
    tx.create(paths.group_descriptor, metadata_pb2.GroupDescriptor().SerializeToString())
    tx.create(paths.connection_metadata, metadata_pb2.ConnectionMetadata().SerializeToString())
    tx.create(paths.servers, b"")
    tx.create(paths.server_assignment, metadata_pb2.ServerAssignment().SerializeToString())
    # the id counters and the client id bindings, now and with the cluster's ACL: made later by the first
    # process that asked, they were open to the world (an anonymous write could exhaust or rewind the counter)
    tx.create(f"{paths.root}/ids", b"")
    tx.create(paths.client_ids, b"0")
    tx.create(paths.server_ids, b"0")
    tx.create(paths.client_bindings, b"")
    results = tx.commit()
    failures = [r for r in results if isinstance(r, Exception)]
    if failures:
        raise MetadataError(f"could not create the cluster at {paths.root}: {failures[0]!r}")
    return key


def acl_warning(acl: Iterable[ACL] | None) -> str | None:
    """What `waltz cluster create` warns about the ACL the cluster's znodes get (the creator's zookeeper.acl):
    None when only the listed identities may change them; otherwise who else can and what that allows."""
    entries = list(acl or ())
    if not entries:
        return (
            "the cluster was created without zookeeper.acl: anyone who reaches ZooKeeper can change its znodes "
            "(partition ownership and metadata, the client id counter and bindings); production clusters set "
            "zookeeper.acl and zookeeper.auth (docs/security.md)"
        )
    world = max((a.perms for a in entries if a.id == WORLD), default=0)
    if world & ~Permissions.READ:
        return (
            "zookeeper.acl lets anyone (world:anyone) do more than read the cluster's znodes: anyone who reaches "
            "ZooKeeper can change them (docs/security.md)"
        )
    return None


def delete_cluster(zk: KazooClient, paths: ZkPaths, force: bool = False) -> None:
    """Delete every znode of the cluster; refuses while servers are registered unless force."""
    if zk.exists(paths.store) is None:
        raise MetadataError(f"no cluster at {paths.root}")
    try:
        live = zk.get_children(paths.servers)
    except NoNodeError:
        live = []
    if live and not force:
        raise MetadataError(f"servers {', '.join(sorted(live))} are still registered; stop them or use --force")
    try:
        zk.delete(paths.root, recursive=True)
    except NotEmptyError as exc:  # a znode appeared while deleting
        raise MetadataError(f"the cluster changed while it was being deleted: {exc}") from None


def _storage_nodes(zk: KazooClient, paths: ZkPaths) -> dict[str, tuple[int, int]]:
    """connect string -> (group id, admin port)."""
    groups = zkmeta.require(zk, paths.group_descriptor, metadata_pb2.GroupDescriptor)[0]
    connections = zkmeta.require(zk, paths.connection_metadata, metadata_pb2.ConnectionMetadata)[0]
    ports = {c.connect_string: c.admin_port for c in connections.connections}
    return {g.connect_string: (g.group_id, ports.get(g.connect_string, 0)) for g in groups.groups}


def storage_nodes(zk: KazooClient, paths: ZkPaths) -> dict[str, tuple[int, int]]:
    """The registered storage nodes: connect string -> (group id, admin port)."""
    return _storage_nodes(zk, paths)


GROUP_ID = Integer(0, 2**31 - 1, "group id")
"""A replica group id: an int32 in GroupDescriptor, never negative."""


def add_storage_node(zk: KazooClient, paths: ZkPaths, connect_string: str, admin_port: int, group: int = 0) -> None:
    """Register a node; ValueError (nothing written) for a bad connect string, admin port or group id."""
    _check_connect_string(connect_string)
    _checked("admin port", PORT, admin_port)
    _checked("group id", GROUP_ID, group)
    if connect_string in _storage_nodes(zk, paths):
        raise MetadataError(f"storage node {connect_string} is already in the cluster")

    def add_group(m: metadata_pb2.GroupDescriptor) -> metadata_pb2.GroupDescriptor:
        m.groups.add(connect_string=connect_string, group_id=group)
        return m

    def add_connection(m: metadata_pb2.ConnectionMetadata) -> metadata_pb2.ConnectionMetadata:
        m.connections.add(connect_string=connect_string, admin_port=admin_port)
        return m

    zkmeta.update(zk, paths.connection_metadata, metadata_pb2.ConnectionMetadata, add_connection)
    zkmeta.update(zk, paths.group_descriptor, metadata_pb2.GroupDescriptor, add_group)


def remove_storage_node(zk: KazooClient, paths: ZkPaths, connect_string: str) -> None:
    if connect_string not in _storage_nodes(zk, paths):
        raise MetadataError(f"storage node {connect_string} is not in the cluster")
    held = replica_assignments(zk, paths).get(connect_string, [])
    if held:
        raise MetadataError(f"storage node {connect_string} still holds partitions {held}: unassign them first")

    def drop_group(m: metadata_pb2.GroupDescriptor) -> metadata_pb2.GroupDescriptor:
        kept = [g for g in m.groups if g.connect_string != connect_string]
        return metadata_pb2.GroupDescriptor(groups=kept)

    def drop_connection(m: metadata_pb2.ConnectionMetadata) -> metadata_pb2.ConnectionMetadata:
        kept = [c for c in m.connections if c.connect_string != connect_string]
        return metadata_pb2.ConnectionMetadata(connections=kept)

    zkmeta.update(zk, paths.group_descriptor, metadata_pb2.GroupDescriptor, drop_group)
    zkmeta.update(zk, paths.connection_metadata, metadata_pb2.ConnectionMetadata, drop_connection)


def replica_assignments(zk: KazooClient, paths: ZkPaths) -> dict[str, list[int]]:
    """connect string -> sorted partition ids it holds."""
    assignments = zkmeta.require(zk, paths.replica_assignments, metadata_pb2.ReplicaAssignments)[0]
    return {a.connect_string: sorted(a.replica_ids) for a in assignments.storage_replicas}


def _set_assignments(zk: KazooClient, paths: ZkPaths, change: dict[str, Iterable[int]], add: bool) -> None:
    def apply(m: metadata_pb2.ReplicaAssignments) -> metadata_pb2.ReplicaAssignments:
        current = {a.connect_string: set(a.replica_ids) for a in m.storage_replicas}
        for node, pids in change.items():
            held = current.setdefault(node, set())
            if add:
                held.update(pids)
            else:
                held.difference_update(pids)
        out = metadata_pb2.ReplicaAssignments()
        for node in sorted(current):
            if current[node]:
                out.storage_replicas.add(connect_string=node, replica_ids=sorted(current[node]))
        return out

    zkmeta.update(zk, paths.replica_assignments, metadata_pb2.ReplicaAssignments, apply)


def assign_partitions(zk: KazooClient, paths: ZkPaths, connect_string: str, partitions: Iterable[int]) -> None:
    """Add replicas of partitions to a registered storage node."""
    pids = sorted(set(partitions))
    _check_known(zk, paths, connect_string, pids)
    _set_assignments(zk, paths, {connect_string: pids}, add=True)


def unassign_partitions(zk: KazooClient, paths: ZkPaths, connect_string: str, partitions: Iterable[int]) -> None:
    """Remove replicas; refuses when a partition would be left with no replica at all."""
    pids = sorted(set(partitions))
    _check_known(zk, paths, connect_string, pids)
    current = replica_assignments(zk, paths)
    for pid in pids:
        holders = [n for n, held in current.items() if pid in held and n != connect_string]
        if not holders:
            raise MetadataError(f"partition {pid} would have no replica left without {connect_string}")
    _set_assignments(zk, paths, {connect_string: pids}, add=False)


def auto_assign(zk: KazooClient, paths: ZkPaths, group: int) -> dict[str, list[int]]:
    """Give every partition a replica on one node of the group, round robin; the group must be unassigned."""
    num_partitions = zkmeta.store_params(zk, paths).num_partitions
    nodes = sorted(n for n, (g, _) in _storage_nodes(zk, paths).items() if g == group)
    if not nodes:
        raise MetadataError(f"group {group} has no storage nodes")
    current = replica_assignments(zk, paths)
    if any(current.get(n) for n in nodes):
        raise MetadataError(f"group {group} already has assignments; unassign them first")
    plan: dict[str, list[int]] = {n: [] for n in nodes}
    for pid in range(num_partitions):
        plan[nodes[pid % len(nodes)]].append(pid)
    _set_assignments(zk, paths, dict(plan.items()), add=True)
    return plan


def _check_known(zk: KazooClient, paths: ZkPaths, connect_string: str, pids: list[int]) -> None:
    if connect_string not in _storage_nodes(zk, paths):
        raise MetadataError(f"storage node {connect_string} is not in the cluster; add it first")
    num_partitions = zkmeta.store_params(zk, paths).num_partitions
    bad = [p for p in pids if not 0 <= p < num_partitions]
    if bad:
        raise MetadataError(f"partitions {bad} do not exist: the cluster has partitions 0-{num_partitions - 1}")


def _checked(what: str, kind: Integer, value: int) -> int:
    try:
        return kind(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _check_connect_string(connect_string: str) -> None:
    host, sep, port = connect_string.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port connect string: {connect_string!r}")
