"""The pure checks of `waltz cluster verify` and the start agreement of recover-partition."""

from __future__ import annotations

import pytest

from waltz_cli.errors import CliError
from waltz_cli.recover import CopyPlan, plan_copy
from waltz_cli.verify import Facts, ReplicaView, ServerPartition, ServerView, check, first_difference, tail
from waltz_common.zk import UNRESOLVED

NODES = ["h:1", "h:2", "h:3"]


def healthy() -> Facts:
    """Two partitions on three nodes, one server owning both, recovery done in session 4."""
    return Facts(
        num_partitions=2,
        storage_nodes=set(NODES),
        assignments={n: [0, 1] for n in NODES},
        ownership={0: (1, 3), 1: (1, 3)},
        servers={
            1: ServerView(
                "s:1",
                partitions={p: ServerPartition(3, 4, True) for p in (0, 1)},
                storage={n: (True, "") for n in NODES},
            )
        },
        nodes={n: {p: ReplicaView(session_id=4, max_transaction_id=10) for p in (0, 1)} for n in NODES},
        sessions={0: 4, 1: 4},
        replica_states={p: {n: (4, UNRESOLVED) for n in NODES} for p in (0, 1)},
    )


def failures(facts: Facts, wanted=(0, 1)) -> dict[str, list[str]]:
    return {c.name: c.reasons for c in check(facts, list(wanted)) if not c.passed}


def test_a_healthy_cluster_passes_all_seven_checks():
    checks = check(healthy(), [0, 1])
    assert len(checks) == 7
    assert all(c.passed for c in checks), failures(healthy())


def test_unassigned_partition_and_unknown_node():
    facts = healthy()
    facts.assignments = {"h:1": [0], "h:9": [0]}
    reasons = failures(facts)["ZooKeeper replica assignments are valid"]
    assert "partition 1 has no replica" in reasons
    assert any("h:9" in r and "not a registered storage node" in r for r in reasons)


def test_dead_storage_node_is_named_but_quorum_holds():
    facts = healthy()
    facts.nodes["h:2"] = "storage node h:2: nothing listens on its admin port h:12 (is the node running?)"
    found = failures(facts)
    assert list(found) == ["storage nodes hold what ZooKeeper assigns them, with a quorum for every partition"]
    assert found[next(iter(found))] == [facts.nodes["h:2"]]


def test_two_dead_nodes_lose_the_quorum():
    facts = healthy()
    facts.nodes["h:2"] = "storage node h:2: down"
    facts.nodes["h:3"] = "storage node h:3: down"
    reasons = next(iter(failures(facts).values()))
    assert "partition 0 has no quorum: 1 of 3 replicas usable (need 2; down: h:2, h:3)" in reasons


def test_storage_assignment_mismatch_and_unwritable_replica():
    facts = healthy()
    assert isinstance(facts.nodes["h:1"], dict)
    del facts.nodes["h:1"][1]
    facts.nodes["h:2"][1] = ReplicaView(writable=False)  # type: ignore[index]
    facts.assignments["h:3"] = [0]
    reasons = next(iter(failures(facts).values()))
    assert "storage node h:1 does not hold partition 1, ZooKeeper assigns it there" in reasons
    assert "storage node h:2: partition 1 is unwritable" in reasons
    assert "storage node h:3 holds partition 1, ZooKeeper does not assign it there" in reasons
    assert "partition 1 has no quorum: 0 of 2 replicas usable (need 2; down: h:1, h:2)" in reasons


def test_a_replica_whose_writes_fail_is_named_and_not_usable():
    facts = healthy()
    facts.nodes["h:2"][0] = ReplicaView(write_failure="0.seg: append of 11..11 failed: [Errno 28] No space")  # type: ignore[index]
    facts.nodes["h:3"][0] = ReplicaView(write_failure="[Errno 5] Input/output error")  # type: ignore[index]
    reasons = next(iter(failures(facts).values()))
    assert "storage node h:2: partition 0: writes fail: 0.seg: append of 11..11 failed: [Errno 28] No space" in reasons
    assert "partition 0 has no quorum: 1 of 3 replicas usable (need 2; down: h:2, h:3)" in reasons


def test_server_ownership_mismatches():
    facts = healthy()
    facts.ownership[1] = (2, 3)
    facts.servers[1].partitions[0] = ServerPartition(2, 4, True)  # type: ignore[index]
    reasons = failures(facts)["servers own the partitions ZooKeeper assigns them"]
    assert "partition 1 is assigned to server 2, which is not registered" in reasons
    assert "server 1 (s:1) has partition 0 at generation 2, ZooKeeper says 3" in reasons
    assert "server 1 (s:1) owns partition 1, ZooKeeper says it does not" in reasons


def test_unreachable_server_and_no_servers():
    facts = healthy()
    facts.servers[1] = ServerView("s:1", error="server 1 (s:1): unreachable (connection refused)")
    assert failures(facts)["servers own the partitions ZooKeeper assigns them"] == [
        "server 1 (s:1) cannot be asked: server 1 (s:1): unreachable (connection refused)"
    ]
    facts.servers = {}
    assert failures(facts)["servers own the partitions ZooKeeper assigns them"] == ["no server is registered"]


def test_server_storage_connectivity():
    facts = healthy()
    facts.servers[1].storage = {"h:1": (True, ""), "h:2": (False, "connection refused"), "h:9": (False, "gone")}
    reasons = failures(facts)["servers reach their storage nodes"]
    assert reasons == [
        "server 1 (s:1) cannot reach storage node h:2: connection refused",
        "server 1 (s:1) cannot reach storage node h:3: no connection",
    ]


def test_unhealthy_partition_on_server():
    facts = healthy()
    facts.servers[1].partitions[1] = ServerPartition(3, -1, False, "recovering")  # type: ignore[index]
    assert failures(facts)["partitions are healthy on their servers"] == [
        "server 1 (s:1): partition 1 is not healthy: recovering"
    ]


def test_recovery_incomplete():
    facts = healthy()
    facts.replica_states[0]["h:1"] = (3, 17)
    facts.replica_states[0]["h:2"] = (4, 17)
    del facts.replica_states[0]["h:3"]
    facts.sessions[1] = -1
    reasons = failures(facts)["recovery has completed"]
    assert reasons == [
        "partition 0: the replica on h:1 is in session 3, the partition in 4",
        "partition 0: the replica on h:2 has a closing high-water mark 17",
        "partition 0: the replica on h:3 is not in the session's replica states",
        "partition 1 has no store session yet",
    ]


def test_only_wanted_partitions_are_checked():
    facts = healthy()
    facts.sessions[1] = -1
    assert failures(facts, wanted=[0]) == {}


@pytest.mark.parametrize(
    ("proposal", "source_max", "safe_end", "plan"),
    [
        (0, 99, 99, CopyPlan(0, 99, 99)),  # new replica: everything committed
        (0, 99, 49, CopyPlan(0, 49, 49)),  # only up to what is known committed
        (50, 99, 79, CopyPlan(50, 79, 79)),  # a dirty replica keeps its clean prefix
        (50, 99, 20, CopyPlan(50, 20, 49)),  # nothing to copy; the destination's clean data stays
        (100, 99, 99, CopyPlan(100, 99, 99)),  # already complete
        (0, -1, -1, CopyPlan(0, -1, -1)),  # empty partition
    ],
)
def test_copy_plan(proposal, source_max, safe_end, plan):
    assert plan_copy(proposal, source_max, safe_end) == plan


def test_copy_plan_refuses_a_source_behind_the_destination():
    with pytest.raises(CliError, match="more advanced source"):
        plan_copy(60, 40, 40)


# ---------------------------------------------------------------- issue 25: replicas against each other and the HWM

REPLICAS = "replicas hold the same records, up to the high-water mark"


def at_high_water_mark(hwm: int = 10) -> Facts:
    facts = healthy()
    facts.servers[1].partitions = {p: ServerPartition(3, 4, True, "", hwm) for p in (0, 1)}  # type: ignore[index]
    return facts


def test_replicas_at_the_high_water_mark_pass():
    assert not failures(at_high_water_mark())


def test_a_replica_below_the_high_water_mark_and_different_max_ids_are_named():
    facts = at_high_water_mark()
    facts.nodes["h:3"][0] = ReplicaView(session_id=4, max_transaction_id=7)  # type: ignore[index]
    reasons = failures(facts, [0])[REPLICAS]
    assert "partition 0: replicas at different max transaction ids: h:1 10, h:2 10, h:3 7" in reasons
    assert (
        "partition 0: replica h:3 holds up to 7, below the high-water mark 10: transactions 8..10 are missing there"
        in reasons
    )


def test_lost_records_and_a_forged_tail_are_named():
    facts = at_high_water_mark(10)
    for node in NODES[:2]:  # the 803 of issue 25: two replicas cut, the third cut by the next recovery
        facts.nodes[node][0] = ReplicaView(session_id=4, max_transaction_id=3)  # type: ignore[index]
    facts.nodes["h:3"][0] = ReplicaView(session_id=4, max_transaction_id=5)  # type: ignore[index]
    reasons = failures(facts, [0])[REPLICAS]
    assert "partition 0: transactions 6..10 are lost: no replica holds them" in reasons
    facts = at_high_water_mark(10)
    facts.nodes["h:1"][0] = ReplicaView(session_id=4, max_transaction_id=11, low_water_mark=11)  # type: ignore[index]
    reasons = failures(facts, [0])[REPLICAS]
    assert any("replica h:1 holds up to 11, above the high-water mark 10: transactions 11..11" in r for r in reasons)
    assert "partition 0: replica h:1 has low-water mark 11, above the high-water mark 10" in reasons


def test_different_records_at_one_id_are_named():
    facts = at_high_water_mark()
    facts.differences[1] = [(4, {"h:1": b"a", "h:2": b"a", "h:3": b"b"})]
    assert failures(facts)[REPLICAS] == [
        "partition 1: replicas hold different records at transaction 4 (alike: h:1, h:2; h:3)"
    ]
    facts.digest_errors.append("partition 0: the replicas' records could not be compared: boom")
    assert "partition 0: the replicas' records could not be compared: boom" in failures(facts)[REPLICAS]


def test_first_difference_bisects_to_the_first_differing_record():
    logs = {"a": list(range(100)), "b": list(range(100)), "c": list(range(100))}
    logs["c"][37] = -1
    logs["b"][80] = -2
    asked = []

    def fetch(node, first, count):
        asked.append((node, first, count))
        part = logs[node][first : first + count]
        return len(part), hash(tuple(part)).to_bytes(8, "big", signed=True)

    assert first_difference(sorted(logs), fetch, 0, 100) == 37
    assert len(asked) <= 3 * 7  # log2(100) rounds, one digest per node each
    assert first_difference(["a", "b"], fetch, 0, 100) == 80
    assert first_difference(["a", "b"], fetch, 50, 1) == 50  # one record: that is the one


def test_a_poisoned_fence_is_named_with_its_remedy():
    facts = at_high_water_mark()
    facts.nodes["h:2"][0] = ReplicaView(session_id=10**12, max_transaction_id=10, fence_session_id=10**12)  # type: ignore[index]
    (reason,) = failures(facts, [0])[REPLICAS]
    assert "replica h:2 fences sessions below 1000000000000, above the partition's session 4" in reason
    assert "waltz storage reset-fence -s h:2 -p 0" in reason


# ---------------------------------------------------------------- issue 44: the in-flight tail under load


def under_load() -> Facts:
    """The owner said 10; the replicas, read after it, ran ahead by the appends in flight."""
    facts = at_high_water_mark(10)
    for node, top in zip(NODES, (13, 12, 10), strict=True):
        facts.nodes[node][0] = ReplicaView(session_id=4, max_transaction_id=top)  # type: ignore[index]
    return facts


def test_replicas_ahead_of_the_mark_read_first_fail_until_the_mark_is_read_again():
    facts = under_load()
    assert tail(facts, 0) == ({}, {"h:1": 13, "h:2": 12})
    assert "partition 0: replicas at different max transaction ids: h:1 13, h:2 12, h:3 10" in failures(facts, [0])[
        REPLICAS]
    facts.later_high_water_marks[0] = 14  # committed meanwhile
    assert tail(facts, 0) == ({}, {})
    assert not failures(facts, [0])


def test_a_replica_behind_the_mark_passes_once_it_is_seen_holding_it():
    facts = at_high_water_mark(10)
    facts.nodes["h:3"][0] = ReplicaView(session_id=4, max_transaction_id=8)  # type: ignore[index]
    assert tail(facts, 0) == ({"h:3": 8}, {})
    facts.later_maxes[0] = {"h:3": 11}
    assert tail(facts, 0) == ({}, {}) and not failures(facts, [0])


def test_a_tail_that_does_not_settle_and_damage_inside_the_committed_range_still_fail():
    facts = under_load()
    facts.later_high_water_marks[0] = 12  # h:1 holds 13, never committed: not the in-flight tail
    reasons = failures(facts, [0])[REPLICAS]
    assert "partition 0: replica h:1 holds up to 13, above the high-water mark 12: transactions 13..13 are not " \
           "committed" in reasons
    facts = under_load()
    facts.later_high_water_marks[0] = 14
    facts.differences[0] = [(7, {"h:1": b"a", "h:2": b"a", "h:3": b"b"})]  # a flipped bit at 7, below the mark
    assert failures(facts, [0])[REPLICAS] == [
        "partition 0: replicas hold different records at transaction 7 (alike: h:1, h:2; h:3)"
    ]
