"""The operator tools' guards against losing acknowledged transactions (pure decisions)."""

from __future__ import annotations

from waltz_cli import guards
from waltz_cli.guards import UNRESOLVED, PartitionView, ReplicaState

A, B, C, D = "a:1", "b:1", "c:1", "d:1"


def view(states: dict[str, ReplicaState], assigned: set[str], session_id: int = 7) -> PartitionView:
    return PartitionView(0, session_id, states, frozenset(assigned))


# The issue's scenario: write set {A, C} in session 7, acknowledged up to 1000; B lagging (closed at 500).
ISSUE = view({A: ReplicaState(7, UNRESOLVED), B: ReplicaState(6, 500), C: ReplicaState(7, UNRESOLVED)}, {A, B, C})


def test_recover_refuses_a_member_of_the_current_session():
    refusal = guards.recover_destination(ISSUE, C)
    assert refusal is not None
    assert "member of partition 0's store session 7" in refusal.reason
    assert "unassign it first (waltz storage unassign -s c:1 -p 0)" in refusal.message(forceable=False)


def test_recover_refuses_a_voter_of_a_session_whose_recovery_is_running():
    # begin_session bumps the session id but keeps the previous states until recovery completes.
    running = view({A: ReplicaState(6, UNRESOLVED), C: ReplicaState(6, UNRESOLVED)}, {A, C}, session_id=7)
    assert guards.recover_destination(running, C) is not None


def test_recover_accepts_a_lagging_a_new_or_an_unassigned_replica():
    assert guards.recover_destination(ISSUE, B) is None
    assert guards.recover_destination(ISSUE, D) is None
    assert guards.recover_destination(view({}, {A}), A) is None


def test_unassign_keeps_a_majority_of_the_previous_replica_set():
    assert guards.unassign(ISSUE, C) is None  # A and B remain: 2 of 3
    two_left = view(ISSUE.states, {A, C})  # B already unassigned
    refusal = guards.unassign(two_left, C)
    assert refusal is not None and refusal.risk is not None
    assert "would keep 1 of its previous replica set {a:1, b:1, c:1}" in refusal.reason
    assert "majority of 2" in refusal.reason
    assert "--force does it anyway" in refusal.message()


def test_unassign_counts_only_previous_replicas():
    # A new replica D does not vote: {A, D} keeps only 1 of {A, B, C}.
    assert guards.unassign(view(ISSUE.states, {A, B, D}), B) is not None
    # Unassigning a replica outside the previous set never lowers the count.
    assert guards.unassign(view(ISSUE.states, {A, D}), D) is None


def test_unassign_without_any_session_only_keeps_one_replica():
    assert guards.unassign(view({}, {A, B}), A) is None
    last = guards.unassign(view({}, {A}), A)
    assert last is not None and last.risk is None and "no replica left" in last.reason
    assert guards.unassign(view({}, {A}), B) is None  # B does not hold it


def test_delete_refuses_a_replica_zookeeper_lists():
    assigned = guards.delete_listed(ISSUE, A)
    assert assigned is not None and "still assigns partition 0 to a:1" in assigned.reason
    member = guards.delete_listed(view(ISSUE.states, {A, B}), C)
    assert member is not None and "still a member" in member.reason
    assert guards.delete_listed(view({A: ReplicaState(7, UNRESOLVED), C: ReplicaState(6, 40)}, {A}), C) is None


def test_delete_refuses_the_only_copy_of_transactions():
    quiet = view({}, {A, B})
    assert guards.delete_unique(quiet, C, -1, {}) is None  # nothing held
    assert guards.delete_unique(quiet, C, 90, {A: 90, B: 10}) is None
    refusal = guards.delete_unique(quiet, C, 90, {A: 80, B: None})
    assert refusal is not None
    assert "up to transaction 90 but the other assigned replicas only up to 80 (could not read b:1)" in refusal.reason
    assert "transactions 81..90" in (refusal.risk or "")
    alone = guards.delete_unique(view({}, set()), C, 5, {})
    assert alone is not None and "hold nothing" in alone.reason


def test_reset_fence_only_clears_a_fence_above_the_current_session():
    assert guards.reset_fence(0, fence=10**12, target=7, current_session=7) is None
    assert guards.reset_fence(0, fence=10**12, target=5, current_session=7) is None
    refused = guards.reset_fence(0, fence=7, target=7, current_session=7)
    assert refused is not None and "not above 7" in refused.message(False)
    refused = guards.reset_fence(0, fence=10**12, target=9, current_session=7)
    assert refused is not None and "above ZooKeeper's current session 7" in refused.message(False)
    refused = guards.reset_fence(0, fence=10**12, target=-2, current_session=7)
    assert refused is not None and "not a session id" in refused.message(False)
