"""Pure membership helpers: coordinator choice, assignment round trip, ownership changes."""

from __future__ import annotations

from waltz.v1 import metadata_pb2
from waltz_server.assignment import PartitionInfo
from waltz_server.cluster import (
    UNOWNED,
    assignment_message,
    is_coordinator,
    live_server_ids,
    next_assignment,
    owned_by,
    stored_assignment,
)
from waltz_server.ownership import OwnershipChange, ownership_change


def test_live_ids_and_the_coordinator():
    assert live_server_ids(["12", "3", "lock-x", "7"]) == [3, 7, 12]
    assert is_coordinator(3, [3, 7, 12]) and not is_coordinator(7, [3, 7, 12])
    assert not is_coordinator(3, [])


def test_assignment_round_trip_and_owned_partitions():
    message = assignment_message({2: [PartitionInfo(1, 4)], 5: [PartitionInfo(0, 2), PartitionInfo(2, 1)]})
    assert [(p.partition_id, p.server_id, p.generation) for p in message.partitions] == [
        (0, 5, 2),
        (1, 2, 4),
        (2, 5, 1),
    ]
    assert stored_assignment(message) == {5: [PartitionInfo(0, 2), PartitionInfo(2, 1)], 2: [PartitionInfo(1, 4)]}
    assert owned_by(message, 5) == {0: 2, 2: 1} and owned_by(message, 9) == {}


def test_next_assignment_for_joins_and_leaves():
    first = next_assignment(metadata_pb2.ServerAssignment(), [1], 4)
    assert owned_by(first, 1) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert next_assignment(first, [1], 4) is None  # nothing to change
    split = next_assignment(first, [1, 2], 4)
    kept, moved = owned_by(split, 1), owned_by(split, 2)
    assert len(kept) == len(moved) == 2 and set(kept.values()) == {1} and set(moved.values()) == {2}
    back = next_assignment(split, [1], 4)
    assert owned_by(back, 1) == {**kept, **{p: 3 for p in moved}}


def test_unowned_partitions_get_a_new_generation():
    message = metadata_pb2.ServerAssignment(
        partitions=[metadata_pb2.PartitionOwnership(partition_id=0, server_id=UNOWNED, generation=5)]
    )
    assert owned_by(next_assignment(message, [3], 1), 3) == {0: 6}


def test_ownership_change():
    change = ownership_change({0: 1, 1: 1, 2: 3}, {1: 1, 2: 4, 3: 2})
    assert change == OwnershipChange(open={3: 2}, close=[0], regenerate={2: 4})
    assert ownership_change({0: 1}, {0: 1}).empty


def test_a_dead_servers_partitions_move_with_a_new_generation_and_the_others_stay():
    """The coordinator passes the registered servers minus the ones its failure detector holds dead."""
    from waltz_server.liveness import LivenessSettings, PeerLiveness, Probe

    stored = assignment_message({1: [PartitionInfo(0, 1), PartitionInfo(1, 1)], 2: [PartitionInfo(2, 2),
                                                                                     PartitionInfo(3, 2)]})
    view = PeerLiveness(1, LivenessSettings())
    view.watch([1, 2], 0.0)
    view.observe(2, Probe.ANSWERED, 0.0)
    for t in (0.25, 0.5, 0.75):
        view.observe(2, Probe.REFUSED, t)
        view.tick(t)
    assert view.alive([1, 2]) == [1]
    proposed = next_assignment(stored, view.alive([1, 2]), 4)
    assert proposed is not None
    assert {p.partition_id: (p.server_id, p.generation) for p in proposed.partitions} == {
        0: (1, 1), 1: (1, 1), 2: (1, 3), 3: (1, 3)
    }
    assert next_assignment(proposed, view.alive([1, 2]), 4) is None  # written once: nothing more to do
