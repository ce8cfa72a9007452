"""`waltz cluster verify`'s checks (pure) over the facts verify_facts.collect reads.

The replicas of each partition are compared with its high-water mark (from the owning server) and with
each other: their max transaction ids, low-water marks, and digests of their records (PartitionDigest,
computed on each node over ranges of DIGEST_RANGE records).
"""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass, field

from waltz_cli.verify_facts import (  # noqa: F401  (re-exported: the CLI and tests import them from here)
    DIGEST_RANGE,
    SETTLE_S,
    Facts,
    ReplicaView,
    ServerPartition,
    ServerView,
    assigned_replicas,
    collect,
    first_difference,
    owner_high_water_mark,
    replica_view,
    tail,
)
from waltz_common import zk as zkmeta


@dataclass
class Check:
    """One verify check: its name and, if it failed, the reasons."""

    name: str
    reasons: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.reasons




def check_zookeeper(facts: Facts, wanted: list[int]) -> Check:
    check = Check("ZooKeeper replica assignments are valid")
    for node, held in sorted(facts.assignments.items()):
        if node not in facts.storage_nodes:
            check.reasons.append(f"storage node {node} holds partitions {held} but is not a registered storage node")
        bad = [p for p in held if not 0 <= p < facts.num_partitions]
        if bad:
            check.reasons.append(f"storage node {node} is assigned partitions {bad}, which do not exist")
    check.reasons.extend(f"partition {pid} has no replica" for pid in wanted if not assigned_replicas(facts, pid))
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
        for node in sorted({n for p in owned for n in assigned_replicas(facts, p)}):
            connected, detail = view.storage.get(node, (False, "no connection"))
            if not connected:
                check.reasons.append(f"server {sid} ({view.address}) cannot reach storage node {node}: {detail}")
    return check




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
        replicas = assigned_replicas(facts, pid)
        usable = [n for n in replicas if _usable(replica_view(facts, n, pid))]
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
        for node in assigned_replicas(facts, pid):
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




def check_replicas(facts: Facts, wanted: list[int]) -> Check:
    """Every replica holds exactly the high-water mark's transactions, the same records as the others."""
    check = Check("replicas hold the same records, up to the high-water mark")
    for pid in wanted:
        views = {n: v for n in assigned_replicas(facts, pid)
                 if (v := replica_view(facts, n, pid)) is not None and not v.error}
        if not views:
            continue
        hwm = owner_high_water_mark(facts, pid)
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
        assigned = assigned_replicas(facts, pid)
        down = [node for node in assigned if not _usable(replica_view(facts, node, pid))]
        if len(assigned) < expected:
            check.reasons.append(f"partition {pid} is under-replicated: {len(assigned)} replica(s) assigned, "
                                 f"{expected} expected")
        if down:
            check.reasons.append(f"partition {pid} is under-replicated: {len(assigned) - len(down)} of "
                                 f"{len(assigned)} replicas usable (down: {', '.join(down)})")
    return check


def _usual_replica_count(facts: Facts) -> int:
    """The number of replicas most partitions have (the higher one on a tie): the cluster's replication as it is."""
    counts = Tally(len(assigned_replicas(facts, pid)) for pid in range(facts.num_partitions))
    if not counts:
        return 0
    most = max(counts.values())
    return max(count for count, times in counts.items() if times == most)
