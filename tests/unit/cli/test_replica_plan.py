"""The steps of replacing, adding and moving a replica (pure decisions), walked through as ZooKeeper and the owner
would answer them, and the guard that stops a wiped voting member from rejoining by `storage sync`."""

from __future__ import annotations

from waltz_cli import guards, replica_plan
from waltz_cli.guards import UNRESOLVED, PartitionView, Refusal, ReplicaState
from waltz_cli.replica_plan import ReplicaFacts, Step

A, B, C, D = "a:1", "b:1", "c:1", "d:1"
VOTER = ReplicaState(7, UNRESOLVED)
NEW = ReplicaState(-1, 100)  # a replica a recovery found not clean: listed, not voting
WIPED = ReplicaFacts(holds=False, in_write_set=False)
CATCHING_UP = ReplicaFacts(holds=True, in_write_set=False)
JOINED = ReplicaFacts(holds=True, in_write_set=True)


def view(states: dict[str, ReplicaState], assigned: set[str], session_id: int = 7) -> PartitionView:
    return PartitionView(0, session_id, states, frozenset(assigned))


def test_a_wiped_voter_leaves_the_session_before_it_comes_back_empty():
    healthy = view({A: VOTER, B: VOTER, C: VOTER}, {A, B, C})
    assert replica_plan.replace_step(healthy, C, WIPED) is Step.UNASSIGN
    # unassigned, but ZooKeeper still lists it as a voter until the owner's next session
    assert replica_plan.replace_step(view({A: VOTER, B: VOTER, C: VOTER}, {A, B}), C, WIPED) is \
        Step.AWAIT_SESSION_WITHOUT
    without = view({A: ReplicaState(8, UNRESOLVED), B: ReplicaState(8, UNRESOLVED)}, {A, B}, session_id=8)
    assert replica_plan.replace_step(without, C, WIPED) is Step.CREATE
    assert replica_plan.replace_step(without, C, CATCHING_UP) is Step.ASSIGN
    back = view({A: ReplicaState(9, UNRESOLVED), B: ReplicaState(9, UNRESOLVED), C: NEW}, {A, B, C}, session_id=9)
    assert replica_plan.replace_step(back, C, CATCHING_UP) is Step.AWAIT_WRITE_SET
    assert replica_plan.replace_step(back, C, JOINED) is Step.DONE


def test_replace_refuses_to_take_a_voter_out_when_a_majority_would_not_stay():
    # B already lost its assignment: unassigning C as well would leave 1 of 3 voters
    refusal = replica_plan.replace_step(view({A: VOTER, B: VOTER, C: VOTER}, {A, C}), C, WIPED)
    assert isinstance(refusal, Refusal) and "fewer than the majority of 2" in refusal.reason


def test_replace_of_a_node_that_kept_its_files_only_waits_for_it():
    kept = view({A: VOTER, B: VOTER, C: VOTER}, {A, B, C})
    assert replica_plan.replace_step(kept, C, CATCHING_UP) is Step.AWAIT_WRITE_SET
    assert replica_plan.replace_step(kept, C, JOINED) is Step.DONE


def test_adding_a_replica_creates_assigns_and_waits_for_the_write_set():
    three = view({A: VOTER, B: VOTER, C: VOTER}, {A, B, C})
    assert replica_plan.add_step(three, D, WIPED) is Step.CREATE
    assert replica_plan.add_step(three, D, CATCHING_UP) is Step.ASSIGN
    four = view({A: VOTER, B: VOTER, C: VOTER, D: NEW}, {A, B, C, D})
    assert replica_plan.add_step(four, D, CATCHING_UP) is Step.AWAIT_WRITE_SET
    assert replica_plan.add_step(four, D, JOINED) is Step.DONE


def test_adding_refuses_an_empty_voter():
    refusal = replica_plan.add_step(view({A: VOTER, B: VOTER, C: VOTER}, {A, B, C}), C, WIPED)
    assert isinstance(refusal, Refusal)
    assert "waltz storage replace -s c:1 -p 0" in refusal.message(forceable=False)


def test_a_move_unassigns_the_source_only_once_the_target_is_in_the_write_set():
    three = view({A: VOTER, B: VOTER, C: VOTER}, {A, B, C})
    assert replica_plan.move_step(three, A, D, WIPED) == (D, Step.CREATE)
    assert replica_plan.move_step(three, A, D, CATCHING_UP) == (D, Step.ASSIGN)
    four = view({A: VOTER, B: VOTER, C: VOTER, D: NEW}, {A, B, C, D})
    assert replica_plan.move_step(four, A, D, CATCHING_UP) == (D, Step.AWAIT_WRITE_SET)
    assert replica_plan.move_step(four, A, D, JOINED) == (A, Step.UNASSIGN)
    left = view({A: VOTER, B: VOTER, C: VOTER, D: NEW}, {B, C, D})
    assert replica_plan.move_step(left, A, D, JOINED) == (A, Step.AWAIT_SESSION_WITHOUT)
    after = view({B: ReplicaState(8, UNRESOLVED), C: ReplicaState(8, UNRESOLVED), D: ReplicaState(8, UNRESOLVED)},
                 {B, C, D}, session_id=8)
    assert replica_plan.move_step(after, A, D, JOINED) == (A, Step.DONE)


def test_a_move_onto_the_same_node_is_refused():
    assert isinstance(replica_plan.move_step(view({A: VOTER}, {A}), A, A, JOINED), Refusal)


def test_targets_stay_in_the_source_group_then_go_to_the_least_loaded_node():
    nodes = {A: (0, 1), B: (1, 1), C: (2, 1), D: (0, 1), "e:1": (3, 1)}
    assert replica_plan.pick_target(0, A, nodes, frozenset({A, B, C}), {}, 0) == D
    assert replica_plan.pick_target(0, A, nodes, frozenset({A, B, C, D}), {}, 0) == "e:1"
    assert replica_plan.pick_target(0, A, nodes, frozenset({A, B}), {"e:1": 5, C: 9}, 1) == D
    refusal = replica_plan.pick_target(0, A, {A: (0, 1), B: (1, 1)}, frozenset({A, B}), {}, 0)
    assert isinstance(refusal, Refusal) and "waltz storage add-node" in refusal.remedy


def test_sync_refuses_to_create_a_partition_on_a_voter_that_lost_it():
    listed = view({A: VOTER, B: VOTER, C: VOTER}, {A, B, C})
    refusal = guards.create_on_voter(listed, C)
    assert refusal is not None and refusal.risk is not None
    assert "waltz storage replace" in refusal.message()
    assert guards.create_on_voter(listed, D) is None  # a new replica may be created
    assert guards.create_on_voter(view({A: VOTER, C: NEW}, {A, C}), C) is None  # listed but not voting


def test_an_old_copy_on_an_unassigned_node_is_deleted_first_not_taken_as_a_new_replica():
    three = view({A: VOTER, B: VOTER, C: VOTER}, {A, B, C})
    old = ReplicaFacts(holds=True, in_write_set=False, max_transaction_id=120)
    refusal = replica_plan.add_step(three, D, old)
    assert isinstance(refusal, Refusal)
    assert "waltz storage remove-partition -s d:1 -p 0 -d" in refusal.message(forceable=False)
    assert isinstance(replica_plan.move_step(three, A, D, old), Refusal)
    assert replica_plan.add_step(three, D, CATCHING_UP) is Step.ASSIGN  # the empty files it just created
