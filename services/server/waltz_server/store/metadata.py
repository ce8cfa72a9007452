"""The store's ZooKeeper metadata: session ids and replica states by compare-and-set, replica assignments.

Every function here is synchronous (kazoo): call it through asyncio.to_thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError

from waltz.v1 import metadata_pb2
from waltz_common import zk as zkmeta
from waltz_common.zk import ZkPaths
from waltz_server.recovery import ReplicaState

MAX_CAS_RETRIES = 100


class GenerationMismatch(Exception):
    """ZooKeeper holds a higher generation: another server owns the partition now."""


class MetadataConflict(Exception):
    """The partition metadata changed under this store session (another session took over)."""


@dataclass(frozen=True, slots=True)
class SessionStart:
    """A new store session: its id, generation, the previous replica states, and the znode version we wrote."""

    partition_id: int
    generation: int
    session_id: int
    previous: Mapping[str, ReplicaState]
    version: int


def _states(metadata: metadata_pb2.PartitionMetadata) -> dict[str, ReplicaState]:
    return {
        e.replica_id.storage_node_connect_string: ReplicaState(
            e.replica_state.session_id, e.replica_state.closing_high_water_mark
        )
        for e in metadata.replica_states
    }


def begin_session(zk: KazooClient, paths: ZkPaths, partition_id: int, generation: int) -> SessionStart:
    """CAS the partition metadata to (generation, session id + 1); GenerationMismatch if ZooKeeper is ahead."""
    path = paths.partition_metadata(partition_id)
    for _ in range(MAX_CAS_RETRIES):
        current, stat = zkmeta.require(zk, path, metadata_pb2.PartitionMetadata)
        if current.generation > generation:
            raise GenerationMismatch(
                f"partition {partition_id}: ZooKeeper holds generation {current.generation} > ours {generation}"
            )
        proposed = metadata_pb2.PartitionMetadata()
        proposed.CopyFrom(current)
        proposed.generation = generation
        proposed.session_id = current.session_id + 1
        try:
            written = zkmeta.write(zk, path, proposed, version=stat.version)
        except BadVersionError:
            continue
        return SessionStart(partition_id, generation, proposed.session_id, _states(current), written.version)
    raise MetadataConflict(f"partition {partition_id}: {MAX_CAS_RETRIES} concurrent metadata changes in a row")


def write_replica_states(
    zk: KazooClient, paths: ZkPaths, start: SessionStart, version: int, states: Mapping[str, ReplicaState]
) -> int:
    """Replace the replica states by CAS on version (from our last write); returns the new version."""
    path = paths.partition_metadata(start.partition_id)
    metadata = metadata_pb2.PartitionMetadata(generation=start.generation, session_id=start.session_id)
    for replica in sorted(states):
        state = states[replica]
        replica_id = metadata_pb2.ReplicaId(partition_id=start.partition_id, storage_node_connect_string=replica)
        metadata.replica_states.add(
            replica_id=replica_id,
            replica_state=metadata_pb2.ReplicaState(
                replica_id=replica_id,
                session_id=state.session_id,
                closing_high_water_mark=state.closing_high_water_mark,
            ),
        )
    try:
        return zkmeta.write(zk, path, metadata, version=version).version
    except BadVersionError:
        raise MetadataConflict(
            f"partition {start.partition_id}: metadata changed during store session {start.session_id}"
        ) from None


def read_replica_states(zk: KazooClient, paths: ZkPaths, partition_id: int) -> tuple[int, int, dict[str, ReplicaState]]:
    """(generation, session id, replica states) as ZooKeeper holds them now."""
    metadata, _ = zkmeta.require(zk, paths.partition_metadata(partition_id), metadata_pb2.PartitionMetadata)
    return metadata.generation, metadata.session_id, _states(metadata)


def replicas_of(assignments: bytes | None, partition_id: int) -> frozenset[str]:
    """The storage nodes whose replica ids in a ReplicaAssignments payload contain partition_id."""
    if not assignments:
        return frozenset()
    parsed = metadata_pb2.ReplicaAssignments.FromString(assignments)
    return frozenset(s.connect_string for s in parsed.storage_replicas if partition_id in s.replica_ids)


def groups_of(descriptor: bytes | None) -> dict[str, int]:
    """connect string -> group id from a GroupDescriptor payload."""
    if not descriptor:
        return {}
    return {g.connect_string: g.group_id for g in metadata_pb2.GroupDescriptor.FromString(descriptor).groups}
