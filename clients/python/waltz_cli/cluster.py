"""`waltz cluster ...`: create, delete, list, show-key, check-connectivity and verify a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from waltz.v1 import metadata_pb2, server_pb2
from waltz_cli import provision, rpc, verify
from waltz_cli.context import Context
from waltz_cli.errors import CliError, UsageError
from waltz_cli.output import Result, section, table
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the cluster subcommands."""
    parser = groups.add_parser("cluster", help="create, inspect and verify a cluster", parents=[common])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    create = sub.add_parser("create", help="create the cluster's znodes with a new cluster key", parents=[common])
    create.add_argument("-n", "--name", required=True, help="a name for people")
    create.add_argument("-p", "--partitions", required=True, type=int, help="number of partitions (fixed)")
    create.set_defaults(func=create_cmd)
    delete = sub.add_parser("delete", help="delete every znode of the cluster", parents=[common])
    delete.add_argument("-n", "--name", required=True, help="the cluster's name, to confirm")
    delete.add_argument("-f", "--force", action="store_true", help="even while servers are registered")
    delete.set_defaults(func=delete_cmd)
    sub.add_parser("list", help="show the cluster's metadata", parents=[common]).set_defaults(func=list_cmd)
    sub.add_parser("show-key", help="print the cluster key", parents=[common]).set_defaults(func=show_key_cmd)
    check = sub.add_parser(
        "check-connectivity", help="every server, and the storage nodes as each server sees them", parents=[common]
    )
    check.set_defaults(func=check_connectivity_cmd)
    ver = sub.add_parser("verify", help="check the whole cluster; prints PASSED or FAILED", parents=[common])
    ver.add_argument("-p", "--partitions", help="only these partitions, e.g. 0-6,8 (default: all)")
    ver.add_argument("--expect-servers", type=int, metavar="N",
                     help="fail when fewer than N servers are registered (ZooKeeper forgets a server that is gone)")
    ver.add_argument("--server-addresses", default=argparse.SUPPRESS, metavar="HOST:PORT,...",
                     help="servers that must be registered, as they advertise themselves (client.servers in the "
                          "CLI file)")
    ver.add_argument("--replicas", type=int, metavar="N",
                     help="replicas each partition must have (default: as many as the partition with the most)")
    ver.add_argument("--settle-seconds", type=float, default=verify.SETTLE_S, metavar="S",
                     help="under load, how long to wait for the transactions in flight when the high-water mark was "
                          "read to be committed everywhere before a replica off it counts as a failure "
                          f"(default {verify.SETTLE_S:g})")
    ver.set_defaults(func=verify_cmd)
    provision.register(sub, common)


def create_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Create the cluster."""
    if args.partitions < 1:
        raise UsageError("--partitions must be at least 1")
    key = cluster_admin.create_cluster(ctx.zk, ctx.paths, args.name, args.partitions)
    data = {"root": ctx.paths.root, "name": args.name, "partitions": args.partitions, "cluster_key": key}
    warning = cluster_admin.acl_warning(ctx.zk.default_acl)
    if warning is not None:
        print(f"waltz: warning: {warning}", file=sys.stderr)
        data["warning"] = warning
    return Result(data, f"created cluster {args.name!r} at {ctx.paths.root}: {args.partitions} partitions, key {key}")


def delete_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Delete the cluster after checking its name."""
    params = zkmeta.read(ctx.zk, ctx.paths.cluster, metadata_pb2.ClusterParams)
    if params is None:
        raise CliError(f"no cluster at {ctx.paths.root}")
    if params[0].name != args.name:
        raise CliError(f"the cluster at {ctx.paths.root} is named {params[0].name!r}, not {args.name!r}")
    cluster_admin.delete_cluster(ctx.zk, ctx.paths, force=args.force)
    return Result({"root": ctx.paths.root, "deleted": True}, f"deleted cluster {args.name!r} at {ctx.paths.root}")


def show_key_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Print the cluster key."""
    key = ctx.store_params().cluster_key
    return Result({"cluster_key": key}, key)


def describe(ctx: Context) -> dict[str, Any]:
    """Everything ZooKeeper holds about the cluster, as plain data."""
    zk, paths = ctx.zk, ctx.paths
    cluster = zkmeta.require(zk, paths.cluster, metadata_pb2.ClusterParams)[0]
    store = ctx.store_params()
    nodes = cluster_admin.storage_nodes(zk, paths)
    assigned = cluster_admin.replica_assignments(zk, paths)
    owners = rpc.ownership(ctx)
    partitions = []
    for pid in range(store.num_partitions):
        meta = zkmeta.read(zk, paths.partition_metadata(pid), metadata_pb2.PartitionMetadata)
        owner = owners.get(pid)
        entry: dict[str, Any] = {
            "partition": pid,
            "owner": owner.server_id if owner else None,
            "generation": meta[0].generation if meta else None,
            "session_id": meta[0].session_id if meta else None,
            "replicas": sorted(n for n, held in assigned.items() if pid in held),
            "replica_states": {},
        }
        for state in meta[0].replica_states if meta else []:
            closing = state.replica_state.closing_high_water_mark
            entry["replica_states"][state.replica_id.storage_node_connect_string] = {
                "session_id": state.replica_state.session_id,
                "closing_high_water_mark": None if closing == zkmeta.UNRESOLVED else closing,
            }
        partitions.append(entry)
    return {
        "root": paths.root,
        "name": cluster.name,
        "num_partitions": store.num_partitions,
        "cluster_key": store.cluster_key,
        "storage_nodes": [
            {"node": n, "group": g, "admin_port": p, "partitions": assigned.get(n, [])}
            for n, (g, p) in sorted(nodes.items())
        ],
        "unregistered_assignments": {n: pids for n, pids in assigned.items() if n not in nodes},
        "servers": [
            {
                "server_id": sid,
                "address": rpc.address(s),
                "partitions": sorted(p for p, o in owners.items() if o.server_id == sid),
            }
            for sid, s in sorted(rpc.servers(ctx).items())
        ],
        "partitions": partitions,
    }


def _replica_states_text(states: dict[str, dict[str, Any]]) -> str:
    parts = []
    for node, state in sorted(states.items()):
        closing = state["closing_high_water_mark"]
        parts.append(f"{node}@{state['session_id']}" + ("" if closing is None else f"/closed@{closing}"))
    return " ".join(parts) or "-"


def list_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Show the cluster."""
    data = describe(ctx)
    head = f"cluster {data['name']!r} at {data['root']}: {data['num_partitions']} partitions, key {data['cluster_key']}"
    nodes = table(
        ["storage node", "group", "admin port", "partitions"],
        [[n["node"], n["group"], n["admin_port"], n["partitions"]] for n in data["storage_nodes"]],
    )
    servers = table(
        ["server", "address", "owns"], [[s["server_id"], s["address"], s["partitions"]] for s in data["servers"]]
    )
    parts = table(
        ["partition", "owner", "generation", "session", "replicas", "replica states"],
        [
            [
                p["partition"],
                p["owner"],
                p["generation"],
                p["session_id"],
                p["replicas"],
                _replica_states_text(p["replica_states"]),
            ]
            for p in data["partitions"]
        ],
    )
    text = "\n\n".join(
        [head, section("storage nodes", nodes), section("servers", servers), section("partitions", parts)]
    )
    if data["unregistered_assignments"]:
        text += f"\n\nassignments to unregistered nodes: {data['unregistered_assignments']}"
    return Result(data, text)


def server_connectivity(ctx: Context, server: metadata_pb2.ServerDescriptor) -> dict[str, Any]:
    """One server's reachability and its view of the storage nodes."""
    target = rpc.address(server)
    entry: dict[str, Any] = {"server_id": server.server_id, "address": target, "reachable": False, "storage": {}}
    try:
        request = server_pb2.StorageConnectivityRequest()
        what = f"server {server.server_id} ({target})"
        reply = rpc.server_call(ctx, target, what, "CheckStorageConnectivity", request)
    except CliError as exc:
        entry["error"] = str(exc)
        return entry
    entry["reachable"] = True
    entry["storage"] = {n.connect_string: {"connected": n.connected, "detail": n.detail} for n in reply.nodes}
    return entry


def check_connectivity_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Every server, and each server's connections to the storage nodes."""
    live = rpc.servers(ctx)
    if not live:
        raise CliError(f"no server is registered under {ctx.paths.servers}")
    entries = [server_connectivity(ctx, s) for _, s in sorted(live.items())]
    rows = []
    for e in entries:
        if not e["reachable"]:
            rows.append([e["server_id"], e["address"], "-", "UNREACHABLE", e.get("error", "")])
        for node, state in sorted(e["storage"].items()):
            rows.append([e["server_id"], e["address"], node, "ok" if state["connected"] else "DOWN", state["detail"]])
    ok = all(e["reachable"] and all(s["connected"] for s in e["storage"].values()) for e in entries)
    text = table(["server", "address", "storage node", "state", "detail"], rows)
    return Result({"ok": ok, "servers": entries}, text, 0 if ok else 1)


def verify_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Collect the cluster's state and check it; exit 1 when any check fails."""
    if (args.expect_servers or 0) < 0 or (args.replicas is not None and args.replicas < 1) or args.settle_seconds < 0:
        raise UsageError("--expect-servers and --settle-seconds must be at least 0 and --replicas at least 1")
    expected_addresses, ctx.servers = ctx.servers, ()  # the servers that must be up; verify reads ZooKeeper
    wanted = ctx.partitions(args.partitions)
    facts = verify.collect(ctx, wanted, args.settle_seconds)
    checks = verify.check(facts, wanted)
    checks.append(verify.check_missing(facts, wanted, args.expect_servers, expected_addresses, args.replicas))
    passed = all(c.passed for c in checks)
    lines = []
    for c in checks:
        lines.append(f"[{'PASS' if c.passed else 'FAIL'}] {c.name}")
        lines.extend(f"       - {reason}" for reason in c.reasons)
    lines.append("PASSED" if passed else "FAILED")
    data = {"passed": passed, "checks": [{"name": c.name, "passed": c.passed, "reasons": c.reasons} for c in checks]}
    return Result(data, "\n".join(lines), 0 if passed else 1)
