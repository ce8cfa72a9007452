"""Whether a storage node's replica holds what is committed, from the partition metadata in ZooKeeper
(waltz_storage.zk_view.caught_up): the storage node's readiness asks it for every partition assigned to it."""

from __future__ import annotations

from waltz.v1 import metadata_pb2
from waltz_storage.zk_view import caught_up

A, B, C = "a:1", "b:1", "c:1"


def metadata(session_id: int, **states: int) -> metadata_pb2.PartitionMetadata:
    """Partition metadata at session_id with replica -> the session id its state carries."""
    m = metadata_pb2.PartitionMetadata(generation=1, session_id=session_id)
    for name, sid in states.items():
        replica = metadata_pb2.ReplicaId(partition_id=0, storage_node_connect_string=f"{name}:1")
        m.replica_states.add(replica_id=replica, replica_state=metadata_pb2.ReplicaState(
            replica_id=replica, session_id=sid, closing_high_water_mark=-1))
    return m


def test_a_replica_the_latest_session_counts_in_is_caught_up():
    current = metadata(4, a=4, b=4, c=3)  # c was out when session 4 recovered
    assert caught_up(current, A) and caught_up(current, B) and not caught_up(current, C)


def test_while_a_session_opens_the_last_recovered_one_counts():
    """begin_session bumps the session id and keeps the states until recovery writes new ones: healthy replicas
    do not turn unready for those seconds."""
    opening = metadata(5, a=4, b=4, c=3)
    assert caught_up(opening, A) and caught_up(opening, B) and not caught_up(opening, C)


def test_a_replica_missing_from_the_states_is_not_caught_up_unless_no_session_ever_wrote_any():
    assert not caught_up(metadata(4, a=4, b=4), C)  # newly assigned: recovery has not counted it yet
    assert not caught_up(metadata(4, a=4, b=4, c=-1), C)  # counted as new and empty
    assert caught_up(metadata(0), A)  # never a session: nothing committed to hold
