"""`waltz storage ...`: storage nodes and replicas in ZooKeeper, and partitions on the nodes themselves."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from waltz_cli import guards, lifecycle, recover, rpc
from waltz_cli.context import Context
from waltz_cli.errors import CliError, UsageError, checked
from waltz_cli.output import Result, ranges, table
from waltz_common import cluster_admin
from waltz_common.cluster_admin import GROUP_ID
from waltz_common.config import PORT


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "on", "1"):
        return True
    if lowered in ("false", "no", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"not true or false: {text!r}")


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the storage subcommands."""
    parser = groups.add_parser("storage", help="storage nodes, replicas, partitions on nodes", parents=[common])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def cmd(name: str, func: Any, help_text: str, node: bool | None, parts: bool | None) -> argparse.ArgumentParser:
        """A subcommand; node/parts: None for no -s/-p option, else whether it is required."""
        p = sub.add_parser(name, help=help_text, parents=[common])
        p.set_defaults(func=func)
        if node is not None:
            p.add_argument("-s", "--storage", required=node, metavar="HOST:PORT", help="the storage node")
        if parts is not None:
            p.add_argument("-p", "--partitions", required=parts, metavar="RANGES", help="partitions, e.g. 0-6,8")
        return p

    p = cmd("add-node", add_node_cmd, "register a storage node in ZooKeeper", True, None)
    p.add_argument("-a", "--admin-port", required=True, type=checked(PORT), help="its admin port (1..65535)")
    p.add_argument("-g", "--group", type=checked(GROUP_ID), default=0, help="its replica group, 0 or more (default 0)")
    cmd("remove-node", remove_node_cmd, "unregister a storage node that holds no replicas", True, None)
    cmd("assign", assign_cmd, "assign replicas of partitions to a node in ZooKeeper", True, True)
    p = cmd("unassign", unassign_cmd, "remove replicas of partitions from a node in ZooKeeper", True, True)
    p.add_argument("--force", action="store_true", help="even below a majority of the previous replica set")
    p = cmd("auto-assign", auto_assign_cmd, "give every partition a replica in a group, round robin", None, None)
    p.add_argument("-g", "--group", type=checked(GROUP_ID), required=True, help="the replica group")
    cmd("list", list_cmd, "the storage nodes in ZooKeeper, or one node's partitions", False, None)
    p = cmd("availability", availability_cmd, "mark partitions readable/writable on a node", True, True)
    p.add_argument("-o", "--online", type=_bool, help="readable and writable: true or false")
    p.add_argument("--readable", type=_bool, help="true or false")
    p.add_argument("--writable", type=_bool, help="true or false")
    cmd("add-partition", add_partition_cmd, "create partitions' files on a node", True, True)
    p = cmd("remove-partition", remove_partition_cmd, "delete partitions' files on a node", True, True)
    p.add_argument("-d", "--delete-storage-files", action="store_true", help="confirm that the files go")
    p.add_argument("--force", action="store_true", help="even a replica ZooKeeper lists or the only copy")
    p = cmd("sync", sync_cmd, "make the nodes' partitions match ZooKeeper's assignments", False, None)
    p.add_argument("--remove-extra", action="store_true", help="also delete partitions ZooKeeper does not assign")
    p.add_argument("--force", action="store_true",
                   help="with --remove-extra: even the only copy of transactions; also create a partition on a node "
                        "that lost it while voting for it (use `storage replace` instead)")
    cmd("max-transaction-id", max_txn_cmd, "the highest transaction id of partitions on a node", True, False)
    p = cmd("reset-fence", reset_fence_cmd, "clear a poisoned session fence of partitions on a node", True, True)
    p.add_argument(
        "--session", type=int, help="the session id the fence goes back to (default: ZooKeeper's current session)"
    )
    recover.register(sub, common)
    lifecycle.register(sub, common)


def add_node_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Register a storage node."""
    try:
        cluster_admin.add_storage_node(ctx.zk, ctx.paths, args.storage, args.admin_port, args.group)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    data = {"node": args.storage, "admin_port": args.admin_port, "group": args.group}
    return Result(data, f"added storage node {args.storage} (admin port {args.admin_port}, group {args.group})")


def remove_node_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Unregister a storage node."""
    cluster_admin.remove_storage_node(ctx.zk, ctx.paths, args.storage)
    return Result({"node": args.storage, "removed": True}, f"removed storage node {args.storage}")


def assign_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Assign replicas in ZooKeeper."""
    pids = ctx.partitions(args.partitions)
    cluster_admin.assign_partitions(ctx.zk, ctx.paths, args.storage, pids)
    held = cluster_admin.replica_assignments(ctx.zk, ctx.paths).get(args.storage, [])
    return Result({"node": args.storage, "partitions": held}, f"{args.storage} now holds partitions {ranges(held)}")


def _overruled(refusal: guards.Refusal | None, force: bool, forced: list[str]) -> None:
    """Raise the refusal unless forced; a forced one is remembered for the output."""
    if refusal is None:
        return
    if not force or refusal.risk is None:
        raise CliError(refusal.message())
    forced.append(f"forced: {refusal.reason}; risk: {refusal.risk}")


def _with_forced(result: Result, forced: list[str]) -> Result:
    if forced and isinstance(result.data, dict):
        result.data["forced"] = forced
        result.text = "\n".join([*forced, result.text])
    return result


def unassign_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Unassign replicas in ZooKeeper, keeping a majority of each partition's previous replica set."""
    pids = ctx.partitions(args.partitions)
    forced: list[str] = []
    for pid in pids:
        _overruled(guards.unassign(ctx.partition_view(pid), args.storage), args.force, forced)
    cluster_admin.unassign_partitions(ctx.zk, ctx.paths, args.storage, pids)
    held = cluster_admin.replica_assignments(ctx.zk, ctx.paths).get(args.storage, [])
    text = f"{args.storage} now holds partitions {ranges(held)}"
    return _with_forced(Result({"node": args.storage, "partitions": held}, text), forced)


def auto_assign_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Round-robin assignment within a group."""
    plan = cluster_admin.auto_assign(ctx.zk, ctx.paths, args.group)
    return Result(plan, table(["storage node", "partitions"], sorted(plan.items())))


def _node_partitions(ctx: Context, node: str) -> list[dict[str, Any]]:
    with rpc.storage_admin(ctx, node) as admin:
        listed = admin.list_partitions()
    return [
        {
            "partition": p.partition_id,
            "readable": p.readable,
            "writable": p.writable,
            "session_id": p.session_id,
            "low_water_mark": p.low_water_mark,
            "local_low_water_mark": p.local_low_water_mark,
            "max_transaction_id": p.max_transaction_id,
            "error": p.error,
            "write_failure": p.write_failure,
            "fence": p.fence_session_id,
            "committed": p.committed_high_water_mark,
            "damaged": _ids(p.damaged_transaction_ids),
        }
        for p in sorted(listed, key=lambda p: p.partition_id)
    ]


def _ids(ids: Sequence[int], shown: int = 10) -> str:
    """Damaged transaction ids as a short text: the first few, then how many more."""
    text = ",".join(map(str, ids[:shown]))
    return text + (f" (+{len(ids) - shown} more)" if len(ids) > shown else "")


def list_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """ZooKeeper's storage nodes, or with -s the partitions one node reports."""
    if args.storage:
        rows = _node_partitions(ctx, args.storage)
        headers = ["partition", "readable", "writable", "session", "lwm", "local lwm", "max txn", "error"]
        headers += ["write failure", "fence", "committed", "damaged"]
        text = table(headers, [[r[k] for k in list(rows[0])] for r in rows] if rows else [])
        return Result({"node": args.storage, "partitions": rows}, text)
    nodes = cluster_admin.storage_nodes(ctx.zk, ctx.paths)
    assigned = cluster_admin.replica_assignments(ctx.zk, ctx.paths)
    data = [
        {"node": n, "group": g, "admin_port": p, "partitions": assigned.get(n, [])}
        for n, (g, p) in sorted(nodes.items())
    ]
    text = table(["storage node", "group", "admin port", "partitions"], [list(d.values()) for d in data])
    return Result(data, text)


def availability_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Toggle readable/writable on a node's partitions."""
    readable = args.readable if args.readable is not None else args.online
    writable = args.writable if args.writable is not None else args.online
    if readable is None and writable is None:
        raise UsageError("say what to set: --online, --readable and/or --writable (true or false)")
    pids = ctx.partitions(args.partitions)
    with rpc.storage_admin(ctx, args.storage) as admin:
        for pid in pids:
            if readable is not None:
                admin.set_readable(pid, readable)
            if writable is not None:
                admin.set_writable(pid, writable)
    data = {"node": args.storage, "partitions": pids, "readable": readable, "writable": writable}
    states = ", ".join(f"{k}={v}" for k, v in (("readable", readable), ("writable", writable)) if v is not None)
    return Result(data, f"{args.storage}: partitions {ranges(pids)}: {states}")


def add_partition_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Create partitions on a node."""
    pids = ctx.partitions(args.partitions)
    with rpc.storage_admin(ctx, args.storage) as admin:
        for pid in pids:
            admin.assign(pid)
    return Result({"node": args.storage, "added": pids}, f"{args.storage}: created partitions {ranges(pids)}")


def _max_transaction_id(ctx: Context, node: str, pid: int) -> int | None:
    """A node's max transaction id of a partition; None when it cannot be read or the node lacks it."""
    try:
        with rpc.storage_admin(ctx, node) as admin:
            found = [p for p in admin.list_partitions() if p.partition_id == pid and not p.error]
    except CliError:
        return None
    return found[0].max_transaction_id if found else None


def _check_deletion(ctx: Context, node: str, pid: int, local_max: int, force: bool, forced: list[str]) -> None:
    """Refuse (unless forced) to delete a replica ZooKeeper lists or that holds the only copy of transactions."""
    view = ctx.partition_view(pid)
    _overruled(guards.delete_listed(view, node), force, forced)
    if local_max >= 0:
        others = {other: _max_transaction_id(ctx, other, pid) for other in sorted(view.assigned - {node})}
        _overruled(guards.delete_unique(view, node, local_max, others), force, forced)


def remove_partition_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Delete partitions on a node (explicitly confirmed; guarded unless forced)."""
    pids = ctx.partitions(args.partitions)
    if not args.delete_storage_files:
        raise UsageError("remove-partition deletes the partitions' files on the node: add -d/--delete-storage-files")
    forced: list[str] = []
    with rpc.storage_admin(ctx, args.storage) as admin:
        held = {p.partition_id: p.max_transaction_id for p in admin.list_partitions()}
        for pid in pids:
            if pid in held:
                _check_deletion(ctx, args.storage, pid, held[pid], args.force, forced)
        for pid in pids:
            admin.unassign(pid)
    text = f"{args.storage}: deleted partitions {ranges(pids)}"
    return _with_forced(Result({"node": args.storage, "removed": pids}, text), forced)


def sync_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Create on each node the partitions ZooKeeper assigns it (and delete extras if asked)."""
    assigned = cluster_admin.replica_assignments(ctx.zk, ctx.paths)
    nodes = [args.storage] if args.storage else sorted(cluster_admin.storage_nodes(ctx.zk, ctx.paths))
    report: dict[str, Any] = {}
    forced: list[str] = []
    for node in nodes:
        added, extra = sync_node(ctx, node, set(assigned.get(node, [])), args.remove_extra, args.force, forced)
        report[node] = {"added": added, "removed" if args.remove_extra else "extra": extra}
    rows = [[n, r["added"], r.get("removed", []), r.get("extra", [])] for n, r in report.items()]
    return _with_forced(Result(report, table(["storage node", "created", "deleted", "extra (kept)"], rows)), forced)


def sync_node(
    ctx: Context, node: str, want: set[int], remove_extra: bool, force: bool = False, forced: list[str] | None = None
) -> tuple[list[int], list[int]]:
    """Create on a node the partitions in want it lacks (and delete the others if asked, each only once the
    deletion guard allows it, or with force, noted in forced): (created, extra)."""
    with rpc.storage_admin(ctx, node) as admin:
        have = {p.partition_id: p.max_transaction_id for p in admin.list_partitions()}
        added, extra = sorted(want - set(have)), sorted(set(have) - want)
        for pid in added:
            _overruled(guards.create_on_voter(ctx.partition_view(pid), node), force,
                       forced if forced is not None else [])
        for pid in added:
            admin.assign(pid)
        if remove_extra:
            for pid in extra:
                _check_deletion(ctx, node, pid, have[pid], force, forced if forced is not None else [])
            for pid in extra:
                admin.unassign(pid)
    return added, extra


def max_txn_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """The max transaction id per partition on a node."""
    wanted = set(ctx.partitions(args.partitions))
    rows = [r for r in _node_partitions(ctx, args.storage) if r["partition"] in wanted]
    missing = sorted(wanted - {r["partition"] for r in rows})
    if args.partitions and missing:
        raise CliError(f"storage node {args.storage} does not hold partitions {ranges(missing)}")
    data = {str(r["partition"]): r["max_transaction_id"] for r in rows}
    return Result(
        data, table(["partition", "max transaction id"], [[r["partition"], r["max_transaction_id"]] for r in rows])
    )


def reset_fence_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Set poisoned session fences back to ZooKeeper's current session (or --session): each partition is made
    unwritable for the reset (the node accepts it only then), then writable again if it was."""
    pids = ctx.partitions(args.partitions)
    done: list[dict[str, int]] = []
    with rpc.storage_admin(ctx, args.storage) as admin:
        listed = {p.partition_id: p for p in admin.list_partitions()}
        for pid in pids:
            state = listed.get(pid)
            if state is None or state.error:
                raise CliError(
                    f"storage node {args.storage} cannot reset partition {pid}: {state.error if state else 'not held'}"
                )
            current = recover.current_session(ctx, pid)
            target = current if args.session is None else args.session
            refusal = guards.reset_fence(pid, state.fence_session_id, target, current)
            if refusal is not None:
                raise CliError(refusal.message(forceable=False))
            if state.writable:
                admin.set_writable(pid, False)
            try:
                admin.reset_fence(pid, target)
            finally:
                if state.writable:
                    admin.set_writable(pid, True)
            done.append({"partition": pid, "fence_was": state.fence_session_id, "fence": target})
    text = table(["partition", "fence was", "fence now"], [[d["partition"], d["fence_was"], d["fence"]] for d in done])
    return Result({"node": args.storage, "partitions": done}, text)
