"""`waltz cluster provision`: bring a cluster to a declared shape, and do nothing more when run again.

This is what the Helm chart's provisioning Job runs on every install, upgrade and scale-out. It creates
the cluster when it is missing, registers the storage nodes not registered yet (each in its own replica
group, numbered by its position in the list), assigns replicas only while no partition has any (a first
install: moving replicas onto new nodes copies data and stays the operator's decision, `waltz storage
recover-partition`). It creates on each listed node the partitions assigned to it before it publishes
the assignments, so that no server meets a replica that lacks its partition.
A declared shape that contradicts the cluster (another partition count, another admin port) is refused
with exit code 2, so a retrying caller can tell it from a node that is not up yet (exit code 1).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from kazoo.client import KazooClient

from waltz_cli import storage
from waltz_cli.context import Context
from waltz_cli.errors import UsageError
from waltz_cli.output import Result
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.zk import MetadataError, ZkPaths


@dataclass(frozen=True)
class NodeSpec:
    """A storage node as declared: its connect string (host:port), admin port and replica group."""

    connect_string: str
    admin_port: int
    group: int


@dataclass(frozen=True)
class ClusterState:
    """What ZooKeeper holds now: partition count (None: no cluster), nodes (connect string -> group, admin port)."""

    num_partitions: int | None
    nodes: dict[str, tuple[int, int]] = field(default_factory=dict)
    assignments: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """The changes that bring a cluster to the declared shape."""

    create: bool
    add_nodes: list[NodeSpec]
    assign: dict[str, list[int]]
    idle_nodes: list[str]


def parse_nodes(texts: list[str]) -> list[NodeSpec]:
    """HOST:PORT:ADMIN_PORT items as NodeSpecs, group = position; a UsageError for anything else."""
    nodes = []
    for index, text in enumerate(texts):
        host_port, _, admin = text.rpartition(":")
        if not host_port or ":" not in host_port or not admin.isdigit():
            raise UsageError(f"--node {text!r}: write HOST:PORT:ADMIN_PORT")
        nodes.append(NodeSpec(host_port, int(admin), index))
    names = [n.connect_string for n in nodes]
    if len(set(names)) != len(names):
        raise UsageError(f"a storage node is listed twice: {names}")
    return nodes


def placement(num_partitions: int, nodes: list[str], replicas: int) -> dict[str, list[int]]:
    """Partition p on nodes p, p+1, ... p+replicas-1 (modulo the node count): replicas spread evenly."""
    plan: dict[str, list[int]] = {n: [] for n in nodes}
    for pid in range(num_partitions):
        for k in range(replicas):
            plan[nodes[(pid + k) % len(nodes)]].append(pid)
    return plan


def plan(state: ClusterState, num_partitions: int, nodes: list[NodeSpec], replicas: int) -> Plan:
    """The changes to make, or a UsageError naming every contradiction between the cluster and the declaration."""
    if not nodes:
        raise UsageError("declare at least one storage node (--node)")
    if not 1 <= replicas <= len(nodes):
        raise UsageError(f"--replicas {replicas}: must be between 1 and the number of storage nodes ({len(nodes)})")
    conflicts = []
    if state.num_partitions is not None and state.num_partitions != num_partitions:
        conflicts.append(
            f"the cluster has {state.num_partitions} partitions, not {num_partitions} (fixed at creation)"
        )
    for node in nodes:
        known = state.nodes.get(node.connect_string)
        if known is not None and known[1] != node.admin_port:
            conflicts.append(f"storage node {node.connect_string} has admin port {known[1]}, not {node.admin_port}")
    if conflicts:
        raise UsageError("; ".join(conflicts))
    add = [n for n in nodes if n.connect_string not in state.nodes]
    assign: dict[str, list[int]] = {}
    if not any(state.assignments.values()):
        assign = placement(num_partitions, [n.connect_string for n in nodes], replicas)
    holding = {n for n, pids in {**state.assignments, **assign}.items() if pids}
    idle = [n.connect_string for n in nodes if n.connect_string not in holding]
    return Plan(state.num_partitions is None, add, assign, idle)


def read_state(zk: KazooClient, paths: ZkPaths) -> ClusterState:
    """The cluster as ZooKeeper holds it now."""
    if zk.exists(paths.store) is None:
        return ClusterState(None)
    return ClusterState(
        zkmeta.store_params(zk, paths).num_partitions,
        cluster_admin.storage_nodes(zk, paths),
        cluster_admin.replica_assignments(zk, paths),
    )


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cluster provision`."""
    p = sub.add_parser("provision", help="create or complete a cluster to a declared shape (idempotent)",
                       parents=[common])
    p.add_argument("-n", "--name", required=True, help="a name for people (used when creating)")
    p.add_argument("-p", "--partitions", required=True, type=int, help="number of partitions (fixed at creation)")
    p.add_argument("-r", "--replicas", type=int, default=3, help="replicas per partition on a first install (3)")
    p.add_argument("--node", action="append", default=[], required=True, metavar="HOST:PORT:ADMIN_PORT",
                   help="a storage node, in order (repeat); its group is its position")
    p.add_argument("--no-sync", action="store_true", help="change ZooKeeper only; do not contact the nodes")
    p.set_defaults(func=provision_cmd)


def provision_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Plan against ZooKeeper's state, apply, then create the assigned partitions on the nodes."""
    if args.partitions < 1:
        raise UsageError("--partitions must be at least 1")
    nodes = parse_nodes(args.node)
    changes = plan(read_state(ctx.zk, ctx.paths), args.partitions, nodes, args.replicas)
    if changes.create:
        try:
            cluster_admin.create_cluster(ctx.zk, ctx.paths, args.name, args.partitions)
        except MetadataError:
            if ctx.zk.exists(ctx.paths.store) is None:
                raise
            # Another provisioner created it first: plan again against what it made.
            changes = plan(read_state(ctx.zk, ctx.paths), args.partitions, nodes, args.replicas)
    for node in changes.add_nodes:
        cluster_admin.add_storage_node(ctx.zk, ctx.paths, node.connect_string, node.admin_port, node.group)
    # The partitions on the nodes first, the assignments in ZooKeeper after: a server opens a store session
    # with every replica ZooKeeper lists, and a node without the partition yet refuses it (UNKNOWN_PARTITION),
    # so the server backs off from that replica (up to storage.maxRetryInterval) after it is created.
    assigned = cluster_admin.replica_assignments(ctx.zk, ctx.paths)
    synced = {} if args.no_sync else {
        n.connect_string: storage.sync_node(
            ctx, n.connect_string, {*assigned.get(n.connect_string, []), *changes.assign.get(n.connect_string, [])},
            False,
        )[0]
        for n in nodes
    }
    for connect_string, pids in changes.assign.items():
        if pids:
            cluster_admin.assign_partitions(ctx.zk, ctx.paths, connect_string, pids)
    data = {
        "root": ctx.paths.root,
        "created": changes.create,
        "added_nodes": [n.connect_string for n in changes.add_nodes],
        "assigned": changes.assign,
        "created_partitions": synced,
        "idle_nodes": changes.idle_nodes,
    }
    lines = [
        f"cluster at {ctx.paths.root}: " + ("created" if changes.create else "exists"),
        f"storage nodes registered now: {data['added_nodes'] or 'none'}",
        f"replicas assigned now: {'first install' if changes.assign else 'none (assignments kept)'}",
        f"partitions created on nodes: {synced or 'not contacted (--no-sync)'}",
    ]
    if changes.idle_nodes:
        lines.append(f"nodes holding no replica yet (waltz storage recover-partition): {changes.idle_nodes}")
    return Result(data, "\n".join(lines))

