"""`waltz server ...`: the registered servers and the partitions each one owns.

With --server-addresses (client.servers) the servers are those addresses and the owners the servers' cluster info
names, asked by RPC: no ZooKeeper. ZooKeeper's view adds the preferred partitions, which only it holds.
`server partitions` reports every server that answers and marks one that does not (a killed server stays registered
until its ZooKeeper session expires), exiting 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from waltz.v1 import server_pb2
from waltz_cli import rpc
from waltz_cli.context import Context
from waltz_cli.errors import CliError
from waltz_cli.output import Result, table


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the server subcommands."""
    parser = groups.add_parser("server", help="servers and their partitions", parents=[common])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("list", help="the servers registered in ZooKeeper (or those --server-addresses reaches)",
                   parents=[common]).set_defaults(func=list_cmd)
    parts = sub.add_parser("partitions", help="the partitions servers report owning", parents=[common])
    parts.add_argument("-s", "--server", metavar="HOST:PORT", help="ask only this server (default: every server)")
    parts.set_defaults(func=partitions_cmd)


def known_addresses(ctx: Context) -> list[str]:
    """With --server-addresses: those, then every owner the servers' cluster info names (no repeats)."""
    owners = [p.address for p in ctx.cluster_info().partitions if p.address]
    return list(dict.fromkeys([*ctx.servers, *owners]))


def _list_from_servers(ctx: Context) -> Result:
    partitions = ctx.cluster_info().partitions
    data: list[dict[str, Any]] = []
    for target in known_addresses(ctx):
        entry: dict[str, Any] = {"server_id": None, "address": target, "partitions": [], "error": ""}
        try:
            reply = rpc.server_call(ctx, target, f"server {target}", "GetServerPartitions",
                                    server_pb2.ServerPartitionsRequest())
        except CliError as exc:
            entry["error"] = str(exc)
        else:
            entry["server_id"] = reply.server_id
            entry["partitions"] = sorted(p.partition_id for p in partitions if p.address == target)
        data.append(entry)
    rows = [[d["server_id"] if d["server_id"] is not None else "-", d["address"], d["partitions"], d["error"]]
            for d in data]
    return Result(data, table(["server", "address", "partitions", "error"], rows),
                  1 if any(d["error"] for d in data) else 0)


def list_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Servers from ZooKeeper with the partitions assigned to them (or the servers --server-addresses reaches)."""
    if ctx.servers:
        return _list_from_servers(ctx)
    owners = rpc.ownership(ctx)
    data = [
        {
            "server_id": sid,
            "address": rpc.address(s),
            "partitions": sorted(p for p, o in owners.items() if o.server_id == sid),
            "preferred_partitions": sorted(s.preferred_partitions),
        }
        for sid, s in sorted(rpc.servers(ctx).items())
    ]
    rows = [[d["server_id"], d["address"], d["partitions"], d["preferred_partitions"]] for d in data]
    return Result(data, table(["server", "address", "partitions", "preferred"], rows))


def ask(ctx: Context, target: str) -> dict[str, Any]:
    """One server's GetServerPartitions as plain data."""
    reply = rpc.server_call(
        ctx, target, f"server {target}", "GetServerPartitions", server_pb2.ServerPartitionsRequest()
    )
    return {
        "server_id": reply.server_id,
        "address": target,
        "partitions": [
            {
                "partition": p.partition_id,
                "generation": p.generation,
                "session_id": p.session_id,
                "high_water_mark": p.high_water_mark,
                "healthy": p.healthy,
                "pending_appends": p.pending_appends,
                "detail": p.detail,
            }
            for p in sorted(reply.partitions, key=lambda p: p.partition_id)
        ],
    }


def ask_or_mark(ctx: Context, target: str, server_id: int | None) -> dict[str, Any]:
    """ask(), or, when the server does not answer (a killed server stays registered until its ZooKeeper session
    expires), an entry with no partitions that says why: the other servers are still reported."""
    try:
        return {**ask(ctx, target), "error": ""}
    except CliError as exc:
        return {"server_id": server_id, "address": target, "partitions": [], "error": str(exc)}


def partitions_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Ask one server, or every registered one; exit 1 when one of them did not answer."""
    targets: list[tuple[str, int | None]]
    if args.server:
        targets = [(args.server, None)]
    elif ctx.servers:
        targets = [(t, None) for t in known_addresses(ctx)]
    else:
        targets = [(rpc.address(s), sid) for sid, s in sorted(rpc.servers(ctx).items())]
        if not targets:
            raise CliError(f"no server is registered under {ctx.paths.servers}")
    data = [ask_or_mark(ctx, target, sid) for target, sid in targets]
    rows: list[list[Any]] = []
    for d in data:
        server_id = d["server_id"] if d["server_id"] is not None else "-"
        if d["error"]:
            rows.append([server_id, d["address"], "-", "-", "-", "-", "-", "-", f"UNREACHABLE: {d['error']}"])
        rows.extend(
            [server_id, d["address"], p["partition"], p["generation"], p["session_id"], p["high_water_mark"],
             p["healthy"], p["pending_appends"], p["detail"]]
            for p in d["partitions"]
        )
    headers = ["server", "address", "partition", "generation", "session", "hwm", "healthy", "pending", "detail"]
    return Result(data, table(headers, rows), 1 if any(d["error"] for d in data) else 0)
