"""What ZooKeeper says of this storage node's replicas, read every few seconds for its readiness (health.ZkView):
the partitions the cluster assigns the node and those on which its replica holds what is committed (caught_up).

The node needs ZooKeeper only for this and for its cluster's parameters at start; while ZooKeeper is unreachable
the last view stays (no session can open or move without ZooKeeper either), and a read that fails is logged once
until one succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kazoo.client import KazooClient

from waltz.v1 import metadata_pb2
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.zk import ZkPaths
from waltz_storage.health import ZkView

log = logging.getLogger(__name__)

INTERVAL_S = 2.0
"""How often the view is read again: a readiness probe sees a replica caught up at most this (and the health
interval) late."""


def caught_up(metadata: metadata_pb2.PartitionMetadata, identity: str) -> bool:
    """Whether the partition's replica on the node identity holds what is committed, by the partition metadata:
    a store session's recovery writes every replica's state, with the session's id for each replica that holds
    everything up to the session's high-water mark (its low-water mark set), and again when a replica catches up
    during the session. The latest session whose states were written counts (a session that is opening has not
    written its own yet, and a replica the last one counted in is not behind for that); a partition with no states
    at all never had a session, so nothing is committed to catch up on."""
    sessions = {e.replica_id.storage_node_connect_string: e.replica_state.session_id for e in metadata.replica_states}
    if not sessions:
        return True
    return sessions.get(identity) == max(sessions.values())


def read_view(client: KazooClient, paths: ZkPaths, identity: str) -> ZkView:
    """The view of the node whose connect string is identity; ZooKeeper's errors propagate."""
    assigned = frozenset(cluster_admin.replica_assignments(client, paths).get(identity, []))
    caught = set()
    for pid in sorted(assigned):
        found = zkmeta.read(client, paths.partition_metadata(pid), metadata_pb2.PartitionMetadata)
        if found is not None and caught_up(found[0], identity):
            caught.add(pid)
    return ZkView(assigned, frozenset(caught))


async def keep_view(read: Callable[[], ZkView], publish: Callable[[ZkView], None],
                    interval_s: float = INTERVAL_S) -> None:
    """Read the view every interval_s (off the loop) and publish it, until cancelled."""
    failing = False
    while True:
        try:
            view = await asyncio.to_thread(read)
        except Exception as exc:
            if not failing:
                log.warning("reading this node's assignment from ZooKeeper failed (readiness keeps the last one "
                            "read): %s", exc)
            failing = True
        else:
            if failing:
                log.info("reading this node's assignment from ZooKeeper works again")
            failing = False
            publish(view)
        await asyncio.sleep(interval_s)
