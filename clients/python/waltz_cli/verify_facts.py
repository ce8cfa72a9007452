"""What `waltz cluster verify` reads: ZooKeeper, servers and storage nodes, settled under load (the shell).

Under load the replicas are read after the high-water mark and run ahead of it: the in-flight tail. collect
tells it from damage by settling: while a replica holds more than the latest high-water mark read, it reads the
mark again, and while one holds less than the first, it reads that replica again, for up to the settle time;
records are compared only up to the latest high-water mark (committed, so fixed). A tail that does not settle in
that time is reported as before (tests/integration/cli/test_cli_verify_load.py runs it under load). Where the
digests of a range differ, collect bisects it down to the first transaction id whose records differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from waltz.v1 import metadata_pb2, server_pb2
from waltz_cli import rpc
from waltz_cli.context import Context
from waltz_cli.errors import CliError
from waltz_cli.output import Counter
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta

DIGEST_RANGE = 10_000  # records per digest request (the node caps it there too)
SETTLE_S = 10.0
"""How long collect waits by default for the in-flight tail to settle (cluster verify --settle-seconds)."""
SETTLE_POLL_S = 0.2


@dataclass(frozen=True)
class ReplicaView:
    """A partition assigned to a storage node, as the node reports it (admin list_partitions)."""

    readable: bool = True
    writable: bool = True
    session_id: int = -1
    max_transaction_id: int = -1
    error: str = ""
    write_failure: str = ""  # its writes fail on the node's disk: the last error
    low_water_mark: int = -1
    fence_session_id: int = -1
    damaged: tuple[int, ...] = ()  # records held that fail their checksums, not repaired yet



@dataclass(frozen=True)
class ServerPartition:
    """A partition as its owning server reports it (GetServerPartitions)."""

    generation: int
    session_id: int
    healthy: bool
    detail: str = ""
    high_water_mark: int | None = None  # None while no store session is open


@dataclass
class ServerView:
    """One registered server: its partitions and storage connectivity, or why it could not be asked."""

    address: str
    partitions: dict[int, ServerPartition] | None = None
    storage: dict[str, tuple[bool, str]] | None = None
    error: str = ""


@dataclass
class Facts:
    """Everything verify looks at; built by collect(), or by hand in tests."""

    num_partitions: int
    storage_nodes: set[str]
    assignments: dict[str, list[int]]
    ownership: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (server id, generation)
    servers: dict[int, ServerView] = field(default_factory=dict)
    nodes: dict[str, dict[int, ReplicaView] | str] = field(default_factory=dict)  # str: why unreachable
    sessions: dict[int, int] = field(default_factory=dict)  # pid -> current session id
    replica_states: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)  # pid -> node -> state
    # pid -> the first transaction ids (of each range compared) at which replicas hold different records, with
    # each replica's digest of its record there
    differences: dict[int, list[tuple[int, dict[str, bytes]]]] = field(default_factory=dict)
    digest_errors: list[str] = field(default_factory=list)  # digests that could not be computed
    # Read again while settling the in-flight tail: pid -> the owner's high-water mark, read after the replicas
    # (only where a replica held more than the mark read first), and pid -> node -> the replica's max transaction
    # id (only where it held less)
    later_high_water_marks: dict[int, int] = field(default_factory=dict)
    later_maxes: dict[int, dict[str, int]] = field(default_factory=dict)


def _ask_server(ctx: Context, sid: int, target: str) -> ServerView:
    view = ServerView(target)
    what = f"server {sid} ({target})"
    try:
        owned = rpc.server_call(ctx, target, what, "GetServerPartitions", server_pb2.ServerPartitionsRequest())
        view.partitions = {
            p.partition_id: ServerPartition(
                p.generation, p.session_id, p.healthy, p.detail, p.high_water_mark if p.healthy else None
            )
            for p in owned.partitions
        }
        request = server_pb2.StorageConnectivityRequest()
        reach = rpc.server_call(ctx, target, what, "CheckStorageConnectivity", request)
        view.storage = {n.connect_string: (n.connected, n.detail) for n in reach.nodes}
    except CliError as exc:
        view.error = str(exc)
    return view


def _ask_node(ctx: Context, node: str) -> dict[int, ReplicaView] | str:
    try:
        with rpc.storage_admin(ctx, node) as admin:
            listed = admin.list_partitions()
    except CliError as exc:
        return str(exc)
    return {
        p.partition_id: ReplicaView(
            p.readable,
            p.writable,
            p.session_id,
            p.max_transaction_id,
            p.error,
            p.write_failure,
            p.low_water_mark,
            p.fence_session_id,
            p.damaged_transaction_ids,
        )
        for p in listed
    }


def collect(ctx: Context, wanted: Sequence[int] | None = None, settle_s: float = SETTLE_S) -> Facts:
    """Read ZooKeeper, then ask every registered server and every storage node, settle the in-flight tail for up
    to settle_s; compare the records of the wanted partitions' replicas (all partitions when None)."""
    zk, paths = ctx.zk, ctx.paths
    facts = Facts(
        num_partitions=ctx.num_partitions(),
        storage_nodes=set(cluster_admin.storage_nodes(zk, paths)),
        assignments=cluster_admin.replica_assignments(zk, paths),
        ownership={pid: (o.server_id, o.generation) for pid, o in rpc.ownership(ctx).items()},
    )
    for pid in range(facts.num_partitions):
        read = zkmeta.read(zk, paths.partition_metadata(pid), metadata_pb2.PartitionMetadata)
        if read is None:
            continue
        facts.sessions[pid] = read[0].session_id
        facts.replica_states[pid] = {
            e.replica_id.storage_node_connect_string: (
                e.replica_state.session_id,
                e.replica_state.closing_high_water_mark,
            )
            for e in read[0].replica_states
        }
    live = rpc.servers(ctx)
    nodes = sorted(facts.storage_nodes)
    with Counter(len(live) + len(nodes), "verify", ctx.show_progress, unit="node") as bar:
        for sid in sorted(live):
            facts.servers[sid] = _ask_server(ctx, sid, rpc.address(live[sid]))
            bar.update(1)
        for node in nodes:
            facts.nodes[node] = _ask_node(ctx, node)
            bar.update(1)
    compared = list(range(facts.num_partitions) if wanted is None else wanted)
    _settle(ctx, facts, compared, settle_s)
    for pid in compared:
        _compare_records(ctx, facts, pid)
    return facts


def tail(facts: Facts, pid: int) -> tuple[dict[str, int], dict[str, int]]:
    """The replicas of pid off the committed range: (those below the high-water mark read first -> the most they
    were seen holding, those above the latest high-water mark read -> what they held). Empty when the owner's
    mark is not known."""
    first = owner_high_water_mark(facts, pid)
    if first is None:
        return {}, {}
    later = facts.later_high_water_marks.get(pid, first)
    again = facts.later_maxes.get(pid, {})
    maxes = {n: v.max_transaction_id for n in assigned_replicas(facts, pid)
             if (v := replica_view(facts, n, pid)) is not None and not v.error}
    below = {n: seen for n, m in maxes.items() if (seen := max(m, again.get(n, m))) < first}
    above = {n: m for n, m in maxes.items() if m > later}
    return below, above


def _settle(ctx: Context, facts: Facts, wanted: Sequence[int], timeout_s: float) -> None:
    """Read again what the in-flight tail makes differ (tail()) until nothing does or timeout_s has passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pending = {pid: found for pid in wanted if any(found := tail(facts, pid))}
        if not pending:
            return
        time.sleep(SETTLE_POLL_S)
        listed: dict[str, dict[int, ReplicaView] | str] = {}
        for pid, (below, above) in pending.items():
            if above:
                try:
                    facts.later_high_water_marks[pid] = rpc.high_water_mark(ctx, pid)
                except CliError:
                    pass  # the checks name an owner that does not answer
            for node in below:
                if node not in listed:
                    listed[node] = _ask_node(ctx, node)
                views = listed[node]
                if isinstance(views, dict) and pid in views:
                    facts.later_maxes.setdefault(pid, {})[node] = views[pid].max_transaction_id


Digest = tuple[int, bytes]  # (records covered, SHA-256)


def first_difference(nodes: Sequence[str], fetch: Callable[[str, int, int], Digest], first: int, count: int) -> int:
    """The first id of first..first+count-1 at which the nodes' records differ, given that their digests of
    that range differ, by bisection: log2(count) digests per node."""
    while count > 1:
        half = count // 2
        if len({fetch(n, first, half) for n in nodes}) > 1:
            count = half
        else:
            first, count = first + half, count - half
    return first


def _compare_records(ctx: Context, facts: Facts, pid: int) -> None:
    """Digest the records every readable replica of pid holds (0..the lowest max id among them, and no further than
    the latest high-water mark read: beyond it records may be in flight), range by range, and note in facts the
    first differing id of each range whose digests differ."""
    held = {n: replica_view(facts, n, pid) for n in assigned_replicas(facts, pid)}
    nodes = sorted(n for n, v in held.items() if v is not None and v.readable and not v.error)
    if len(nodes) < 2:
        return
    end = min(held[n].max_transaction_id for n in nodes)  # type: ignore[union-attr]
    committed = facts.later_high_water_marks.get(pid, owner_high_water_mark(facts, pid))
    if committed is not None:
        end = min(end, committed)
    try:
        with ExitStack() as stack:
            admins = {node: stack.enter_context(rpc.storage_admin(ctx, node)) for node in nodes}

            def fetch(node: str, first: int, count: int) -> Digest:
                got = admins[node].digest(pid, first, count)
                return got.record_count, got.digest

            first = 0
            while first <= end:
                count = min(DIGEST_RANGE, end - first + 1)
                if len({fetch(n, first, count) for n in nodes}) > 1:
                    txn = first_difference(nodes, fetch, first, count)
                    at = {n: fetch(n, txn, 1)[1] for n in nodes}
                    facts.differences.setdefault(pid, []).append((txn, at))
                first += count
    except CliError as exc:
        facts.digest_errors.append(f"partition {pid}: the replicas' records could not be compared: {exc}")


def assigned_replicas(facts: Facts, pid: int) -> list[str]:
    return sorted(n for n, held in facts.assignments.items() if pid in held)


def replica_view(facts: Facts, node: str, pid: int) -> ReplicaView | None:
    listed = facts.nodes.get(node)
    return listed.get(pid) if isinstance(listed, dict) else None


def owner_high_water_mark(facts: Facts, pid: int) -> int | None:
    """The partition's high-water mark as its owning server reports it, None when not known."""
    sid = facts.ownership.get(pid, (-1, 0))[0]
    view = facts.servers.get(sid)
    part = (view.partitions or {}).get(pid) if view is not None else None
    return part.high_water_mark if part is not None else None
