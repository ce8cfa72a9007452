"""`waltz cluster verify`: collect what ZooKeeper, servers and storage nodes say, then check it (pure).

The replicas of each partition are compared with its high-water mark (from the owning server) and with
each other: their max transaction ids, low-water marks, and digests of their records (PartitionDigest,
computed on each node over ranges of DIGEST_RANGE records; where the digests of a range differ, collect
bisects it down to the first transaction id whose records differ).

Under load the replicas are read after the high-water mark and run ahead of it: the in-flight tail. collect
tells it from damage by settling: while a replica holds more than the latest high-water mark read, it reads the
mark again, and while one holds less than the first, it reads that replica again, for up to the settle time;
records are compared only up to the latest high-water mark (committed, so fixed). A tail that does not settle in
that time is reported as before (tests/integration/cli/test_cli_verify_load.py runs it under load).
"""

from __future__ import annotations

import time
from collections import Counter as Tally
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


@dataclass
class Check:
    """One verify check: its name and, if it failed, the reasons."""

    name: str
    reasons: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.reasons


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
    first = _high_water_mark(facts, pid)
    if first is None:
        return {}, {}
    later = facts.later_high_water_marks.get(pid, first)
    again = facts.later_maxes.get(pid, {})
    maxes = {n: v.max_transaction_id for n in _replicas(facts, pid)
             if (v := _replica_view(facts, n, pid)) is not None and not v.error}
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
    held = {n: _replica_view(facts, n, pid) for n in _replicas(facts, pid)}
    nodes = sorted(n for n, v in held.items() if v is not None and v.readable and not v.error)
    if len(nodes) < 2:
        return
    end = min(held[n].max_transaction_id for n in nodes)  # type: ignore[union-attr]
    committed = facts.later_high_water_marks.get(pid, _high_water_mark(facts, pid))
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


def _replicas(facts: Facts, pid: int) -> list[str]:
    return sorted(n for n, held in facts.assignments.items() if pid in held)


def check_zookeeper(facts: Facts, wanted: list[int]) -> Check:
    check = Check("ZooKeeper replica assignments are valid")
    for node, held in sorted(facts.assignments.items()):
        if node not in facts.storage_nodes:
            check.reasons.append(f"storage node {node} holds partitions {held} but is not a registered storage node")
        bad = [p for p in held if not 0 <= p < facts.num_partitions]
        if bad:
            check.reasons.append(f"storage node {node} is assigned partitions {bad}, which do not exist")
    check.reasons.extend(f"partition {pid} has no replica" for pid in wanted if not _replicas(facts, pid))
    return check


def check_ownership(facts: Facts, wanted: list[int]) -> Check:
    check = Check("servers own the partitions ZooKeeper assigns them")
    if not facts.servers:
        check.reasons.append("no server is registered")
        return check
    for pid in wanted:
        sid, generation = facts.ownership.get(pid, (-1, 0))
        if sid < 0:
            check.reasons.append(f"partition {pid} has no owning server in ZooKeeper")
            continue
        view = facts.servers.get(sid)
        if view is None:
            check.reasons.append(f"partition {pid} is assigned to server {sid}, which is not registered")
        elif view.partitions is None:
            check.reasons.append(f"server {sid} ({view.address}) cannot be asked: {view.error}")
        elif pid not in view.partitions:
            check.reasons.append(f"server {sid} ({view.address}) does not own partition {pid}, ZooKeeper says it does")
        elif view.partitions[pid].generation != generation:
            got = view.partitions[pid].generation
            check.reasons.append(
                f"server {sid} ({view.address}) has partition {pid} at generation {got}, ZooKeeper says {generation}"
            )
    for sid, view in sorted(facts.servers.items()):
        for pid in sorted(set(view.partitions or {}) & set(wanted)):
            if facts.ownership.get(pid, (-1, 0))[0] != sid:
                check.reasons.append(f"server {sid} ({view.address}) owns partition {pid}, ZooKeeper says it does not")
    check.reasons[:] = list(dict.fromkeys(check.reasons))
    return check


def check_server_storage(facts: Facts, wanted: list[int]) -> Check:
    """Each server reaches every node holding replicas of its partitions (others it may still list are ignored)."""
    check = Check("servers reach their storage nodes")
    for sid, view in sorted(facts.servers.items()):
        if view.storage is None:
            continue  # already reported by the ownership check
        owned = [p for p in (view.partitions or {}) if p in wanted]
        for node in sorted({n for p in owned for n in _replicas(facts, p)}):
            connected, detail = view.storage.get(node, (False, "no connection"))
            if not connected:
                check.reasons.append(f"server {sid} ({view.address}) cannot reach storage node {node}: {detail}")
    return check


def _replica_view(facts: Facts, node: str, pid: int) -> ReplicaView | None:
    listed = facts.nodes.get(node)
    return listed.get(pid) if isinstance(listed, dict) else None


def _usable(view: ReplicaView | None) -> bool:
    return view is not None and view.readable and view.writable and not view.error and not view.write_failure


def check_storage(facts: Facts, wanted: list[int]) -> Check:
    check = Check("storage nodes hold what ZooKeeper assigns them, with a quorum for every partition")
    for node, listed in sorted(facts.nodes.items()):
        if isinstance(listed, str):
            check.reasons.append(listed)
            continue
        held = set(facts.assignments.get(node, [])) & set(wanted)
        present = set(listed) & set(wanted)
        for pid in sorted(held - present):
            check.reasons.append(f"storage node {node} does not hold partition {pid}, ZooKeeper assigns it there")
        for pid in sorted(present - held):
            check.reasons.append(f"storage node {node} holds partition {pid}, ZooKeeper does not assign it there")
        for pid in sorted(held & present):
            v = listed[pid]
            if v.error:
                check.reasons.append(f"storage node {node}: partition {pid} is damaged: {v.error}")
            elif not (v.readable and v.writable):
                state = ", ".join(s for s, ok in (("unreadable", v.readable), ("unwritable", v.writable)) if not ok)
                check.reasons.append(f"storage node {node}: partition {pid} is {state}")
            elif v.write_failure:
                check.reasons.append(f"storage node {node}: partition {pid}: writes fail: {v.write_failure}")
            if v.damaged:
                shown = ", ".join(map(str, v.damaged[:5])) + (", ..." if len(v.damaged) > 5 else "")
                check.reasons.append(
                    f"storage node {node}: partition {pid} holds {len(v.damaged)} damaged records ({shown}), not "
                    "repaired yet (a store session's recovery repairs them from an intact replica)"
                )
    for pid in wanted:
        replicas = _replicas(facts, pid)
        usable = [n for n in replicas if _usable(_replica_view(facts, n, pid))]
        if replicas and len(usable) < len(replicas) // 2 + 1:
            check.reasons.append(
                f"partition {pid} has no quorum: {len(usable)} of {len(replicas)} replicas usable "
                f"(need {len(replicas) // 2 + 1}; down: {', '.join(n for n in replicas if n not in usable)})"
            )
    return check


def check_health(facts: Facts, wanted: list[int]) -> Check:
    check = Check("partitions are healthy on their servers")
    for sid, view in sorted(facts.servers.items()):
        for pid, part in sorted((view.partitions or {}).items()):
            if pid in wanted and not part.healthy:
                check.reasons.append(f"server {sid} ({view.address}): partition {pid} is not healthy: {part.detail}")
    return check


def check_recovery(facts: Facts, wanted: list[int]) -> Check:
    check = Check("recovery has completed")
    for pid in wanted:
        session = facts.sessions.get(pid)
        if session is None:
            check.reasons.append(f"partition {pid} has no metadata in ZooKeeper")
            continue
        if session < 0:
            check.reasons.append(f"partition {pid} has no store session yet")
            continue
        states = facts.replica_states.get(pid, {})
        for node in _replicas(facts, pid):
            if node not in states:
                check.reasons.append(f"partition {pid}: the replica on {node} is not in the session's replica states")
                continue
            replica_session, closing = states[node]
            if replica_session != session:
                check.reasons.append(
                    f"partition {pid}: the replica on {node} is in session {replica_session}, "
                    f"the partition in {session}"
                )
            elif closing != zkmeta.UNRESOLVED:
                check.reasons.append(f"partition {pid}: the replica on {node} has a closing high-water mark {closing}")
    return check


def _high_water_mark(facts: Facts, pid: int) -> int | None:
    """The partition's high-water mark as its owning server reports it, None when not known."""
    sid = facts.ownership.get(pid, (-1, 0))[0]
    view = facts.servers.get(sid)
    part = (view.partitions or {}).get(pid) if view is not None else None
    return part.high_water_mark if part is not None else None


def check_replicas(facts: Facts, wanted: list[int]) -> Check:
    """Every replica holds exactly the high-water mark's transactions, the same records as the others."""
    check = Check("replicas hold the same records, up to the high-water mark")
    for pid in wanted:
        views = {n: v for n in _replicas(facts, pid) if (v := _replica_view(facts, n, pid)) is not None and not v.error}
        if not views:
            continue
        hwm = _high_water_mark(facts, pid)
        maxes = {n: v.max_transaction_id for n, v in views.items()}
        below, above = tail(facts, pid)
        if len(set(maxes.values())) > 1 and (hwm is None or below or above):  # under load, the tail differs
            listed = ", ".join(f"{n} {m}" for n, m in sorted(maxes.items()))
            check.reasons.append(f"partition {pid}: replicas at different max transaction ids: {listed}")
        if hwm is not None:
            later = facts.later_high_water_marks.get(pid, hwm)
            for node, top in sorted(below.items()):
                check.reasons.append(
                    f"partition {pid}: replica {node} holds up to {top}, below the high-water mark {hwm}: "
                    f"transactions {top + 1}..{hwm} are missing there"
                )
            for node, top in sorted(above.items()):
                check.reasons.append(
                    f"partition {pid}: replica {node} holds up to {top}, above the high-water mark {later}: "
                    f"transactions {later + 1}..{top} are not committed"
                )
            seen = {n: max(m, facts.later_maxes.get(pid, {}).get(n, m)) for n, m in maxes.items()}
            best = max(seen.values())
            if best < hwm:
                check.reasons.append(f"partition {pid}: transactions {best + 1}..{hwm} are lost: no replica holds them")
            for node, v in sorted(views.items()):
                if v.low_water_mark > later:
                    check.reasons.append(
                        f"partition {pid}: replica {node} has low-water mark {v.low_water_mark}, above the "
                        f"high-water mark {later}"
                    )
        session = facts.sessions.get(pid)
        for node, v in sorted(views.items()):
            if session is not None and v.fence_session_id > session:
                check.reasons.append(
                    f"partition {pid}: replica {node} fences sessions below {v.fence_session_id}, above the "
                    f"partition's session {session}: its next sessions are refused there "
                    f"(waltz storage reset-fence -s {node} -p {pid})"
                )
        for txn, digests in facts.differences.get(pid, []):
            groups: dict[bytes, list[str]] = {}
            for node, digest in sorted(digests.items()):
                groups.setdefault(digest, []).append(node)
            held = "; ".join(", ".join(g) for g in sorted(groups.values()))
            check.reasons.append(
                f"partition {pid}: replicas hold different records at transaction {txn} (alike: {held})"
            )
    check.reasons.extend(e for e in facts.digest_errors if any(e.startswith(f"partition {p}:") for p in wanted))
    return check


def check(facts: Facts, wanted: list[int]) -> list[Check]:
    """Run the seven checks over the wanted partitions."""
    checks = (
        check_zookeeper,
        check_ownership,
        check_server_storage,
        check_storage,
        check_health,
        check_recovery,
        check_replicas,
    )
    return [c(facts, wanted) for c in checks]


# ---- What is missing: servers, owners, replicas (kept apart from the checks above; cluster verify adds it) ----


def check_missing(facts: Facts, wanted: list[int], expected_servers: int | None = None,
                  expected_addresses: tuple[str, ...] = (), replicas: int | None = None) -> Check:
    """No server missing, no partition unassigned or under-replicated.

    ZooKeeper forgets a server that is gone (its registration is ephemeral and the coordinator moves its partitions
    to the others), so a missing server is found only against what is expected: expected_servers (a count) and
    expected_addresses (host:port as the servers advertise themselves). A partition is under-replicated when fewer
    than `replicas` nodes are assigned it (default: as many as most partitions have; a scale-out that gave one
    partition a fourth replica does not make the others under-replicated), or when an assigned
    replica is not usable (its node unreachable, the replica missing, damaged or failing its writes), even with a
    quorum left.
    """
    check = Check("no server is missing, no partition is unassigned or under-replicated")
    registered = {view.address for view in facts.servers.values()}
    if expected_servers is not None and len(facts.servers) < expected_servers:
        check.reasons.append(f"{expected_servers - len(facts.servers)} server(s) missing: {len(facts.servers)} "
                             f"registered, {expected_servers} expected")
    check.reasons.extend(f"server {address} is missing: it is not registered" for address in expected_addresses
                         if address not in registered)
    check.reasons.extend(f"server {sid} ({view.address}) is registered but does not answer: {view.error}"
                         for sid, view in sorted(facts.servers.items()) if view.error)
    check.reasons.extend(f"partition {pid} is unassigned: no server owns it" for pid in wanted
                         if facts.ownership.get(pid, (-1, 0))[0] < 0)
    expected = replicas or _usual_replica_count(facts)
    for pid in wanted:
        assigned = _replicas(facts, pid)
        down = [node for node in assigned if not _usable(_replica_view(facts, node, pid))]
        if len(assigned) < expected:
            check.reasons.append(f"partition {pid} is under-replicated: {len(assigned)} replica(s) assigned, "
                                 f"{expected} expected")
        if down:
            check.reasons.append(f"partition {pid} is under-replicated: {len(assigned) - len(down)} of "
                                 f"{len(assigned)} replicas usable (down: {', '.join(down)})")
    return check


def _usual_replica_count(facts: Facts) -> int:
    """The number of replicas most partitions have (the higher one on a tie): the cluster's replication as it is."""
    counts = Tally(len(_replicas(facts, pid)) for pid in range(facts.num_partitions))
    if not counts:
        return 0
    most = max(counts.values())
    return max(count for count, times in counts.items() if times == most)
